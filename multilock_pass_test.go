package dlock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faults"
	"github.com/dlock-go/dlock/internal/redistest"
)

// TestMultiLockUndoSparesPartPassedOn: a MultiLock of [b] on Client c
// whose first multi_acquire's reply is lost (so it doubts b) waits for b
// behind H, a Lock of c. H's Unlock passes b to it, and at that moment
// (the pass hook) its ctx ends: its wait sees the pass, gives the holding
// up, and once the record H→T lands passes b on to W2, the next waiter of
// c, whose Lock returns pending. The pass records are slowed (600 ms, then
// 1.5 s), and so is the first give-back (fair_leave, 900 ms): a second
// give-back of b by the MultiLock's undo would land between the two
// records, while b is T's at Redis, and release it under W2's lease.
// Another Client must not take b while W2's lease is believed valid.
func TestMultiLockUndoSparesPartPassedOn(t *testing.T) {
	const b = "mpass/b"
	const ttl = 5 * time.Second
	// first leaves W2 time to fall asleep beside the pass before the record
	// lands (the MultiLock's holding passes b on only to a waiter asleep).
	const first, giveBack, second = 600 * time.Millisecond, 900 * time.Millisecond, 1500 * time.Millisecond
	s := redistest.Start(t)
	c, in := reviewClient(t, s, 2*time.Second, nil,
		faults.Rule{Script: "multi_acquire", Kind: faults.LoseReply, Calls: []int{1}},
		faults.Rule{Script: "pass", Kind: faults.DelaySend, Calls: []int{1}, Min: first, Max: first},
		faults.Rule{Script: "pass", Kind: faults.DelaySend, Calls: []int{2}, Min: second, Max: second},
		faults.Rule{Script: "fair_leave", Kind: faults.DelaySend, Calls: []int{1}, Min: giveBack, Max: giveBack})
	y, _ := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	mctx, cancelM := context.WithCancel(ctx)
	defer cancelM()
	var once sync.Once
	var passes atomic.Int32
	dlock.SetPassHook(c, func(_, _ *dlock.Lease) {
		passes.Add(1)
		once.Do(cancelM) // the pass H→T: T's ctx ends as it is passed b
	})
	mu := c.Mutex(b, dlock.TTL(ttl))
	queued := func(n int) func() bool {
		return func() bool { k, _ := dlock.QueuedLocally(c, b); return k == n }
	}

	// H0 holds b (taken by its first look: no turn, so its Unlock passes
	// nothing); H, T and W2 queue behind it, in that order.
	h0, err := mu.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	gotH := async(t, ctx, mu.Lock)
	waitFor(t, ctx, "H queued", queued(1))
	gotT := async(t, mctx, c.MultiLock([]string{b}, dlock.TTL(ttl)).Lock)
	waitFor(t, ctx, "T queued", queued(2))
	if n := in.Stats()["multi_acquire lose-reply single"]; n != 1 {
		t.Fatalf("%d group acquires lost their reply, want 1: %s", n, in.Summary())
	}
	gotW2 := async(t, ctx, mu.Lock)
	waitFor(t, ctx, "W2 queued", queued(3))

	// H0's release wakes H, beside it, which takes b in a turn that
	// includes T and W2; T, now the head, sleeps beside H.
	if err := h0.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	hl, err := gotH()
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "T asleep beside H", func() bool { n, asleep := dlock.QueuedLocally(c, b); return n == 2 && asleep })

	unlockH := make(chan error, 1)
	go func() { unlockH <- hl.Unlock(ctx) }() // passes b to T, and returns once the record lands
	if _, err := gotT(); !errors.Is(err, context.Canceled) {
		t.Fatalf("the MultiLock's Lock returned %v, want its ctx's end (passes %d)\nfaults: %s", err, passes.Load(), in.Summary())
	}
	w2, err := gotW2()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w2.Unlock(ctx) }()
	if !dlock.Pending(w2) {
		t.Fatalf("W2 was not passed b by the MultiLock's wait (passes %d): %s\nfaults: %s", passes.Load(), dlock.Describe(w2), in.Summary())
	}
	if err := <-unlockH; err != nil {
		t.Fatal(err)
	}

	// Until W2's record lands, and a while after, nobody else may take b.
	wctx := w2.Context()
	settled := time.Time{}
	for settled.IsZero() || time.Since(settled) < 200*time.Millisecond {
		if settled.IsZero() && !dlock.Pending(w2) {
			settled = time.Now()
		}
		other, err := y.Mutex(b).TryLock(ctx)
		if err == nil {
			live, left := wctx.Err() == nil, time.Until(dlock.Deadline(w2))
			_ = other.Unlock(ctx)
			if live && left > 0 {
				t.Fatalf("another Client took %s (fence %d) while W2, passed it by the MultiLock's wait, believes it holds it for %v more: %s\nfaults: %s",
					b, other.Fence(), left.Round(time.Millisecond), dlock.Describe(w2), in.Summary())
			}
			break
		} else if !errors.Is(err, dlock.ErrNotObtained) {
			t.Fatal(err)
		}
		if ctx.Err() != nil {
			t.Fatal(ctx.Err())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := in.Stats()["pass delay-send single"]; n != 2 {
		t.Errorf("%d pass records delayed, want 2 (H→T, T→W2): %s", n, in.Summary())
	}
	if wctx.Err() != nil {
		t.Errorf("W2's lease ended: %v (%s)", context.Cause(wctx), dlock.Describe(w2))
	}
}
