package dlock_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faultproxy"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/wire"
)

// TestFault5DoubleGrantWithoutReplicaAck reproduces fault 5 of
// shared/SAFETY.md on topology R: the primary dies after a grant it never
// sent to its replica, the sentinels promote the replica, and a second
// Client is granted the same lock while the first lease still believes it
// is valid. This is the documented limit without replica acknowledgement
// (Redis replicates asynchronously and the lock was granted without
// waiting for a replica); a later option, waiting for the replica before
// telling the holder, will make the first grant fail closed instead.
//
// It is made deterministic, not a race: the replication link is held (a
// proxy keeps the primary's stream from the replica, losing nothing,
// connections open) before the first grant, so the replica never has the
// lock key. The first lease has a 30s TTL with the watchdog on: it stays
// believed valid until its first renewal, due a third of the TTL after the
// grant, reaches the promoted replica and finds the key gone. A renewal
// hook keeps that first renewal from being sent before the second grant, in
// case the failover takes longer than that third; in the usual run the
// second grant comes first and the hook does not wait.
func TestFault5DoubleGrantWithoutReplicaAck(t *testing.T) {
	const ttl = 30 * time.Second
	const name = "fault5"
	r := redistest.StartReplicatedVia(t)
	ctx := ctxT(t, 60*time.Second)
	first := dlock.New(r.Client(t))
	t.Cleanup(func() { _ = first.Close() })
	second := dlock.New(r.Client(t))
	t.Cleanup(func() { _ = second.Close() })

	granted := make(chan struct{}) // closed at the second grant
	var hooked atomic.Bool
	var hookWaited atomic.Int64 // how long the first renewal waited
	dlock.SetRenewalHook(first, func(*dlock.Lease) {
		start := time.Now()
		select {
		case <-granted:
		case <-time.After(25 * time.Second): // bounded; the test fails by then
		}
		if hooked.CompareAndSwap(false, true) {
			hookWaited.Store(int64(time.Since(start)))
		}
	})

	r.Link.Hold(faultproxy.Downstream)
	l1, err := first.Mutex(name, dlock.TTL(ttl)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	grant1 := time.Now()
	key := wire.HashKey(wire.DefaultPrefix, name)
	if n := r.Primary.Do(t, "EXISTS", key); n != int64(1) {
		t.Fatalf("EXISTS %s on the primary = %v after the grant", key, n)
	}
	if n := r.Replica.Do(t, "EXISTS", key); n != int64(0) {
		t.Fatalf("EXISTS %s on the replica = %v: the held link let the grant through", key, n)
	}

	promotion := r.CrashPrimary(t) // SIGKILL; the sentinels promote the replica on their own
	t.Logf("the sentinels promoted the replica %v after the kill", promotion.Round(time.Millisecond))

	// The failover client finds the new primary; until it does, attempts
	// fail with connection errors. An ErrNotObtained would mean the grant
	// survived: no double grant.
	var l2 *dlock.Lease
	deadline := time.Now().Add(20 * time.Second)
	for {
		l2, err = second.Mutex(name, dlock.TTL(ttl)).TryLock(ctx)
		if err == nil {
			break
		}
		if errors.Is(err, dlock.ErrNotObtained) {
			t.Fatalf("the promoted replica refused the second grant: %v (the first grant reached it)", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no second grant 20s after the promotion: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // retry; the 20s bound is what matters
	}
	grant2 := time.Now()
	close(granted)
	dl1 := dlock.Deadline(l1)
	if err := l1.Context().Err(); err != nil {
		t.Fatalf("the first lease had ended (%v) before the second grant: no double grant reproduced", context.Cause(l1.Context()))
	}
	if !dl1.After(grant2) {
		t.Fatalf("the first lease's deadline %v is not after the second grant", dl1.Sub(grant2))
	}
	t.Logf("double grant: the second grant came %v after the first, whose deadline was %v later still; fences %d then %d",
		grant2.Sub(grant1).Round(time.Millisecond), dl1.Sub(grant2).Round(time.Millisecond), l1.Fence(), l2.Fence())

	// How long the first holder goes on believing: until its renewal
	// reaches the new primary (or, failing that, its deadline).
	select {
	case <-l1.Context().Done():
	case <-time.After(time.Until(dl1) + 5*time.Second):
		t.Fatalf("the first lease's context did not end by its deadline: %s", dlock.Describe(l1))
	}
	end1 := time.Now()
	if cause := context.Cause(l1.Context()); !errors.Is(cause, dlock.ErrLockLost) {
		t.Fatalf("the first lease ended with %v, want ErrLockLost", cause)
	}
	t.Logf("the first lease was believed valid for %v after its grant (renewal hook waited %v); both were believed held for %v",
		end1.Sub(grant1).Round(time.Millisecond), time.Duration(hookWaited.Load()).Round(time.Millisecond), end1.Sub(grant2).Round(time.Millisecond))
	if err := l2.Unlock(ctx); err != nil {
		t.Fatalf("the second lease's Unlock: %v", err)
	}
	if err := l1.Unlock(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("the first lease's Unlock = %v, want ErrLockLost", err)
	}
}
