package dlock_test

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/redis/go-redis/v9"
)

// heldTTL is the TTL of a holder whose waiter must be notified: far longer
// than waitCtx, so a waiter that got the lock before its ctx ended heard
// the release (or a hand-over) instead of waiting out the holder's TTL.
const (
	heldTTL = 60 * time.Second
	waitCtx = 20 * time.Second
)

// everyPrimitive runs each primitive once through the paths a deployment
// uses, on Clients a and b (two processes): a default and a Fair Mutex, an
// RWMutex and a Semaphore, each with a waiter on b that must be notified
// of a's release; Extend, TTL and Unlock; and watchdog renewal across
// several TTLs. admin is a client that may read every key, for checks. It
// calls see with every lease it obtained (to collect tokens). It fails the
// test at the first step that does not work.
func everyPrimitive(t *testing.T, ctx context.Context, a, b *dlock.Client, renewals *atomic.Int64, admin redis.Cmdable, see func(*dlock.Lease)) {
	t.Helper()
	got := func(l *dlock.Lease, err error) *dlock.Lease {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		see(l)
		return l
	}
	// notified holds with a on a long TTL, starts b's wait, waits until b
	// waits, releases, and checks that b got it within waitCtx.
	notified := func(what string, hold, wait func(context.Context) (*dlock.Lease, error), waiting func() bool) {
		t.Helper()
		h := got(hold(ctx))
		wctx, cancel := context.WithTimeout(ctx, waitCtx)
		defer cancel()
		type res struct {
			l   *dlock.Lease
			err error
		}
		done := make(chan res, 1)
		go func() {
			l, err := wait(wctx)
			done <- res{l, err}
		}()
		waitFor(t, ctx, what+": the waiter is waiting", waiting)
		if err := h.Unlock(ctx); err != nil {
			t.Fatalf("%s: Unlock: %v", what, err)
		}
		r := <-done
		if r.err != nil {
			t.Fatalf("%s: the waiter was not notified of the release (the holder's TTL is %v, the wait's ctx %v): %v", what, heldTTL, waitCtx, r.err)
		}
		got(r.l, nil)
		if err := r.l.Unlock(ctx); err != nil {
			t.Fatalf("%s: the waiter's Unlock: %v", what, err)
		}
	}
	inLine := func(key string) func() bool {
		return func() bool { return admin.LLen(ctx, key+":q").Val() > 0 }
	}
	// Mutex, default mode: Extend, TTL, Unlock; then a notified waiter (the
	// head of b's waiters takes a place in the line at Redis).
	m := a.Mutex("m", dlock.TTL(heldTTL))
	l := got(m.Lock(ctx))
	if err := l.Extend(ctx, 2*heldTTL); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if ttl, err := l.TTL(ctx); err != nil || ttl <= heldTTL {
		t.Fatalf("TTL after Extend(%v) = %v, %v", 2*heldTTL, ttl, err)
	}
	if _, err := b.Mutex("m").TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock of a held mutex: %v, want ErrNotObtained", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	notified("Mutex", m.Lock, b.Mutex("m", dlock.TTL(heldTTL)).Lock, inLine("dlock:{m}"))

	// Fair: b waits in the line at Redis and is handed the lock.
	notified("Fair Mutex", a.Mutex("f", dlock.Fair(), dlock.TTL(heldTTL)).Lock,
		b.Mutex("f", dlock.Fair(), dlock.TTL(heldTTL)).Lock, inLine("dlock:{f}"))

	// RWMutex: a reader holds, a writer waits; then a writer holds and a
	// reader waits.
	notified("RWMutex writer", a.RWMutex("rw", dlock.TTL(heldTTL)).RLock,
		b.RWMutex("rw", dlock.TTL(heldTTL)).Lock, inLine("dlock:{rw}"))
	notified("RWMutex reader", a.RWMutex("rw", dlock.TTL(heldTTL)).Lock,
		b.RWMutex("rw", dlock.TTL(heldTTL)).RLock, inLine("dlock:{rw}"))

	// Semaphore of 2: one permit stays held while the other is waited for.
	sa := a.Semaphore("s", 2, dlock.TTL(heldTTL))
	one := got(sa.Acquire(ctx, 1))
	notified("Semaphore", func(ctx context.Context) (*dlock.Lease, error) { return sa.Acquire(ctx, 1) },
		func(ctx context.Context) (*dlock.Lease, error) {
			return b.Semaphore("s", 2, dlock.TTL(heldTTL)).Acquire(ctx, 1)
		},
		inLine("dlock:{s}"))
	if err := one.Unlock(ctx); err != nil {
		t.Fatalf("Semaphore Unlock: %v", err)
	}

	// The watchdog: a short TTL outlived by several renewals. The
	// renewal hook runs before each renewal is sent; after four, the
	// lease has lived past its first TTL, which only a renewal that
	// reached Redis explains.
	const short = time.Second // under load a 300ms lease missed its renewals
	w := got(a.Mutex("wd", dlock.TTL(short)).Lock(ctx))
	from := renewals.Load()
	waitFor(t, ctx, "four renewals", func() bool { return renewals.Load() >= from+4 || w.Context().Err() != nil })
	if err := w.Context().Err(); err != nil {
		t.Fatalf("the watchdog did not keep the lease: %v", context.Cause(w.Context()))
	}
	if owner := admin.HGet(ctx, "dlock:{wd}", "o").Val(); owner != w.Token() {
		t.Fatalf("after four renewals the lock's owner is %q, not the lease's token", owner)
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatalf("watchdog lease Unlock: %v", err)
	}
	// Election: a leads and proclaims; b observes it, then campaigns and
	// is handed the leadership by a's Resign.
	ea, eb := a.Election("e", dlock.TTL(heldTTL)), b.Election("e", dlock.TTL(heldTTL))
	lead := got(ea.Campaign(ctx, "a1"))
	if err := ea.Proclaim(ctx, "a2"); err != nil {
		t.Fatalf("Election Proclaim: %v", err)
	}
	octx, stop := context.WithCancel(ctx)
	reports := eb.Observe(octx)
	waitFor(t, ctx, "the observer to see a2", func() bool {
		select {
		case r := <-reports:
			return r.Value == "a2" && r.Fence == lead.Fence()
		default:
			return false
		}
	})
	stop()
	if v, f, err := eb.Leader(ctx); err != nil || v != "a2" || f != lead.Fence() {
		t.Fatalf("Election Leader = %q, %d, %v; want a2, %d", v, f, err, lead.Fence())
	}
	notified("Election", func(context.Context) (*dlock.Lease, error) { return lead, nil },
		func(ctx context.Context) (*dlock.Lease, error) { return eb.Campaign(ctx, "b1") },
		inLine("dlock:{e}"))
	if _, _, err := ea.Leader(ctx); !errors.Is(err, dlock.ErrNoLeader) {
		t.Fatalf("Election Leader after the last Resign: %v, want ErrNoLeader", err)
	}
	// MultiLock: four names (two of them in one slot on a Cluster) held by
	// a as one; b waits in the line of the name that blocked it.
	multi := []string{"mu-1", "mu-2", "{mt}x", "{mt}y"}
	notified("MultiLock", a.MultiLock(multi, dlock.TTL(heldTTL)).Lock, b.MultiLock(multi, dlock.TTL(heldTTL)).Lock,
		func() bool {
			return slices.ContainsFunc(multi, func(n string) bool { return inLine("dlock:{" + n + "}")() })
		})
	for _, key := range []string{"dlock:{m}", "dlock:{f}", "dlock:{rw}", "dlock:{s}", "dlock:{wd}", "dlock:{e}", "dlock:{mu-1}", "dlock:{mu-2}", "dlock:{{mt}x}", "dlock:{{mt}y}"} {
		if o := admin.HGet(ctx, key, "o").Val(); o != "" {
			t.Errorf("%s still owned by %q after every Unlock", key, o)
		}
	}
}

// countRenewals sets c's renewal hook to count into n.
func countRenewals(c *dlock.Client, n *atomic.Int64) {
	dlock.SetRenewalHook(c, func(*dlock.Lease) { n.Add(1) })
}
