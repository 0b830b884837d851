package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// quorumMasters starts n independent masters whose data the test knows to
// be new: their epoch keys are set to long ago, so they vote at once (a
// master's first use otherwise waits out the restart delay).
func quorumMasters(t testing.TB, n int) ([]*redistest.Server, []redis.UniversalClient) {
	t.Helper()
	servers := redistest.Masters(t, n)
	rdbs := make([]redis.UniversalClient, n)
	for i, s := range servers {
		certifyOld(t, s)
		rdbs[i] = s.Client(t)
	}
	return servers, rdbs
}

// certifyOld sets s's epoch key (default prefix) to the epoch of the clock.
func certifyOld(t testing.TB, s *redistest.Server) {
	t.Helper()
	s.Do(t, "set", "dlock:epoch", "0")
}

func newQuorum(t *testing.T, rdbs []redis.UniversalClient, opts ...dlock.Option) *dlock.Client {
	t.Helper()
	c, err := dlock.NewQuorum(rdbs, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestQuorumMutexBasics(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	servers, rdbs := quorumMasters(t, 5)
	a, b := newQuorum(t, rdbs), newQuorum(t, rdbs)
	m := a.Mutex("basics", dlock.TTL(2*time.Second))
	l, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	holders := 0
	for _, s := range servers {
		if s.Do(t, "hget", "dlock:{basics}", "o") == l.Token() {
			holders++
		}
	}
	if holders < 3 {
		t.Fatalf("the lease is held on %d of 5 masters", holders)
	}
	if _, err := b.Mutex("basics").TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock of a held lock: %v, want ErrNotObtained", err)
	}
	if ttl, err := l.TTL(ctx); err != nil || ttl <= 0 || ttl > 2*time.Second {
		t.Fatalf("TTL: %v, %v", ttl, err)
	}
	if err := l.Extend(ctx, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	// Renewal keeps it past its TTL.
	time.Sleep(4 * time.Second)
	if err := l.Context().Err(); err != nil {
		t.Fatalf("renewed lease ended: %v", context.Cause(l.Context()))
	}
	waited := make(chan *dlock.Lease)
	go func() {
		l2, err := b.Mutex("basics").Lock(ctx)
		if err != nil {
			t.Error(err)
		}
		waited <- l2
	}()
	time.Sleep(100 * time.Millisecond)
	released := time.Now()
	f1 := l.Fence()
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l2 := <-waited
	if l2 == nil {
		return
	}
	if d := time.Since(released); d > time.Second {
		t.Fatalf("waiter took the lock %v after the release: not woken", d)
	}
	if l2.Fence() <= f1 {
		t.Fatalf("fence %d after %d", l2.Fence(), f1)
	}
	if err := l2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// Unlock returns once a majority released; Close waits for the
	// releases still on their way to the others.
	_ = b.Close()
	for _, s := range servers {
		if o := s.Do(t, "hget", "dlock:{basics}", "o"); o != nil {
			t.Fatalf("owner %v left after unlock", o)
		}
	}
}

// TestQuorumUnlockLeavesNoGrant: Lock returns once a majority granted,
// while the other masters' acquires may not have run yet; the release
// must not overtake them (on other connections), or their grants stay
// until the TTL and a later Lock with a master down finds no majority.
// Serial cycles make the overtaking likely; after them no master may name
// an owner.
func TestQuorumUnlockLeavesNoGrant(t *testing.T) {
	ctx := ctxT(t, 60*time.Second)
	servers, rdbs := quorumMasters(t, 5)
	c := newQuorum(t, rdbs)
	m := c.Mutex("overtaken")
	for range 1000 {
		l, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	_ = c.Close() // waits for the releases still on their way
	for i, s := range servers {
		if o := s.Do(t, "hget", "dlock:{overtaken}", "o"); o != nil {
			t.Errorf("master %d: owner %v left after every lease was unlocked", i, o)
		}
	}
}

// TestQuorumTryLockNoMajorityGivesBack: with 3 of 5 masters down a TryLock
// fails, and the 2 live masters that granted are released before it
// returns (those down are released in the background).
func TestQuorumTryLockNoMajorityGivesBack(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	servers, rdbs := quorumMasters(t, 5)
	for _, s := range servers[2:] {
		s.Kill()
	}
	c := newQuorum(t, rdbs, dlock.WithNodeTimeout(20*time.Millisecond))
	for range 5 {
		if l, err := c.Mutex("partial").TryLock(ctx); err == nil {
			_ = l.Unlock(ctx)
			t.Fatal("TryLock obtained a lock on 2 of 5 masters")
		}
		for i, s := range servers[:2] {
			if o := s.Do(t, "hget", "dlock:{partial}", "o"); o != nil {
				t.Fatalf("live master %d: owner %v left by a failed TryLock", i, o)
			}
		}
	}
}

// TestQuorumLockWaitsWithMastersDown: a Lock that has to wait, with 2 of 5
// masters down, gets the lock when the holder unlocks. Its wait for the
// masters' subscriptions is bounded once for all: the down masters never
// confirm theirs, and a bound that ended the wait for the first of them
// only left the Lock waiting for the second until its ctx ended.
func TestQuorumLockWaitsWithMastersDown(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	servers, rdbs := quorumMasters(t, 5)
	for _, s := range servers[3:] {
		s.Kill()
	}
	a, b := newQuorum(t, rdbs), newQuorum(t, rdbs)
	l, err := a.Mutex("down").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	got := async(t, wctx, b.Mutex("down").Lock)
	time.Sleep(100 * time.Millisecond)
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l2, err := got()
	if err != nil {
		t.Fatalf("the waiter, after the holder unlocked: %v", err)
	}
	_ = l2.Unlock(ctx)
}
