package main

import (
	"context"
	"fmt"

	"github.com/redis/rueidis"
	"github.com/redis/rueidis/rueidislock"
)

// rueidislock (github.com/redis/rueidis/rueidislock) on its own rueidis client
// (auto-pipelining; one per Locker, as rueidislock builds it).
//
// Everything is its default except KeyValidity, set to env.ttl for parity
// (default 5s, extended every KeyValidity/2 by its watchdog): KeyMajority 2
// (each lock takes 2 of 3 keys), waiting notified by client-side-caching
// invalidations (CLIENT TRACKING OPTOUT), no polling. WithContext waits until
// the lock is obtained or ctx ends. Unlock is the returned CancelFunc, which
// returns once the keys are deleted.

func init() {
	register(&impl{
		name:  "rueidislock",
		order: 40,
		settings: func(e *env) string {
			return fmt.Sprintf("NewLocker defaults (KeyMajority 2 of 3 keys, TryNextAfter 20ms, invalidation-notified waiting) with KeyValidity %v (default 5s); WithContext(ctx) waits until ctx ends", e.ttl)
		},
		open: openRueidislock,
	})
}

type rueidisLocker struct{ lk rueidislock.Locker }

func openRueidislock(e *env) (locker, error) {
	opt, err := rueidis.ParseURL(e.url)
	if err != nil {
		return nil, err
	}
	lk, err := rueidislock.NewLocker(rueidislock.LockerOption{
		ClientOption: opt,
		KeyValidity:  e.ttl,
	})
	if err != nil {
		return nil, err
	}
	return &rueidisLocker{lk: lk}, nil
}

func (l *rueidisLocker) Close() error { l.lk.Close(); return nil }

type rueidisHeld struct{ cancel context.CancelFunc }

func (l *rueidisLocker) Lock(ctx context.Context, key string) (held, error) {
	_, cancel, err := l.lk.WithContext(ctx, key)
	if err != nil {
		return nil, err
	}
	return rueidisHeld{cancel}, nil
}

// Unlock cancels the lock's context; rueidislock then deletes its keys and
// the CancelFunc returns when they are gone.
func (h rueidisHeld) Unlock(context.Context) error { h.cancel(); return nil }
