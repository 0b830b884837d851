package dlock_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faults"
	"github.com/dlock-go/dlock/internal/redistest"
)

// TestConcurrentUnlocksOfAPendingLease: a lease passed to, its record in
// flight, is unlocked by two goroutines at once while a third waiter of
// its Client sleeps in its turn. One Unlock passes on ahead of the record;
// the other must not take the lease's request slot and sit on it waiting
// for that pass, or the pass's record (which needs the slot after the
// first record) cannot run before its deadline: the third lease would be
// lost with the lock never lost at Redis, and both Unlocks would wait
// until then.
func TestConcurrentUnlocksOfAPendingLease(t *testing.T) {
	s := redistest.Start(t)
	plain, _ := newClient(t, s)
	c, _ := faultyClient(t, s, faults.Rule{Script: "pass", Kind: faults.DelaySend, P: 1, Min: 150 * time.Millisecond, Max: 150 * time.Millisecond})
	rdb := s.Client(t)
	ctx := ctxT(t, 60*time.Second)
	ttl := dlock.TTL(3 * time.Second)
	for round := 0; round < 6; round++ {
		name := "pending2x-" + strconv.Itoa(round)
		first, err := plain.Mutex(name, ttl).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := threeInTurn(t, ctx, c, rdb, name, first, c.Mutex(name, ttl).Lock, func(err error) { t.Error(err) })
		a := <-got
		if a == nil {
			t.FailNow()
		}
		waitFor(t, ctx, "the second waiter asleep", func() bool { _, asleep := dlock.QueuedLocally(c, name); return asleep })
		go func() { _ = a.Unlock(ctx) }()
		b := <-got
		if b == nil || !dlock.Pending(b) {
			t.Fatal("the second lease is not pending right after the pass")
		}
		waitFor(t, ctx, "the third waiter asleep", func() bool { _, asleep := dlock.QueuedLocally(c, name); return asleep })
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i := range errs {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = b.Unlock(ctx) }()
		}
		cl := <-got
		if cl == nil {
			t.FailNow()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatalf("round %d: concurrent Unlock of the pending lease: %v", round, err)
			}
		}
		if !stillValid(cl) {
			t.Fatalf("round %d: the third lease ended: %v", round, context.Cause(cl.Context()))
		}
		if o := owner(ctx, rdb, name); o != cl.Token() {
			t.Fatalf("round %d: owner %q after both records, want the third lease's", round, o)
		}
		if err := cl.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// TestBesideHolderStolen: a waiter beside a holder of its own Client is not
// told when that holder's lock is removed at Redis and another Client takes
// and releases it (that release is published on a channel the waiter does
// not hear). It must still get the lock, by looking again on its own, well
// within its ctx, with a fence above the other Client's.
func TestBesideHolderStolen(t *testing.T) {
	s := redistest.Start(t)
	cs, rdb := newClients(t, s, 2)
	a, b := cs[0], cs[1]
	ctx := ctxT(t, 20*time.Second)
	holder, err := a.Mutex("stolen", dlock.NoRenew()).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	mine := async(t, ctx, a.Mutex("stolen").Lock)
	waitFor(t, ctx, "a's waiter asleep beside its holder", func() bool {
		n, asleep := dlock.QueuedLocally(a, "stolen")
		return n == 1 && asleep
	})
	if err := rdb.Del(ctx, "dlock:{stolen}").Err(); err != nil {
		t.Fatal(err)
	}
	lb, err := b.Mutex("stolen").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := lb.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	la, err := mine()
	if err != nil {
		t.Fatalf("the waiter beside a stolen holder: %v", err)
	}
	if la.Fence() <= lb.Fence() {
		t.Fatalf("fence %d after %d", la.Fence(), lb.Fence())
	}
	_ = la.Unlock(ctx)
	_ = holder.Unlock(ctx)
}

// TestCloseDuringPassAhead: the Client closes while a pending lease has
// passed on ahead of its record: Close returns, every lease ends, every
// Unlock returns, and the lock is not left to a token at Redis past the
// records' cleanup (another Client gets it within its ctx).
func TestCloseDuringPassAhead(t *testing.T) {
	s := redistest.Start(t)
	plain, _ := newClient(t, s)
	c, _ := faultyClient(t, s, faults.Rule{Script: "pass", Kind: faults.DelaySend, P: 1, Min: 150 * time.Millisecond, Max: 150 * time.Millisecond})
	rdb := s.Client(t)
	ctx := ctxT(t, 30*time.Second)
	name := "close-ahead"
	first, err := plain.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := threeInTurn(t, ctx, c, rdb, name, first, c.Mutex(name).Lock, func(error) {})
	a := <-got
	if a == nil {
		t.FailNow()
	}
	waitFor(t, ctx, "the second waiter asleep", func() bool { _, asleep := dlock.QueuedLocally(c, name); return asleep })
	aDone := make(chan error, 1)
	go func() { aDone <- a.Unlock(ctx) }()
	b := <-got
	if b == nil || !dlock.Pending(b) {
		t.Fatal("the second lease is not pending right after the pass")
	}
	waitFor(t, ctx, "the third waiter asleep", func() bool { _, asleep := dlock.QueuedLocally(c, name); return asleep })
	bDone := make(chan error, 1)
	go func() { bDone <- b.Unlock(ctx) }()
	cl := <-got
	if cl == nil {
		t.FailNow()
	}
	_ = c.Close()
	<-aDone
	<-bDone
	select {
	case <-cl.Context().Done():
	case <-ctx.Done():
		t.Fatal("the third lease still believed valid after Close")
	}
	_ = cl.Unlock(ctx)
	l, err := plain.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatalf("another Client after Close: %v", err)
	}
	_ = l.Unlock(ctx)
}
