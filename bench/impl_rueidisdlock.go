//go:build !nodlock

package main

import (
	"fmt"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/rueidisdlock"
	"github.com/redis/rueidis"
)

// dlock over rueidis (package rueidisdlock), on a rueidis client of its own
// with default options (auto-pipelining), so that the driver is the only
// difference from the dlock rows.

func init() {
	register(&impl{
		name:  "rueidisdlock",
		order: 15,
		settings: func(e *env) string {
			return fmt.Sprintf("as dlock, over rueidis: rueidisdlock.New(rueidis client of its own, default options: auto-pipelining); Client.Mutex(key, dlock.TTL(%v))", e.ttl)
		},
		open: func(e *env) (locker, error) { return openRueidisDlock(e) },
	})
	register(&impl{
		name:  "rueidisdlock-fair",
		order: 16,
		settings: func(e *env) string {
			return fmt.Sprintf("as rueidisdlock, with dlock.Fair(): Client.Mutex(key, dlock.TTL(%v), dlock.Fair())", e.ttl)
		},
		open: func(e *env) (locker, error) { return openRueidisDlock(e, dlock.Fair()) },
	})
}

// rueidisDlock closes its own rueidis client after the dlock Client.
type rueidisDlock struct {
	*dlockLocker
	rc rueidis.Client
}

func openRueidisDlock(e *env, extra ...any) (locker, error) {
	opt, err := rueidis.ParseURL(e.url)
	if err != nil {
		return nil, err
	}
	rc, err := rueidis.NewClient(opt)
	if err != nil {
		return nil, err
	}
	c, err := rueidisdlock.New(rc)
	if err != nil {
		rc.Close()
		return nil, err
	}
	l, err := openDlockOn(e, c, extra...)
	if err != nil {
		c.Close()
		rc.Close()
		return nil, err
	}
	return &rueidisDlock{dlockLocker: l, rc: rc}, nil
}

func (l *rueidisDlock) Close() error {
	err := l.c.Close()
	l.rc.Close()
	return err
}
