package dlock_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faults"
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

// TestPassAheadOfRecord: a lease passed to its holder, whose Unlock comes
// while that pass's record is still on its way to Redis, passes the lock on
// at once (the next holder does not wait for the round trip), and the
// second record follows the first: the lock at Redis still names the first
// holder when the third gets it, fences go up by one each, and every lease
// is recorded in the end. If the first record finds the lock lost, both
// passed leases are lost.
func TestPassAheadOfRecord(t *testing.T) {
	s := redistest.Start(t)
	plain, _ := newClient(t, s)
	c, _ := faultyClient(t, s, faults.Rule{Script: "pass", Kind: faults.DelaySend, P: 1, Min: 150 * time.Millisecond, Max: 150 * time.Millisecond})
	rdb := s.Client(t)
	ctx := ctxT(t, 30*time.Second)
	for _, lose := range []bool{false, true} {
		name := "ahead-" + strconv.FormatBool(lose)
		key := "dlock:{" + name + "}"
		first, err := plain.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// Three waiters on c: the first is handed the lock through Redis,
		// and its turn covers the two others.
		got := threeInTurn(t, ctx, c, rdb, name, first, c.Mutex(name).Lock, func(err error) {
			if !lose {
				t.Error(err)
			}
		})
		a := <-got
		waitFor(t, ctx, "the second waiter asleep", func() bool { _, asleep := dlock.QueuedLocally(c, name); return asleep })
		go func() { _ = a.Unlock(ctx) }() // passes to the second; its record is delayed
		b := <-got
		if !dlock.Pending(b) {
			t.Fatal("the second lease is not pending right after the pass")
		}
		waitFor(t, ctx, "the third waiter asleep", func() bool { _, asleep := dlock.QueuedLocally(c, name); return asleep })
		if lose {
			if err := rdb.Del(ctx, key).Err(); err != nil { // before the first record lands
				t.Fatal(err)
			}
		}
		bDone := make(chan error, 1)
		go func() { bDone <- b.Unlock(ctx) }()
		cl := <-got
		if o := owner(ctx, rdb, name); !lose && o != a.Token() {
			t.Fatalf("the third lease started after the first record landed (owner %q): it waited for it", o)
		}
		if cl.Fence() != b.Fence()+1 || b.Fence() != a.Fence()+1 {
			t.Fatalf("fences %d, %d, %d: want one more each", a.Fence(), b.Fence(), cl.Fence())
		}
		if lose {
			// Once the first record has found the lock lost (the second
			// lease settled), the third is not believed valid either.
			waitFor(t, ctx, "the second lease settled", func() bool { return dlock.Settled(b) })
			if stillValid(cl) {
				t.Fatal("the third lease still believed valid after the first record found the lock lost")
			}
		}
		err = <-bDone
		if lose {
			if !errors.Is(err, dlock.ErrLockLost) {
				t.Fatalf("the second lease's Unlock after the first record found the lock lost: %v, want ErrLockLost", err)
			}
			<-cl.Context().Done()
			if !errors.Is(context.Cause(cl.Context()), dlock.ErrLockLost) {
				t.Fatalf("the third lease ended with %v, want ErrLockLost", context.Cause(cl.Context()))
			}
			_ = cl.Unlock(ctx)
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		waitFor(t, ctx, "the third lease recorded", func() bool { return !dlock.Pending(cl) })
		if o := owner(ctx, rdb, name); o != cl.Token() {
			t.Fatalf("owner %q after both records, want the third lease's", o)
		}
		if err := cl.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// threeInTurn has three calls of lock (on c, for name) wait behind first,
// the first of them in line at Redis and all three queued on c in one
// turn, then unlocks first. The leases come on the channel as granted (nil
// for a call that failed, whose error goes to failed).
func threeInTurn(t *testing.T, ctx context.Context, c *dlock.Client, rdb redis.Cmdable, name string, first *dlock.Lease, lock func(context.Context) (*dlock.Lease, error), failed func(error)) <-chan *dlock.Lease {
	t.Helper()
	got := make(chan *dlock.Lease, 3)
	call := func() {
		l, err := lock(ctx)
		if err != nil {
			failed(err)
		}
		got <- l
	}
	go call()
	waitLine(t, ctx, rdb, "dlock:{"+name+"}", 1)
	go call()
	go call()
	waitFor(t, ctx, "three waiters queued", func() bool { n, _ := dlock.QueuedLocally(c, name); return n == 3 })
	if err := first.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	return got
}
