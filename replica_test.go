package dlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faultproxy"
	"github.com/dlock-go/dlock/internal/redistest"
)

// primaryAndReplica starts a primary and one replica of it (no sentinels)
// and waits until the replica is in sync. It returns go-redis clients of
// both.
func primaryAndReplica(t testing.TB) (p, r *redistest.Server, pc, rc *redis.Client) {
	t.Helper()
	p, r, pc, rc, _ = primaryAndReplicaVia(t)
	return p, r, pc, rc
}

// primaryAndReplicaVia is primaryAndReplica with the replication link
// through a fault proxy, which it returns too: the test can hold the
// primary's stream back from the replica while both keep answering.
func primaryAndReplicaVia(t testing.TB) (p, r *redistest.Server, pc, rc *redis.Client, link *faultproxy.Proxy) {
	t.Helper()
	p = redistest.Start(t)
	r, link = redistest.StartReplica(t, p, true)
	return p, r, p.Client(t), r.Client(t), link
}

// TestReplicaAckGrantIsOnTheReplica: with WithReplicaAck(1, ...) every grant
// (acquire, Fair hand-over, semaphore serve, Extend) is on the replica by
// the time the call returns.
func TestReplicaAckGrantIsOnTheReplica(t *testing.T) {
	_, _, pc, rc := primaryAndReplica(t)
	ctx := ctxT(t, 30*time.Second)
	c := newDlock(t, pc, dlock.WithReplicaAck(1, time.Second))
	t.Cleanup(func() { _ = c.Close() })
	onReplica := func(what, key, token string) {
		t.Helper()
		if got, _ := rc.HGet(ctx, key, "o").Result(); got != token {
			t.Fatalf("%s: the replica names owner %q, want %q", what, got, token)
		}
	}
	l, err := c.Mutex("a").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	onReplica("acquire", "dlock:{a}", l.Token())
	if err := l.Extend(ctx, 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if ms, _ := rc.PTTL(ctx, "dlock:{a}").Result(); ms < 15*time.Second {
		t.Fatalf("extend: the replica's TTL is %v, want about 20s", ms)
	}
	// A Fair waiter handed the lock by the release.
	next := async(t, ctx, c.Mutex("a", dlock.Fair()).Lock)
	waitLine(t, ctx, pc, "dlock:{a}", 1)
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	w, err := next()
	if err != nil {
		t.Fatal(err)
	}
	onReplica("hand-over", "dlock:{a}", w.Token())
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// A semaphore permit.
	s, err := c.Semaphore("s", 1).Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if ok, _ := rc.HExists(ctx, "dlock:{s}", "h:"+s.Token()).Result(); !ok {
		t.Fatalf("semaphore: the replica has no holding of token %s", s.Token())
	}
	_ = s.Unlock(ctx)
}

// TestReplicaAckFailsClosed: with the replica stopped, no call reports a
// grant: TryLock and Lock return ErrNotReplicated at once (naming how many
// confirmed) and leave the lock free; an Extend does not count; a waiter
// handed the lock gives it back with ErrNotReplicated; a held lease whose
// renewals are not confirmed ends by its deadline.
func TestReplicaAckFailsClosed(t *testing.T) {
	_, replica, pc, _ := primaryAndReplica(t)
	ctx := ctxT(t, 60*time.Second)
	// The ack timeout is well under the second a waiter handed the lock
	// has to confirm it in (its place's liveness, refreshed every third
	// of it): with 500ms, a loaded machine's hand-over outlived its
	// deadline first (lost, not ErrNotReplicated; closed either way).
	c := newDlock(t, pc, dlock.WithReplicaAck(1, 200*time.Millisecond))
	t.Cleanup(func() { _ = c.Close() })
	other := newDlock(t, pc) // no acknowledgement: its grants are not held back
	t.Cleanup(func() { _ = other.Close() })
	free := func(what, key string) {
		t.Helper()
		if o, _ := pc.HGet(ctx, key, "o").Result(); o != "" {
			t.Fatalf("%s: the lock is left owned by %q", what, o)
		}
	}
	notReplicated := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, dlock.ErrNotReplicated) || !strings.Contains(err.Error(), "0 of 1 replicas confirmed") {
			t.Fatalf("%s: %v, want ErrNotReplicated saying 0 of 1 replicas confirmed", what, err)
		}
	}

	held, err := c.Mutex("held", dlock.TTL(3*time.Second)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	heldEnded := make(chan time.Time, 1)
	go func() {
		<-held.Context().Done()
		heldEnded <- time.Now()
	}()
	hb, err := other.Mutex("b").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	handed := async(t, ctx, c.Mutex("b", dlock.Fair()).Lock)
	// Default mode: a waiter of the holder's own Client is not passed the
	// lock without Redis (an unacknowledged grant).
	// Its turn at Redis starts with the hand-over to the first, with the
	// second queued behind it.
	xp, err := other.Mutex("p").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	first := async(t, ctx, c.Mutex("p").Lock)
	waitLine(t, ctx, pc, "dlock:{p}", 1)
	passed := async(t, ctx, c.Mutex("p").Lock)
	waitFor(t, ctx, "two waiters queued in the Client", func() bool {
		n, _ := dlock.QueuedLocally(c, "p")
		return n == 2
	})
	if err := xp.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	hp, err := first()
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the second waiter asleep in line", func() bool {
		n, asleep := dlock.QueuedLocally(c, "p")
		return n == 1 && asleep
	})
	replica.Pause()
	defer replica.Resume()

	before := dlock.Deadline(held)
	err = held.Extend(ctx, 30*time.Second)
	notReplicated("Extend", err)
	if d := dlock.Deadline(held); d.After(before) {
		t.Fatalf("Extend not confirmed moved the deadline from %v to %v", before, d)
	}

	_, err = c.Mutex("a").TryLock(ctx)
	notReplicated("TryLock", err)
	free("TryLock", "dlock:{a}")
	start := time.Now()
	_, err = c.Mutex("a").Lock(ctx)
	notReplicated("Lock", err)
	if el := time.Since(start); el > 5*time.Second {
		t.Fatalf("Lock returned after %v: it went on trying", el)
	}
	free("Lock", "dlock:{a}")
	_, err = c.Semaphore("s", 2).TryAcquire(ctx, 1)
	notReplicated("semaphore TryLock", err)
	if n, _ := pc.ZCard(ctx, "dlock:{s}:h").Result(); n != 0 {
		t.Fatalf("semaphore: %d holdings left", n)
	}

	waitLine(t, ctx, pc, "dlock:{b}", 1)
	if err := hb.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = handed()
	notReplicated("hand-over", err)
	if !strings.Contains(err.Error(), "hand-over: 0 of 1") {
		t.Fatalf("hand-over: %v, want the error to say it was the hand-over", err)
	}
	waitFor(t, ctx, "the handed lock to be given back", func() bool {
		o, _ := pc.HGet(ctx, "dlock:{b}", "o").Result()
		return o == ""
	})

	// Its looks now take up to the WAIT timeout: unlock while it sleeps
	// between them, when a pass could be made.
	waitFor(t, ctx, "the second waiter asleep in line again", func() bool {
		_, asleep := dlock.QueuedLocally(c, "p")
		return asleep
	})
	if err := hp.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = passed()
	notReplicated("default-mode waiter of the same Client", err)

	// The held lease's renewals are not confirmed: it ends by its deadline.
	select {
	case at := <-heldEnded:
		if !errors.Is(context.Cause(held.Context()), dlock.ErrLockLost) {
			t.Fatalf("held lease ended with %v, want ErrLockLost", context.Cause(held.Context()))
		}
		if late := at.Sub(dlock.Deadline(held)); late > time.Second {
			t.Fatalf("held lease ended %v after its deadline", late)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a lease whose renewals are not confirmed is still believed held after 10s")
	}

	replica.Resume()
	l, err := c.Mutex("a").Lock(ctx)
	if err != nil {
		t.Fatalf("after the replica is back: %v", err)
	}
	_ = l.Unlock(ctx)
}

// TestReplicaAckBadSettings: a bad WithReplicaAck setting is an
// ErrInvalidArgument from every lock call, naming what was wrong.
func TestReplicaAckBadSettings(t *testing.T) {
	s := redistest.Start(t)
	ctx := ctxT(t, 10*time.Second)
	ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": s.Addr()}})
	t.Cleanup(func() { _ = ring.Close() })
	for _, tc := range []struct {
		rdb  redis.UniversalClient
		opt  dlock.Option
		want string
	}{
		{s.Client(t), dlock.WithReplicaAck(0, time.Second), "0 replicas: must be at least 1"},
		{s.Client(t), dlock.WithReplicaAck(1, 0), "timeout 0s: must be at least 1ms"},
		{s.Client(t), dlock.WithReplicaAck(1, 2600*time.Millisecond), "must be at most half the Redis client's ReadTimeout (5s)"},
		{ring, dlock.WithReplicaAck(1, time.Second), "*redis.Ring is not supported"},
	} {
		c := dlock.New(tc.rdb, tc.opt)
		_, err := c.Mutex("x").TryLock(ctx)
		if !errors.Is(err, dlock.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("got %v, want ErrInvalidArgument saying %q", err, tc.want)
		}
		_ = c.Close()
	}
}

// BenchmarkReplicaAck: one goroutine's lock+unlock cycles on a primary with
// one replica, without and with WithReplicaAck(1, ...): what the
// acknowledgement costs per grant.
func BenchmarkReplicaAck(b *testing.B) {
	_, _, pc, _ := primaryAndReplica(b)
	for _, bc := range []struct {
		name string
		opts []dlock.Option
	}{
		{"ack=none", nil},
		{"ack=1", []dlock.Option{dlock.WithReplicaAck(1, time.Second)}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c := dlock.New(pc, bc.opts...)
			defer c.Close()
			serialCycles(b, c.Mutex("bench-ack"))
		})
	}
}

// TestReplicaAckOnCluster: on a Cluster each grant waits for the replica of
// the master that serves the lock's slot: with one master's replica
// stopped, locks in that master's slots fail closed and the others work.
func TestReplicaAckOnCluster(t *testing.T) {
	w := startClusterWake(t, 1)
	ctx := ctxT(t, 60*time.Second)
	c := newDlock(t, w.rdb, dlock.WithReplicaAck(1, time.Second))
	t.Cleanup(func() { _ = c.Close() })
	replicaOf := func(name string) *redistest.Server {
		owner := w.owner(t, name)
		for i, m := range w.masters {
			if m == owner {
				return w.replica[i][0]
			}
		}
		t.Fatalf("no master serves %s", name)
		return nil
	}
	for _, name := range w.names {
		l, err := c.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		r := replicaOf(name).Client(t, readOnly)
		if got, _ := r.HGet(ctx, "dlock:{"+name+"}", "o").Result(); got != l.Token() {
			t.Fatalf("%s: its master's replica names owner %q, want %q", name, got, l.Token())
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	stopped := replicaOf(w.names[0])
	stopped.Pause()
	defer stopped.Resume()
	if _, err := c.Mutex(w.names[0]).TryLock(ctx); !errors.Is(err, dlock.ErrNotReplicated) {
		t.Fatalf("%s, its master's replica stopped: %v, want ErrNotReplicated", w.names[0], err)
	}
	for _, name := range w.names[1:] {
		l, err := c.Mutex(name).TryLock(ctx)
		if err != nil {
			t.Fatalf("%s, on another master: %v", name, err)
		}
		_ = l.Unlock(ctx)
	}
}
