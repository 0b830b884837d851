package rueidisdlock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/wire"
)

// TestPausedServerLateGrantGivenBack: the server is paused (SIGSTOP) with
// a Lock's acquire written to it. Lock returns when its ctx ends, not when
// the server answers; once the server is resumed it grants the acquire,
// and the grant, whose caller left, is given back: the lock is free again
// long before its TTL (a minute). (Here the give-back that Lock sends when
// its ctx ends runs after the acquire and frees it too; TestCtxEndRacesReply
// is the one that fails if a late reply does not reach the engine.)
func TestPausedServerLateGrantGivenBack(t *testing.T) {
	s := redistest.Start(t)
	c := newDlock(t, client(t, s.Addr()))
	rdb := s.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	const name = "paused-late"
	key := wire.HashKey(wire.DefaultPrefix, name)
	// Warm up: the first lock call asks which pub/sub the server has.
	l, err := c.Mutex(name, dlock.TTL(time.Minute)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	fence := rdb.HGet(ctx, key, wire.FieldFence).Val()

	s.Pause()
	resumed := false
	defer func() {
		if !resumed {
			s.Resume()
		}
	}()
	lctx, lcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer lcancel()
	start := time.Now()
	_, err = c.Mutex(name, dlock.TTL(time.Minute)).Lock(lctx)
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Lock took %v past a 200ms ctx on a paused server", d)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock on a paused server: %v, want context.DeadlineExceeded", err)
	}
	s.Resume()
	resumed = true
	// The acquire ran once the server went on: its fence moved on.
	redistest.WaitUntil(t, ctx, "the written acquire run at Redis", func() bool { return rdb.HGet(ctx, key, wire.FieldFence).Val() != fence })
	redistest.WaitUntil(t, ctx, "the late grant given back (its TTL is a minute)", func() bool { return !rdb.HExists(ctx, key, wire.FieldOwner).Val() })
	// The lock can be had at once.
	tctx, tcancel := context.WithTimeout(ctx, 5*time.Second)
	defer tcancel()
	l, err = c.Mutex(name, dlock.TTL(time.Minute)).TryLock(tctx)
	if err != nil {
		t.Fatalf("TryLock after the give-back: %v", err)
	}
	_ = l.Unlock(ctx)
}

// TestCtxEndRacesReply: many TryLocks whose ctx ends at about the time the
// reply comes (random deadlines around one round trip), from concurrent
// goroutines, so that the end of ctx and the reply race in every order
// through the driver's hand-off. Each grant either reaches its caller
// (which releases it) or, once the caller left, the late callback (which
// gives it back): every lock must end up free, none left to its TTL.
func TestCtxEndRacesReply(t *testing.T) {
	s := redistest.Start(t)
	c := newDlock(t, client(t, s.Addr()))
	rdb := s.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	const workers, rounds = 8, 60
	var mu sync.Mutex
	outcomes := map[string]int{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for r := range rounds {
				name := fmt.Sprintf("race-%d-%d", w, r)
				d := time.Duration(rand.IntN(1500)) * time.Microsecond
				tctx, tcancel := context.WithTimeout(ctx, d)
				l, err := c.Mutex(name, dlock.TTL(time.Minute)).TryLock(tctx)
				tcancel()
				kind := "ctx"
				switch {
				case err == nil:
					kind = "granted"
					if uerr := l.Unlock(ctx); uerr != nil {
						t.Errorf("Unlock of %s: %v", name, uerr)
					}
				case !errors.Is(err, context.DeadlineExceeded):
					t.Errorf("TryLock of %s: %v, want a grant or context.DeadlineExceeded", name, err)
				}
				mu.Lock()
				outcomes[kind]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("outcomes: %v", outcomes)
	for w := range workers {
		for r := range rounds {
			key := wire.HashKey(wire.DefaultPrefix, fmt.Sprintf("race-%d-%d", w, r))
			redistest.WaitUntil(t, ctx, key+" free (given back or released)", func() bool { return !rdb.HExists(ctx, key, wire.FieldOwner).Val() })
		}
	}
}
