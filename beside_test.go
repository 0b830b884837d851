package dlock_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// subscribeCalls returns how many SSUBSCRIBE and SUBSCRIBE commands the
// server has run.
func subscribeCalls(t *testing.T, ctx context.Context, rdb *redis.Client) int64 {
	t.Helper()
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (name != "cmdstat_ssubscribe" && name != "cmdstat_subscribe") {
			continue
		}
		calls, _, _ := strings.Cut(strings.TrimPrefix(rest, "calls="), ",")
		v, _ := strconv.ParseInt(calls, 10, 64)
		n += v
	}
	return n
}

// TestBesideLocalHolder: a Lock that finds the lock held by a holding of
// its own Client waits beside it: no subscription and no place in the line
// at Redis, and the holder's release wakes it (not its timer). Fences still
// increase.
func TestBesideLocalHolder(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	m := c.Mutex("beside")
	holder, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	subs := subscribeCalls(t, ctx, rdb)
	got := async(t, ctx, m.Lock)
	waitFor(t, ctx, "the waiter asleep beside its holder", func() bool {
		n, asleep := dlock.QueuedLocally(c, "beside")
		return n == 1 && asleep
	})
	if n := rdb.LLen(ctx, "dlock:{beside}:q").Val(); n != 0 {
		t.Fatalf("%d places in the line at Redis, want none: the holder is of the same Client", n)
	}
	if d := subscribeCalls(t, ctx, rdb) - subs; d != 0 {
		t.Fatalf("%d subscriptions for a wait beside a holder of the same Client, want none", d)
	}
	woken := dlock.BesideWoken(c)
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := got()
	if err != nil {
		t.Fatal(err)
	}
	if l.Fence() <= holder.Fence() {
		t.Fatalf("fence %d after %d", l.Fence(), holder.Fence())
	}
	if dlock.BesideWoken(c) == woken {
		t.Fatal("the waiter was not woken by the release of its Client's holder")
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if d := subscribeCalls(t, ctx, rdb) - subs; d != 0 {
		t.Fatalf("%d subscriptions, want none", d)
	}
}

// TestBesideHandedAway: a waiter beside a holder of its own Client, when
// that holder's release hands the lock to another Client's waiter in the
// line at Redis, is told to look again, finds the other Client's holder,
// and waits in line for it: it gets the lock after it, with a higher fence.
func TestBesideHandedAway(t *testing.T) {
	s := redistest.Start(t)
	cs, rdb := newClients(t, s, 2)
	a, b := cs[0], cs[1]
	ctx := ctxT(t, 20*time.Second)
	holder, err := a.Mutex("away").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	other := async(t, ctx, b.Mutex("away").Lock)
	waitLine(t, ctx, rdb, "dlock:{away}", 1) // b's waiter, subscribed, in line
	mine := async(t, ctx, a.Mutex("away").Lock)
	waitFor(t, ctx, "a's waiter asleep beside its holder", func() bool {
		n, asleep := dlock.QueuedLocally(a, "away")
		return n == 1 && asleep
	})
	if n := rdb.LLen(ctx, "dlock:{away}:q").Val(); n != 1 {
		t.Fatalf("%d places in line, want b's only", n)
	}
	woken := dlock.BesideWoken(a)
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	lb, err := other()
	if err != nil {
		t.Fatal(err)
	}
	if lb.Fence() <= holder.Fence() {
		t.Fatalf("fence %d after %d", lb.Fence(), holder.Fence())
	}
	// a's waiter heard of the hand-over from its own holder's release, and
	// now waits in line for b's lease.
	waitLine(t, ctx, rdb, "dlock:{away}", 1)
	if dlock.BesideWoken(a) == woken {
		t.Fatal("a's waiter was not told that its holder handed the lock away")
	}
	if err := lb.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	la, err := mine()
	if err != nil {
		t.Fatal(err)
	}
	if la.Fence() <= lb.Fence() {
		t.Fatalf("fence %d after %d", la.Fence(), lb.Fence())
	}
	_ = la.Unlock(ctx)
}
