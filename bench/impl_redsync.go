package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/go-redsync/redsync/v4"
	redsyncredis "github.com/go-redsync/redsync/v4/redis"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
)

// redsync (github.com/go-redsync/redsync/v4) over its go-redis v9 pool, on the
// shared go-redis client, one pool (single-node Redlock).
//
// Its defaults give up quickly: 32 tries with a random 50–250ms delay, so
// Lock fails after about 5s of waiting. For the "wait until ctx ends"
// behaviour the other implementations have, tries is set to MaxInt32 and
// the delay to env.retry (1ms, the raw floor's). Expiry is env.ttl (default
// 8s). Each failed try also runs the release script (redsync's own design).

func init() {
	register(&impl{
		name:  "redsync",
		order: 20,
		settings: func(e *env) string {
			return fmt.Sprintf("redsync.NewMutex per lock; WithExpiry(%v), WithTries(math.MaxInt32), WithRetryDelay(%v) (defaults: 32 tries, rand 50–250ms delay, 8s expiry)", e.ttl, e.retry)
		},
		open:   openRedsync,
		quorum: redsyncQuorum,
	})
}

// redsyncQuorum runs redsync's Redlock on several masters: one pool per
// master, the options of the single-master adapter plus a per-master
// timeout (WithTimeoutFactor: a fraction of the expiry) and
// WithFailFast(true), which returns once a majority answered alike rather
// than after every master. Its go-redis clients have ContextTimeoutEnabled,
// without which go-redis does not end a request at its context's deadline
// and the per-master timeout would not hold against a master that does
// not answer.
var redsyncQuorum = &quorumImpl{
	settings: func(e *env, node time.Duration) string {
		return fmt.Sprintf("redsync.New(one goredis pool per master).NewMutex per lock; WithExpiry(%v), WithTries(math.MaxInt32), WithRetryDelay(%v), WithTimeoutFactor(%g) (a %v per-master timeout), WithFailFast(true); go-redis clients with ContextTimeoutEnabled; LockContext/TryLockContext, UnlockContext", e.ttl, e.retry, float64(node)/float64(e.ttl), node)
	},
	open: func(e *env, rdbs []*redis.Client, node time.Duration) (tryLocker, error) {
		pools := make([]redsyncredis.Pool, len(rdbs))
		for i, r := range rdbs {
			pools[i] = goredis.NewPool(r)
		}
		return &redsyncLocker{
			rs: redsync.New(pools...),
			opts: []redsync.Option{
				redsync.WithExpiry(e.ttl),
				redsync.WithTries(math.MaxInt32),
				redsync.WithRetryDelay(e.retry),
				redsync.WithTimeoutFactor(float64(node) / float64(e.ttl)),
				redsync.WithFailFast(true),
			},
		}, nil
	},
	held: func(ctx context.Context, rdb *redis.Client, key string) (bool, error) {
		n, err := rdb.Exists(ctx, key).Result()
		return n > 0, err
	},
	options: func(o *redis.Options) { o.ContextTimeoutEnabled = true },
}

type redsyncLocker struct {
	rs   *redsync.Redsync
	opts []redsync.Option
}

func openRedsync(e *env) (locker, error) {
	return &redsyncLocker{
		rs: redsync.New(goredis.NewPool(e.rdb)),
		opts: []redsync.Option{
			redsync.WithExpiry(e.ttl),
			redsync.WithTries(math.MaxInt32),
			redsync.WithRetryDelay(e.retry),
		},
	}, nil
}

func (l *redsyncLocker) Close() error { return nil }

type redsyncHeld struct{ m *redsync.Mutex }

func (l *redsyncLocker) Lock(ctx context.Context, key string) (held, error) {
	m := l.rs.NewMutex(key, l.opts...)
	if err := m.LockContext(ctx); err != nil {
		if ctx.Err() != nil {
			return nil, fmt.Errorf("%w (%w)", ctx.Err(), err)
		}
		return nil, err
	}
	return redsyncHeld{m}, nil
}

// TryLock tries once (the quorum scenario).
func (l *redsyncLocker) TryLock(ctx context.Context, key string) (held, error) {
	m := l.rs.NewMutex(key, l.opts...)
	if err := m.TryLockContext(ctx); err != nil {
		return nil, err
	}
	return redsyncHeld{m}, nil
}

func (h redsyncHeld) Unlock(ctx context.Context) error {
	ok, err := h.m.UnlockContext(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("redsync: unlock did not reach quorum")
	}
	return nil
}
