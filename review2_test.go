package dlock_test

// Review 2 (adversarial read of the engine and of TestInterleavings): each
// test reproduces one defect against a real redis-server and fails on the
// code it was written against (dd7789b). See the test comments for the
// interleaving.

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faults"
	"github.com/dlock-go/dlock/internal/redistest"
)

// TestShorterExtendInFlight: Extend to a TTL shorter than what the
// lease has left runs at Redis at once, but its reply is slow. Until the
// reply came, the lease was believed valid on its old deadline, while
// Redis expired it the new TTL after the send and another Client took it:
// two holders believed valid at once (found by TestInterleavings/rw, seed
// 157106698621: a writer's Extend to 106ms with its reply 137ms late, and
// readers let in meanwhile). A request that may shorten the lease must
// bound the deadline from its send on, before any reply.
func TestShorterExtendInFlight(t *testing.T) {
	for _, kind := range []string{"mutex", "semaphore"} {
		t.Run(kind, func(t *testing.T) {
			s := redistest.Start(t)
			script := "extend"
			if kind == "semaphore" {
				script = "sem.e"
			}
			c, in := faultyClient(t, s, faults.Rule{Script: script, Via: faults.Single, Kind: faults.DelayReply, Calls: []int{1}, Min: 3 * time.Second, Max: 3 * time.Second})
			other, _ := newClient(t, s)
			ctx := ctxT(t, 20*time.Second)
			lock := func(c *dlock.Client) func(context.Context) (*dlock.Lease, error) {
				if kind == "semaphore" {
					return func(ctx context.Context) (*dlock.Lease, error) {
						return c.Semaphore("short-extend", 1, dlock.TTL(5*time.Second)).Acquire(ctx, 1)
					}
				}
				return c.Mutex("short-extend", dlock.TTL(5*time.Second)).Lock
			}
			l, err := lock(c)(ctx)
			if err != nil {
				t.Fatal(err)
			}
			extended := make(chan error, 1)
			go func() { extended <- l.Extend(ctx, 200*time.Millisecond) }()
			if !in.WaitInFlight(2*time.Second, func(k faults.Call) bool { return k.Script == script && k.Has(l.Token()) }) {
				t.Fatal("the Extend was never sent")
			}
			// Redis runs the Extend at once: the lock expires 200ms later and
			// the other Client gets it, long before the Extend's reply.
			o, err := lock(other)(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if in.InFlight(func(k faults.Call) bool { return k.Script == script }) && stillValid(l) {
				t.Errorf("another Client holds the lock while the lease whose Extend to 200ms is in flight is still believed valid")
			}
			_ = o.Unlock(ctx)
			<-extended
			_ = l.Unlock(ctx)
		})
	}
}

// TestRenewalWithAStaleTTL: the watchdog read the TTL a holding
// renews to, then took the holding's request slot in a second step. An
// Extend that ran in between (slot free, reply applied) made the lease
// longer, and the renewal then went out with the old, shorter TTL: Redis
// expired the lock that TTL after the renewal ran, while the lease was
// believed valid on the Extend's deadline until the renewal's reply came
// (found by TestInterleavings/fair, seed 630750714108: a renewal to 84ms
// sent after a longer proof, its reply 151ms late, another Client in). The
// window is a few instructions wide: a test hook on the watchdog, after it
// read the TTL, runs the Extend there (and waits for it a while).
func TestRenewalWithAStaleTTL(t *testing.T) {
	s := redistest.Start(t)
	c, in := faultyClient(t, s, faults.Rule{Script: "extend", Via: faults.Batch, Kind: faults.DelayReply, Calls: []int{1}, Min: 3 * time.Second, Max: 3 * time.Second})
	other, _ := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	extended := make(chan error, 1)
	var once sync.Once
	dlock.SetRenewalHook(c, func(l *dlock.Lease) {
		once.Do(func() {
			done := make(chan error, 1)
			go func() { done <- l.Extend(ctx, 10*time.Second) }()
			select {
			case err := <-done:
				extended <- err
			case <-time.After(500 * time.Millisecond): // it waits for the renewal's slot
				go func() { extended <- <-done }()
			}
		})
	})
	l, err := c.Mutex("stale-ttl", dlock.TTL(300*time.Millisecond)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !in.WaitInFlight(5*time.Second, func(k faults.Call) bool { return k.Script == "extend" && k.Via == faults.Batch }) {
		t.Fatal("no renewal was sent")
	}
	// If the renewal carries 300ms, the lock expires 300ms after it ran,
	// long before its reply, and the other Client gets it.
	octx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	o, err := other.Mutex("stale-ttl").Lock(octx)
	if err == nil {
		if in.InFlight(func(k faults.Call) bool { return k.Script == "extend" && k.Via == faults.Batch }) && stillValid(l) {
			t.Errorf("another Client holds the lock while the lease is believed valid (a renewal with the TTL from before an Extend is in flight)")
		}
		_ = o.Unlock(ctx)
	}
	<-extended
	_ = l.Unlock(ctx)
}

// TestReleaseResentAfterADroppedConnection: the connection drops right after a
// release was written (Redis runs it). go-redis sends a command again by
// itself after such an error, so the release ran twice, and the second run
// found the permits no longer the lease's: Unlock reported ErrLockLost for
// a lease it had released (a Semaphore or RWMutex every time; a Mutex when
// the lock changed hands during go-redis's retry backoff). Only dlock may
// resend a release: it then knows that "not the owner" may answer its own
// earlier run.
func TestReleaseResentAfterADroppedConnection(t *testing.T) {
	s := redistest.Start(t)
	c, in := faultyClient(t, s, faults.Rule{Script: "sem.r", Kind: faults.Cut, Calls: []int{1, 2}})
	_, rdb := newClient(t, s)
	ctx := ctxT(t, 10*time.Second)
	for _, tc := range []struct {
		name string
		lock func() (*dlock.Lease, error)
	}{
		{"semaphore", func() (*dlock.Lease, error) { return c.Semaphore("resent-semaphore", 2).Acquire(ctx, 1) }},
		{"rwmutex", func() (*dlock.Lease, error) { return c.RWMutex("resent-rwmutex").Lock(ctx) }},
	} {
		l, err := tc.lock()
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Errorf("%s: Unlock after a connection dropped under its release: %v, want nil", tc.name, err)
		}
		if u := rdb.HGet(ctx, "dlock:{resent-"+tc.name+"}", "u").Val(); u != "0" {
			t.Errorf("%s: %s permits still used at Redis after Unlock", tc.name, u)
		}
	}
	if n := in.Stats()["sem.r cut single"]; n != 2 {
		t.Fatalf("%d releases cut, want 2", n)
	}
}

// TestUnrecordedPassIsNoLoss: a holder unlocks and passes the lock
// to a waiter of its Client, and the pass cannot be recorded at Redis
// before the holder's deadline (every record fails before it is sent). The
// holder held the lock until its Unlock, before its deadline, and the lock
// is given back: its Unlock must not say ErrLockLost ("someone else may
// have held the lock meanwhile"), which it did; it reports that the pass
// failed, as a release whose outcome is unknown does. The waiter's lease,
// never recorded, is the one that is lost.
func TestUnrecordedPassIsNoLoss(t *testing.T) {
	s := redistest.Start(t)
	plain, _ := newClient(t, s)
	c, in := faultyClient(t, s, faults.Rule{Script: "pass", Kind: faults.FailSend, P: 1, Min: 50 * time.Millisecond, Max: 50 * time.Millisecond})
	_, rdb := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	a, passed := inTurn(t, ctx, []*dlock.Client{plain, c}, rdb, "unrecorded", dlock.TTL(time.Second), dlock.NoRenew())
	err := a.Unlock(ctx)
	w := <-passed
	if w == nil {
		t.FailNow()
	}
	if w.Fence() != a.Fence()+1 {
		t.Fatalf("fence %d after %d: not passed", w.Fence(), a.Fence())
	}
	if in.Stats()["pass fail-send single"] == 0 {
		t.Fatal("no record was attempted")
	}
	if err == nil || errors.Is(err, dlock.ErrLockLost) {
		t.Errorf("Unlock of the passing lease: %v; want the record's failure, not a loss: it held the lock until it unlocked", err)
	}
	<-w.Context().Done()
	if cause := context.Cause(w.Context()); !errors.Is(cause, dlock.ErrLockLost) {
		t.Errorf("the unrecorded lease ended with %v, want ErrLockLost", cause)
	}
	waitFor(t, ctx, "the lock free at Redis", func() bool { return owner(ctx, rdb, "unrecorded") == "" })
}

// TestDeadlineAtRedisResolution: Redis counts lease deadlines in
// whole milliseconds. sem.lua took a holding for expired once the server
// clock in ms reached its deadline (clock at the grant, truncated to the
// ms, plus the TTL): up to a millisecond before the grant's run plus the
// TTL, while the client's deadline keeps only 1% of the TTL in hand, less
// than 1ms below a 100ms TTL. And a TTL with a fraction of a millisecond
// was sent truncated but believed whole, on every primitive. Either way
// Redis gave the lease up (a prune would hand its permits on) while its
// holder still believed it valid: here TTL asks Redis right up to the
// client's deadline, and a reply "no longer yours" that comes back before
// that deadline is the violation. (A timing window less than a
// millisecond wide: the test finds it in most leases when it is there, and
// can never see one that is not.)
func TestDeadlineAtRedisResolution(t *testing.T) {
	s := redistest.Start(t)
	c, _ := newClient(t, s)
	ctx := ctxT(t, 60*time.Second)
	for _, tc := range []struct {
		name string
		lock func() (*dlock.Lease, error)
	}{
		{"semaphore, TTL 60ms", func() (*dlock.Lease, error) {
			return c.Semaphore("ms-sem", 1, dlock.TTL(60*time.Millisecond), dlock.NoRenew()).Acquire(ctx, 1)
		}},
		{"mutex, TTL 60.9ms", func() (*dlock.Lease, error) {
			return c.Mutex("ms-mutex", dlock.TTL(60*time.Millisecond+900*time.Microsecond), dlock.NoRenew()).Lock(ctx)
		}},
	} {
		early := 0
		for range 40 {
			l, err := tc.lock()
			if err != nil {
				t.Fatal(err)
			}
			deadline := dlock.Deadline(l)
			time.Sleep(time.Until(deadline) - 3*time.Millisecond) // then ask Redis until the deadline
			for time.Now().Before(deadline) {
				_, err := l.TTL(ctx)
				if errors.Is(err, dlock.ErrLockLost) {
					if time.Now().Before(deadline) {
						early++
					}
					break
				}
			}
			_ = l.Unlock(ctx)
		}
		if early > 0 {
			t.Errorf("%s: in %d of 40 leases Redis had given the lease up while its holder still believed it valid", tc.name, early)
		}
	}
}
