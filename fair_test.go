package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

func TestFairBasics(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	m := c.Mutex("fair", dlock.Fair())
	l, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock on a held fair lock: %v", err)
	}
	if n := rdb.LLen(ctx, "dlock:{fair}:q").Val(); n != 0 {
		t.Fatalf("TryLock took a place in line (%d)", n)
	}
	got := make(chan *dlock.Lease)
	go func() {
		l2, err := c.Mutex("fair", dlock.Fair()).Lock(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- l2
	}()
	waitLine(t, ctx, rdb, "dlock:{fair}", 1)
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l2 := <-got
	if l2 == nil {
		t.FailNow()
	}
	if l2.Fence() <= l.Fence() {
		t.Fatalf("fence %d after %d", l2.Fence(), l.Fence())
	}
	// The hand-over left the line empty and the lease renewed to its TTL.
	if n := rdb.Exists(ctx, "dlock:{fair}:q", "dlock:{fair}:w").Val(); n != 0 {
		t.Fatalf("line keys left behind: %d", n)
	}
	// The first renewal is due a third of a second after the hand-over;
	// waited for, not slept on. Until it lands the key lives at most the
	// waiter's place's few seconds (release.lua), under the 5 s looked for,
	// and a lease not renewed in time is lost: neither comes right by
	// waiting longer.
	var ttl time.Duration
	waitFor(t, ctx, "the handed-over lease renewed", func() bool {
		ttl, err = l2.TTL(ctx)
		return err != nil || ttl >= 5*time.Second
	})
	if err != nil || ttl < 5*time.Second {
		t.Fatalf("handed-over lease TTL %v, %v: not renewed to the full TTL", ttl, err)
	}
	if err := l2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// Unlock of a handed-over holding retried: still fine.
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("second Unlock: %v", err)
	}
}

// TestFairOrderAcrossClients: waiters on several Clients (as in several
// processes) get the lock in the order they arrived, and fences follow it.
func TestFairOrderAcrossClients(t *testing.T) {
	s := redistest.Start(t)
	ctx := ctxT(t, 60*time.Second)
	clients, rdb := newClients(t, s, 4)
	holder, err := clients[0].Mutex("line", dlock.Fair()).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const n = 32
	type grant struct {
		idx   int
		fence uint64
		at    time.Time // Lock returned
	}
	grants := make(chan grant, n)
	unlockAt := make([]time.Time, n+1) // when each holder called Unlock; [n] is the first holder
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			l, err := clients[i%4].Mutex("line", dlock.Fair()).Lock(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			grants <- grant{i, l.Fence(), time.Now()}
			time.Sleep(2 * time.Millisecond) // hold time
			unlockAt[i] = time.Now()
			_ = l.Unlock(ctx)
		}(i)
		// Arrive in order, alternating Clients: the next one starts once this
		// one has its place in line.
		waitLine(t, ctx, rdb, "dlock:{line}", int64(i+1))
	}
	unlockAt[n] = time.Now()
	_ = holder.Unlock(ctx)
	wg.Wait()
	close(grants)
	var order []grant
	for g := range grants {
		order = append(order, g)
	}
	for i := range order {
		if order[i].idx != i {
			t.Fatalf("grant order %v, want arrival order", order)
		}
		if i > 0 && order[i].fence <= order[i-1].fence {
			t.Fatalf("fences not increasing: %v", order)
		}
	}
	// Each hand-off, from the releaser's Unlock call to the next holder's
	// Lock return, on this process's monotonic clock.
	var handOffs []time.Duration
	prev := n
	for _, g := range order {
		handOffs = append(handOffs, g.at.Sub(unlockAt[prev]))
		prev = g.idx
	}
	logHandOffs(t, "between Clients in one process", handOffs)
}

// TestFairDeadWaiterSkipped: a waiter that stops keeping its place (killed,
// or gave up) is skipped within its liveness bound.
func TestFairDeadWaiterSkipped(t *testing.T) { leaveAndSkipGhost(t, dlock.Fair()) }

// leaveAndSkipGhost: a waiter in line (Fair, or a default-mode head) that
// gives up leaves the line at once, and a place that nobody refreshes any
// more (a killed waiter's) is skipped within its liveness.
func leaveAndSkipGhost(t *testing.T, opts ...dlock.LockOption) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s)
	other, _ := newClient(t, s)
	ctx := ctxT(t, 30*time.Second)
	holder, err := c.Mutex("dead", opts...).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	gctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	if _, err := other.Mutex("dead", opts...).Lock(gctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock with a 300ms ctx: %v", err)
	}
	cancel()
	// It leaves in the background, at once (within the TTL at most).
	waitFor(t, ctx, "the waiter that gave up to leave the line", func() bool {
		return rdb.Exists(ctx, "dlock:{dead}:q", "dlock:{dead}:w").Val() == 0
	})
	// A ghost: a place in line that nobody refreshes any more, as a killed
	// process leaves it, still valid for 300ms.
	now := rdb.Time(ctx).Val()
	rdb.RPush(ctx, "dlock:{dead}:q", "ghost")
	rdb.HSet(ctx, "dlock:{dead}:w", "ghost", fmt.Sprintf("%d,10000,dlock:{dead}:c:ghost", now.UnixMilli()+300))
	got := lockedAt(t, ctx, other.Mutex("dead", opts...).Lock)
	waitLine(t, ctx, rdb, "dlock:{dead}", 2) // the live waiter behind the ghost
	released := time.Now()
	_ = holder.Unlock(ctx)
	at, ok := <-got
	if !ok {
		t.FailNow()
	}
	// The ghost was handed the lock (its place was still valid) with an
	// expiry of at most 2 × its remaining liveness + 1s; then the live waiter.
	if d := at.Sub(released); d > 4*time.Second {
		t.Fatalf("live waiter got the lock %v after release behind a dead one", d)
	}
	t.Logf("live waiter got the lock %v after the release, behind a dead waiter", at.Sub(released))
}

// TestFairAndDefaultExclusive: Fair and default callers of one name never
// hold it together.
func TestFairAndDefaultExclusive(t *testing.T) {
	s := redistest.Start(t)
	cs, rdb := newClients(t, s, 2)
	contend(t, ctxT(t, 60*time.Second), rdb, 16, 15, func(g int) *dlock.Mutex {
		if g%4 < 2 {
			return cs[g%2].Mutex("mixed", dlock.Fair())
		}
		return cs[g%2].Mutex("mixed")
	})
}

// TestFairHandOverNoRenew: a lock handed over to a NoRenew waiter lives its
// full TTL, not just the short expiry of the hand-over.
func TestFairHandOverNoRenew(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	opts := []dlock.LockOption{dlock.Fair(), dlock.NoRenew(), dlock.TTL(5 * time.Second)}
	l, err := c.Mutex("norenew", opts...).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *dlock.Lease, 1)
	go func() {
		l2, err := c.Mutex("norenew", opts...).Lock(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- l2
	}()
	waitLine(t, ctx, rdb, "dlock:{norenew}", 1) // the waiter is in line: the lock is handed over
	_ = l.Unlock(ctx)
	l2 := <-got
	if l2 == nil {
		t.FailNow()
	}
	time.Sleep(3500 * time.Millisecond) // past the hand-over's own expiry (at most 3s)
	if ttl, err := l2.TTL(ctx); err != nil || ttl < time.Second {
		t.Fatalf("handed-over NoRenew lease: TTL %v, %v; want its 5s TTL", ttl, err)
	}
	_ = l2.Unlock(ctx)
}
