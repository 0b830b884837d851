package dlock_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestPassLostLease: a holder whose lease was lost without its knowing (the
// key deleted behind its back) passes the lock to its Client's next waiter:
// the pass is refused at Redis, the passed lease ends with ErrLockLost, and
// both Unlocks say so. Nothing is left owned at Redis. (Or the waiter took
// the pass only after the refusal came back: then it starts over with a
// fresh token and takes the free lock itself.)
func TestPassLostLease(t *testing.T) {
	s := redistest.Start(t)
	cs, rdb := newClients(t, s, 2)
	ctx := ctxT(t, 20*time.Second)
	a, leases := inTurn(t, ctx, cs, rdb, "p")
	if err := rdb.Del(ctx, "dlock:{p}").Err(); err != nil {
		t.Fatal(err)
	}
	if err := a.Unlock(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Unlock of a lease lost before it passed the lock on: %v, want ErrLockLost", err)
	}
	w := <-leases
	if w == nil {
		t.FailNow()
	}
	if w.Fence() != a.Fence()+1 {
		// Not the pass: the waiter's own grant, with a fresh token.
		t.Logf("the waiter took the pass after its refusal and started over (fence %d after %d)", w.Fence(), a.Fence())
		if o := owner(ctx, rdb, "p"); o != w.Token() || w.Fence() <= a.Fence() {
			t.Fatalf("the waiter's lease after it started over: owner %q, token %q, fence %d after %d", o, w.Token(), w.Fence(), a.Fence())
		}
		if err := w.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if o, err := rdb.HGet(ctx, "dlock:{p}", "o").Result(); err != redis.Nil {
			t.Fatalf("owner left at Redis: %q %v", o, err)
		}
		return
	}
	select {
	case <-w.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the passed lease of a lost lock did not end")
	}
	if cause := context.Cause(w.Context()); !errors.Is(cause, dlock.ErrLockLost) {
		t.Fatalf("passed lease ended with %v, want ErrLockLost", cause)
	}
	if err := w.Unlock(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Unlock of the lost passed lease: %v, want ErrLockLost", err)
	}
	if o, err := rdb.HGet(ctx, "dlock:{p}", "o").Result(); err != redis.Nil {
		t.Fatalf("owner left at Redis: %q %v", o, err)
	}
	// The passed lease's place in line goes too: a later release must not
	// hand the lock to it (it would stall the lock for seconds).
	waitFor(t, ctx, "the passed lease's place in line gone", func() bool {
		return rdb.Exists(ctx, "dlock:{p}:q", "dlock:{p}:w").Val() == 0
	})
}

// inTurn sets up a pass: cs[0] holds name while two waiters of cs[1] queue;
// cs[0] unlocks, so the first waiter gets the lock through Redis (lease a)
// and its Client's turn covers the second, which is now asleep in line
// behind it. The second waiter's Lock result comes on leases (nil: failed).
func inTurn(t *testing.T, ctx context.Context, cs []*dlock.Client, rdb *redis.Client, name string, opts ...dlock.LockOption) (a *dlock.Lease, leases <-chan *dlock.Lease) {
	t.Helper()
	key := "dlock:{" + name + "}"
	first, err := cs[0].Mutex(name, opts...).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *dlock.Lease, 2)
	lock := func() {
		l, err := cs[1].Mutex(name, opts...).Lock(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}
	go lock()
	waitLine(t, ctx, rdb, key, 1) // the first waiter is in line at Redis
	go lock()
	waitFor(t, ctx, "the second waiter queued behind the first", func() bool {
		n, _ := dlock.QueuedLocally(cs[1], name)
		return n == 2
	})
	if err := first.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	a = <-got // handed over through Redis: its turn covers the second waiter
	if a == nil {
		t.FailNow()
	}
	waitFor(t, ctx, "the second waiter asleep in line", func() bool {
		_, asleep := dlock.QueuedLocally(cs[1], name)
		return asleep
	})
	return a, got
}

// TestPassStress: goroutines of two Clients lock one name, many with
// deadlines that end while they wait, so that waiters give up at the moment
// the lock is passed to them. Never two holders, every Unlock succeeds,
// fences increase in grant order, passes happened (fence + 1), and the lock
// is free at the end.
func TestPassStress(t *testing.T) {
	s := redistest.Start(t)
	cs, rdb := newClients(t, s, 2)
	ctx := ctxT(t, 30*time.Second)
	var (
		inside atomic.Int32
		mu     sync.Mutex
		fences []uint64
		gaveUp atomic.Int32
	)
	end := time.Now().Add(3 * time.Second)
	err := inGoroutines(12, func(g int) error {
		m := cs[g%2].Mutex("stress")
		r := rand.New(rand.NewPCG(uint64(g), 7))
		for i := 0; i < 150 && time.Now().Before(end); i++ {
			wait := 2 * time.Second
			if r.IntN(2) == 0 {
				wait = time.Duration(200+r.IntN(3000)) * time.Microsecond
			}
			lctx, cancel := context.WithTimeout(ctx, wait)
			l, err := m.Lock(lctx)
			cancel()
			if err != nil {
				if !errors.Is(err, context.DeadlineExceeded) {
					return err
				}
				gaveUp.Add(1)
				continue
			}
			if !inside.CompareAndSwap(0, 1) {
				return errors.New("two holders at once")
			}
			mu.Lock()
			fences = append(fences, l.Fence())
			mu.Unlock()
			time.Sleep(time.Duration(100+r.IntN(300)) * time.Microsecond) // load: hold time
			inside.Store(0)
			if err := l.Unlock(ctx); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	passes := 0
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Fatalf("fence %d granted after %d", fences[i], fences[i-1])
		}
		if fences[i] == fences[i-1]+1 {
			passes++
		}
	}
	t.Logf("%d grants, %d of them passed within a Client; %d waits gave up", len(fences), passes, gaveUp.Load())
	if passes == 0 || gaveUp.Load() == 0 {
		t.Fatal("the stress did not exercise passes and giving up")
	}
	if o, err := rdb.HGet(ctx, "dlock:{stress}", "o").Result(); err != redis.Nil {
		t.Fatalf("owner left at Redis after every holder unlocked: %q %v", o, err)
	}
	l, err := cs[0].Mutex("stress").TryLock(ctx)
	if err != nil {
		t.Fatalf("the lock is not free at the end: %v", err)
	}
	_ = l.Unlock(ctx)
}

// TestPassNotOverARedisHandOver: a holder whose lock was lost behind its
// back (deleted, then taken and released by another Client, after which the
// holder's own waiter got it through Redis) passes nothing over that: its
// Unlock says ErrLockLost and the waiter's lease, granted by Redis, stays
// held with Redis's fence.
func TestPassNotOverARedisHandOver(t *testing.T) {
	s := redistest.Start(t)
	cs, rdb := newClients(t, s, 2)
	ctx := ctxT(t, 20*time.Second)
	a, leases := inTurn(t, ctx, cs, rdb, "q")
	if err := rdb.Del(ctx, "dlock:{q}").Err(); err != nil {
		t.Fatal(err)
	}
	other, err := cs[0].Mutex("q").TryLock(ctx)
	if err != nil {
		t.Fatalf("the deleted lock was not free: %v", err)
	}
	if err := other.Unlock(ctx); err != nil { // hands it to the waiter in line
		t.Fatal(err)
	}
	w := <-leases
	if w == nil {
		t.FailNow()
	}
	if err := a.Unlock(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Unlock of the lost lease: %v, want ErrLockLost", err)
	}
	if w.Fence() <= other.Fence() {
		t.Fatalf("waiter's fence %d not above the other holder's %d", w.Fence(), other.Fence())
	}
	if _, err := w.TTL(ctx); err != nil {
		t.Fatalf("the waiter's lease from Redis was disturbed: %v", err)
	}
	if o := rdb.HGet(ctx, "dlock:{q}", "o").Val(); o != w.Token() {
		t.Fatalf("owner %q, want the waiter's token", o)
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestPassCloseRace: Close of a Client whose holders are passing a lock
// among its waiters (and, in every third round, handing it over through
// Redis in Fair mode), at a random moment, leaves nothing locked once every
// call has returned: not a lock taken as Close ran, nor one passed or
// handed to a waiter. Lock ends with ErrClosed; Unlock with nil, ErrClosed
// (also for a pass that Close cut short) or ErrLockLost.
func TestPassCloseRace(t *testing.T) {
	s := redistest.Start(t)
	rdb := s.Client(t)
	ctx := ctxT(t, 60*time.Second)
	r := rand.New(rand.NewPCG(3, 11))
	end := time.Now().Add(8 * time.Second)
	passes := 0
	for i := 0; i < 40 && time.Now().Before(end); i++ {
		c := newDlock(t, rdb)
		name := "close" + string(rune('a'+i%26)) + string(rune('a'+i/26))
		var fences sync.Map
		stop := time.Duration(2+r.IntN(20)) * time.Millisecond
		time.AfterFunc(stop, func() { _ = c.Close() })
		err := inGoroutines(6, func(g int) error {
			opts := []dlock.LockOption{dlock.TTL(30 * time.Second)}
			if i%3 == 2 {
				opts = append(opts, dlock.Fair()) // hand-overs from Redis only
			}
			m := c.Mutex(name, opts...)
			r := rand.New(rand.NewPCG(uint64(i), uint64(g)))
			for {
				l, err := m.Lock(ctx)
				if errors.Is(err, dlock.ErrClosed) {
					return nil
				}
				if err != nil {
					return err
				}
				fences.Store(l.Fence(), true)
				time.Sleep(time.Duration(r.IntN(200)) * time.Microsecond) // load: hold time
				if err := l.Unlock(ctx); err != nil && !errors.Is(err, dlock.ErrClosed) && !errors.Is(err, dlock.ErrLockLost) {
					return err
				}
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		_ = c.Close()
		fences.Range(func(f, _ any) bool {
			if _, ok := fences.Load(f.(uint64) - 1); ok {
				passes++
			}
			return true
		})
		if o, err := rdb.HGet(ctx, "dlock:{"+name+"}", "o").Result(); err != redis.Nil {
			t.Logf("lock key %v, TTL %v", rdb.HGetAll(ctx, "dlock:{"+name+"}").Val(), rdb.PTTL(ctx, "dlock:{"+name+"}").Val())
			var fs []uint64
			fences.Range(func(f, _ any) bool { fs = append(fs, f.(uint64)); return true })
			t.Logf("fences %v", fs)
			t.Fatalf("round %d (Close after %v): owner %q left at Redis after Close (%v)", i, stop, o, err)
		}
	}
	if passes == 0 {
		t.Fatal("no lock was passed within the Client: the race was not exercised")
	}
	t.Logf("%d passes", passes)
}

// TestPassRecordLate: Redis is paused as a holder passes the lock, until
// past the inherited deadline, so the record of the pass gives up. The passed
// lease ends with ErrLockLost at that deadline, and once Redis resumes the
// lock is free at once: neither the old token (whose key the test made
// outlive the client's deadline, as a server clock running slow would) nor
// the new one (if the given-up record still lands) keeps it for a TTL.
func TestPassRecordLate(t *testing.T) {
	s := redistest.Start(t)
	cs, rdb := newClients(t, s, 2)
	ctx := ctxT(t, 30*time.Second)
	const ttl = 2 * time.Second
	const key = "dlock:{late}"
	a, leases := inTurn(t, ctx, cs, rdb, "late", dlock.TTL(ttl), dlock.NoRenew())
	if err := rdb.PExpire(ctx, key, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	s.Pause()
	resumed := false
	defer func() {
		if !resumed {
			s.Resume()
		}
	}()
	unlocked := make(chan error, 1)
	go func() { unlocked <- a.Unlock(ctx) }()
	w := <-leases
	if w == nil {
		t.FailNow()
	}
	if w.Fence() != a.Fence()+1 {
		t.Fatalf("fence %d, want %d: not passed", w.Fence(), a.Fence()+1)
	}
	select {
	case <-w.Context().Done():
	case <-time.After(2 * ttl):
		t.Fatal("the passed lease outlived its inherited deadline")
	}
	if cause := context.Cause(w.Context()); !errors.Is(cause, dlock.ErrLockLost) {
		t.Fatalf("passed lease ended with %v, want ErrLockLost", cause)
	}
	// Redis resumes once the record has given up (the passer's holding is
	// settled as lost): a record call answered before that would land and
	// succeed. Without ContextTimeoutEnabled, go-redis ends that call at its
	// own timeout, a few seconds after it was sent, not at the deadline.
	waitFor(t, ctx, "the record of the pass given up", func() bool { return dlock.Settled(a) })
	s.Resume()
	resumed = true
	free := time.Now().Add(ttl / 2) // pass.lua would give the new owner a full TTL
	for {
		o, err := rdb.HGet(ctx, key, "o").Result()
		if err == redis.Nil {
			break
		}
		if time.Now().After(free) {
			t.Fatalf("owner %q (%v) still at Redis %v after resuming (PTTL %v)", o, err, ttl/2, rdb.PTTL(ctx, key).Val())
		}
		time.Sleep(10 * time.Millisecond) // poll; the ttl/2 bound is what is tested
	}
	// The passer held the lock until it unlocked: its Unlock reports that
	// the pass failed, not a loss.
	if err := <-unlocked; err == nil || errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("the passer's Unlock: %v, want the record's failure, not ErrLockLost", err)
	}
	if err := a.Unlock(ctx); err != nil {
		t.Fatalf("the passer's Unlock again: %v, want nil (given back)", err)
	}
	if err := w.Unlock(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Unlock of the lost passed lease: %v, want ErrLockLost", err)
	}
}
