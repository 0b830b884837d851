package main

import (
	"context"
	"fmt"

	"github.com/bsm/redislock"
)

// bsm/redislock on the shared go-redis client.
//
// Obtain's default is NoRetry, and without a ctx deadline it silently caps
// waiting at the TTL. Here it waits with LinearBackoff(env.retry) (1ms, the
// raw floor's delay; stateless, so one strategy value is shared safely —
// ExponentialBackoff keeps a counter and would need one per Obtain) and the
// caller's ctx deadline bounds the wait.

func init() {
	register(&impl{
		name:  "redislock",
		order: 30,
		settings: func(e *env) string {
			return fmt.Sprintf("Obtain(ctx, key, %v, RetryStrategy: LinearBackoff(%v)); the wait is bounded by the ctx deadline (default: NoRetry, and waiting capped at the TTL when ctx has no deadline)", e.ttl, e.retry)
		},
		open: openRedislock,
	})
}

type redislockLocker struct {
	c    *redislock.Client
	e    *env
	opts *redislock.Options
}

func openRedislock(e *env) (locker, error) {
	return &redislockLocker{
		c:    redislock.New(e.rdb),
		e:    e,
		opts: &redislock.Options{RetryStrategy: redislock.LinearBackoff(e.retry)},
	}, nil
}

func (l *redislockLocker) Close() error { return nil }

type redislockHeld struct{ l *redislock.Lock }

func (l *redislockLocker) Lock(ctx context.Context, key string) (held, error) {
	lk, err := l.c.Obtain(ctx, key, l.e.ttl, l.opts)
	if err != nil {
		return nil, err
	}
	return redislockHeld{lk}, nil
}

func (h redislockHeld) Unlock(ctx context.Context) error { return h.l.Release(ctx) }
