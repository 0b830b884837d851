//go:build !nodlock

package main

import (
	"fmt"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/rueidisdlock"
	"github.com/redis/go-redis/v9"
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
		open:   func(e *env) (locker, error) { return openRueidisDlock(e) },
		quorum: rueidisDlockQuorum,
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

// rueidisDlockQuorum runs rueidisdlock on several masters, as dlockQuorum
// runs dlock: rueidisdlock.New on one, rueidisdlock.NewQuorum on more, a
// rueidis client of its own per master. ForceSingleClient: rueidis.NewClient
// fails for a master it cannot reach unless told the server is a single
// one, and then returns the client with the error, dialling again at each
// call (a master down when the Client is made).
var rueidisDlockQuorum = &quorumImpl{
	settings: func(e *env, node time.Duration) string {
		return fmt.Sprintf("rueidisdlock.New(master) on one master, rueidisdlock.NewQuorum(masters, dlock.WithNodeTimeout(%v)) on more, each master a rueidis client of its own (ForceSingleClient, defaults otherwise: auto-pipelining); Client.Mutex(key, dlock.TTL(%v)) per lock, Lock/TryLock, Unlock", node, e.ttl)
	},
	open: func(e *env, rdbs []*redis.Client, node time.Duration) (tryLocker, error) {
		rcs := make([]rueidis.Client, len(rdbs))
		closeAll := func() {
			for _, rc := range rcs {
				if rc != nil {
					rc.Close()
				}
			}
		}
		for i, r := range rdbs {
			// The error of a master that is down is expected (killed:
			// refused; blackholed: the handshake timed out).
			rcs[i], _ = rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{r.Options().Addr}, ForceSingleClient: true})
			if rcs[i] == nil {
				closeAll()
				return nil, fmt.Errorf("rueidis client of %s: none made", r.Options().Addr)
			}
		}
		var c *dlock.Client
		var err error
		if len(rcs) == 1 {
			c, err = rueidisdlock.New(rcs[0])
		} else {
			c, err = rueidisdlock.NewQuorum(rcs, dlock.WithNodeTimeout(node))
		}
		if err != nil {
			closeAll()
			return nil, err
		}
		l, _ := openDlockOn(e, c)
		return &rueidisDlock{dlockLocker: l, rcs: rcs}, nil
	},
	prepare: dlockQuorum.prepare,
	held:    dlockQuorum.held,
}

// rueidisDlock closes its own rueidis clients after the dlock Client.
type rueidisDlock struct {
	*dlockLocker
	rcs []rueidis.Client
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
	return &rueidisDlock{dlockLocker: l, rcs: []rueidis.Client{rc}}, nil
}

func (l *rueidisDlock) Close() error {
	err := l.c.Close()
	for _, rc := range l.rcs {
		rc.Close()
	}
	return err
}
