//go:build !nodlock

// The dlock adapters live in this file alone, so that `-tags nodlock` builds
// the bench (raw floor and peers) while the root package does not compile.

package main

import (
	"context"
	"fmt"

	"github.com/dlock-go/dlock"
)

func init() {
	register(&impl{
		name:  "dlock",
		order: 10,
		settings: func(e *env) string {
			return fmt.Sprintf("dlock.New(shared go-redis client); Client.Mutex(key, dlock.TTL(%v)) per lock, defaults otherwise (watchdog renewal every TTL/3, local FIFO queue whose head waits in the line at Redis and is handed the lock by the release); Lock(ctx) waits until ctx ends", e.ttl)
		},
		open: func(e *env) (locker, error) { return openDlock(e) },
	})
	register(&impl{
		name:  "dlock-norenew",
		order: 11,
		settings: func(e *env) string {
			return fmt.Sprintf("as dlock, with dlock.NoRenew() (no watchdog): Client.Mutex(key, dlock.TTL(%v), dlock.NoRenew())", e.ttl)
		},
		open: func(e *env) (locker, error) { return openDlock(e, dlock.NoRenew()) },
	})
	register(&impl{
		name:  "dlock-fair",
		order: 12,
		settings: func(e *env) string {
			return fmt.Sprintf("as dlock, with dlock.Fair() (a FIFO line at Redis, the release hands the lock to the first live waiter): Client.Mutex(key, dlock.TTL(%v), dlock.Fair())", e.ttl)
		},
		open: func(e *env) (locker, error) { return openDlock(e, dlock.Fair()) },
	})
}

type dlockLocker struct {
	c    *dlock.Client
	opts []dlock.LockOption
}

func openDlock(e *env, extra ...dlock.LockOption) (*dlockLocker, error) {
	return &dlockLocker{
		c:    dlock.New(e.rdb),
		opts: append([]dlock.LockOption{dlock.TTL(e.ttl)}, extra...),
	}, nil
}

func (l *dlockLocker) Close() error { return l.c.Close() }

type dlockHeld struct{ l *dlock.Lease }

func (l *dlockLocker) Lock(ctx context.Context, key string) (held, error) {
	lease, err := l.c.Mutex(key, l.opts...).Lock(ctx)
	if err != nil {
		return nil, err
	}
	return dlockHeld{lease}, nil
}

func (h dlockHeld) Unlock(ctx context.Context) error { return h.l.Unlock(ctx) }
