// This file adapts the lock core (package dlock, the module root) to the
// market's Locker.

package main

import (
	"context"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/market"
)

func init() { newLocker = newDlockLocker }

// dlockLocker runs the market's dlock-* rows on one dlock.Client: one
// shared wake-up subscription, and waiters for the same name queued locally
// by the Client.
type dlockLocker struct {
	client *dlock.Client
}

// newDlockLocker makes the Client on rdb (a pooled client of the server
// under test) and returns it with its Close.
func newDlockLocker(rdb redis.UniversalClient) (market.Locker, func() error) {
	c := dlock.New(rdb)
	return dlockLocker{client: c}, c.Close
}

// Lock takes name as a dlock Mutex (Fair if fair) and returns the lease's
// Unlock.
func (l dlockLocker) Lock(ctx context.Context, name string, fair bool) (func(context.Context) error, error) {
	var opts []dlock.LockOption
	if fair {
		opts = append(opts, dlock.Fair())
	}
	lease, err := l.client.Mutex(name, opts...).Lock(ctx)
	if err != nil {
		return nil, err
	}
	return lease.Unlock, nil
}

// LockAll takes names as one dlock MultiLock and returns the lease's
// Unlock.
func (l dlockLocker) LockAll(ctx context.Context, names []string) (func(context.Context) error, error) {
	lease, err := l.client.MultiLock(names).Lock(ctx)
	if err != nil {
		return nil, err
	}
	return lease.Unlock, nil
}
