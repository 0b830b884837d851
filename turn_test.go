package dlock_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faults"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/wire"
)

// cycleLocks runs workers goroutines on c, each locking name, holding it
// for hold and unlocking, cycles times or until stop closes; it returns the
// fences granted, and counts every grant in n.
func cycleLocks(t *testing.T, ctx context.Context, c *dlock.Client, name string, workers, cycles int, hold time.Duration, stop <-chan struct{}, n *atomic.Int64) []uint64 {
	t.Helper()
	var mu sync.Mutex
	var fences []uint64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range cycles {
				select {
				case <-stop:
					return
				default:
				}
				l, err := c.Mutex(name).Lock(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				n.Add(1)
				mu.Lock()
				fences = append(fences, l.Fence())
				mu.Unlock()
				time.Sleep(hold)
				if err := l.Unlock(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	slices.Sort(fences)
	return fences
}

// TestTurnGoesOnWhileNobodyWaits: the waiters of one Client pass a
// default-mode lock among themselves, and while nobody waits in the line at
// Redis their Client's turn goes on: the lock does not go back through
// Redis (a release, then an acquire) each time the waiters queued at the
// turn's start have been served. A pass raises the fence by one, a grant
// through Redis to the server clock's microseconds: the fences show which.
func TestTurnGoesOnWhileNobodyWaits(t *testing.T) {
	s := redistest.Start(t)
	c, _ := newClient(t, s)
	// A turn ends only when a waiter arrives after its last record: a
	// few, not one per round of the workers (about cycles of them, which
	// is what this Client had before turns went on: 34 of 120 in one run).
	turnGoesOn(t, c, "turn", 2, "turns did not go on")
}

// turnGoesOn runs four goroutines of c through 30 cycles each of locking
// name, holding it 1 ms and unlocking it, and fails, saying why, if more
// than 30/part of the 120 grants went through Redis (the fences show
// which: a pass raises the fence by one).
func turnGoesOn(t *testing.T, c *dlock.Client, name string, part int, why string) {
	t.Helper()
	ctx := ctxT(t, 60*time.Second)
	const workers, cycles = 4, 30
	var n atomic.Int64
	fences := cycleLocks(t, ctx, c, name, workers, cycles, time.Millisecond, nil, &n)
	if len(fences) != workers*cycles {
		t.Fatalf("%d grants, want %d", len(fences), workers*cycles)
	}
	throughRedis := 0
	for i := 1; i < len(fences); i++ {
		if fences[i] != fences[i-1]+1 {
			throughRedis++
		}
	}
	if throughRedis > cycles/part {
		t.Fatalf("%d of %d grants went through Redis with nobody else waiting: %s", throughRedis, len(fences), why)
	}
	t.Logf("%d of %d grants through Redis", throughRedis, len(fences))
}

// TestTurnGoesOnWhenRecordsAreSlow is TestTurnGoesOnWhileNobodyWaits with
// every pass's record slower than a hold: each holder unlocks, and passes
// the lock on, before the record of the pass that made it has landed. The
// record's finding that nobody waits at Redis must still reach the holder
// the lock has gone on to, and one that is unlocking: it once reached only
// a holder still holding, so the turn ended at about every round of the
// workers (22 of 120 grants through Redis in one run).
func TestTurnGoesOnWhenRecordsAreSlow(t *testing.T) {
	s := redistest.Start(t)
	c, _ := faultyClient(t, s, faults.Rule{Script: "pass", Kind: faults.DelaySend, P: 1, Min: 3 * time.Millisecond, Max: 3 * time.Millisecond})
	turnGoesOn(t, c, "turn-slow-records", 3, "a slow record's finding was lost")
}

// TestTurnGoesOnWhileItsRecordsCanLand: with records slower than a hold
// and many waiters, every holder passes the lock on ahead of its own
// record, so the records in flight pile up behind one another while each
// new lease lives on the deadline it inherited from the last holder whose
// record had landed. Since a record that finds nobody waiting at Redis
// raises the turn of every lease the lock went on to, that chain no longer
// ends with its turn, only with that deadline: a pass must leave its
// record and those ahead of it time to land before it. Once it did not:
// passes went on while the deadline allowed one record more, and the
// records still in flight behind them failed (34 to 167 of about 800
// leases in runs of this test: Unlocks saying the pass could not be
// recorded in time, some of them ErrLockLost), though Redis answered
// every call within milliseconds.
func TestTurnGoesOnWhileItsRecordsCanLand(t *testing.T) {
	s := redistest.Start(t)
	c, _ := faultyClient(t, s, faults.Rule{Script: "pass", Kind: faults.DelaySend, P: 1, Min: 2 * time.Millisecond, Max: 2 * time.Millisecond})
	ctx := ctxT(t, 30*time.Second)
	const workers, name = 60, "turn-chain"
	m := c.Mutex(name, dlock.TTL(300*time.Millisecond))
	stop := time.Now().Add(2 * time.Second)
	var grants, failed atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(stop) {
				l, err := m.Lock(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				grants.Add(1)
				time.Sleep(time.Millisecond)
				if err := l.Context().Err(); err != nil {
					if failed.Add(1) <= 3 {
						t.Errorf("lease ended while held: %v", context.Cause(l.Context()))
					}
				}
				if err := l.Unlock(ctx); err != nil {
					if failed.Add(1) <= 3 {
						t.Errorf("Unlock: %v", err)
					}
				}
			}
		}()
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d leases failed with Redis answering at once", n, grants.Load())
	}
	rdb := s.Client(t)
	if o := owner(ctx, rdb, name); o != "" {
		t.Fatalf("the lock is left owned at Redis (%q)", o)
	}
	t.Logf("%d grants", grants.Load())
}

// TestPassesAheadOfABurstLand: sixty Locks of one Client at once, each
// holding for a millisecond, with every pass record 20ms late: the turn
// that the first grant begins covers the waiters queued by then, and each
// passes the lock on ahead of its record. Every pass must leave the
// records ahead of it time to land within the deadline the new lease
// inherits; it once left one record's margin only, and the records at the
// end of the chain failed (30 of 60 Unlocks in one run).
func TestPassesAheadOfABurstLand(t *testing.T) {
	s := redistest.Start(t)
	c, _ := faultyClient(t, s, faults.Rule{Script: "pass", Kind: faults.DelaySend, P: 1, Min: 20 * time.Millisecond, Max: 20 * time.Millisecond})
	ctx := ctxT(t, 30*time.Second)
	const waiters, name = 60, "pass-burst"
	m := c.Mutex(name, dlock.TTL(600*time.Millisecond))
	var failed atomic.Int64
	var wg sync.WaitGroup
	for range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := m.Lock(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			time.Sleep(time.Millisecond)
			if err := l.Unlock(ctx); err != nil {
				if failed.Add(1) <= 3 {
					t.Errorf("Unlock: %v", err)
				}
			}
		}()
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d Unlocks failed", n, waiters)
	}
	if o := owner(ctx, s.Client(t), name); o != "" {
		t.Fatalf("the lock is left owned at Redis (%q)", o)
	}
}

// TestTurnEndsForAnotherClient: a Client whose waiters keep the lock among
// themselves still lets a waiter of another Client in: once that waiter is
// in the line at Redis, the next record sees it and the turn stops growing,
// so it is served after about one turn of the first Client's waiters, not
// when they stop.
func TestTurnEndsForAnotherClient(t *testing.T) {
	s := redistest.Start(t)
	cs, _ := newClients(t, s, 2)
	turnEndsFor(t, s, cs[0], cs[1], "turn-b")
}

// TestTurnEndsForASlowClient is TestTurnEndsForAnotherClient with the other
// Client's looks 30ms late, as on a loaded machine: until its look takes a
// place in line, nobody waits there and the first Client's turn goes on
// (about fifteen grants here, as many as when turns ended at their start's
// waiters), so the turn is counted from that place, not from the call.
func TestTurnEndsForASlowClient(t *testing.T) {
	s := redistest.Start(t)
	a, _ := newClient(t, s)
	b, _ := faultyClient(t, s, faults.Rule{Script: "acquire", Kind: faults.DelaySend, P: 1, Min: 30 * time.Millisecond, Max: 30 * time.Millisecond})
	turnEndsFor(t, s, a, b, "turn-slow")
}

// TestTurnEndsForAnotherClientWhenRecordsAreSlow is
// TestTurnEndsForAnotherClient with the first Client's pass records 5ms
// late, longer than a hold: its holders pass the lock on ahead of their
// records, and a record finding nobody at Redis raises the turn of all of
// them. Once the other Client's waiter is in line, the records after it
// see it, and that chain's turn stops growing too.
func TestTurnEndsForAnotherClientWhenRecordsAreSlow(t *testing.T) {
	s := redistest.Start(t)
	a, _ := faultyClient(t, s, faults.Rule{Script: "pass", Kind: faults.DelaySend, P: 1, Min: 5 * time.Millisecond, Max: 5 * time.Millisecond})
	b, _ := newClient(t, s)
	turnEndsFor(t, s, a, b, "turn-slow-records-b")
}

// turnEndsFor runs three waiters of a passing the lock name among
// themselves, then a Lock of b: from the moment b's waiter has its place in
// the line at Redis, a grants it a turn's worth of grants at most.
func turnEndsFor(t *testing.T, s *redistest.Server, a, b *dlock.Client, name string) {
	t.Helper()
	ctx := ctxT(t, 30*time.Second)
	rdb := s.Client(t)
	const workers = 3
	var n atomic.Int64
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		cycleLocks(t, ctx, a, name, workers, 2000, 2*time.Millisecond, stop, &n)
	}()
	waitFor(t, ctx, "the first Client's waiters passing the lock", func() bool { return n.Load() > 20 })
	// The grants made once b's place is in the line (not a's: a head of a
	// that looked while a record was on its way found a fence it had not
	// noted yet, and waits in line too) (-1: not seen yet; a
	// turn that ends before the look below sees the place counts none).
	inLine := atomic.Int64{}
	inLine.Store(-1)
	returned := make(chan struct{})
	looked := make(chan struct{})
	go func() {
		defer close(looked)
		for {
			select {
			case <-returned:
				return
			default:
			}
			if placed(ctx, rdb, name, b) {
				inLine.Store(n.Load())
				return
			}
			time.Sleep(200 * time.Microsecond)
		}
	}()
	before := n.Load()
	l, err := b.Mutex(name).Lock(ctx)
	after := n.Load()
	close(returned)
	<-looked
	close(stop)
	if err == nil {
		err = l.Unlock(ctx)
	}
	<-done
	if err != nil {
		t.Fatal(err)
	}
	from := inLine.Load()
	if from < 0 {
		from = after
	}
	// One turn (the waiters queued when it was last raised, each Lock a
	// grant) and the turn that was under way: a few grants of the first
	// Client, however long its waiters would go on.
	if got := after - from; got > 4*workers {
		t.Fatalf("the other Client's waiter, in line, waited for %d grants of the first Client's %d waiters: its turn did not end", got, workers)
	}
	t.Logf("the other Client waited for %d grants since its Lock call, %d since its place in line", after-before, after-from)
}

// placed reports whether a waiter of c has a place in the line for name at
// Redis: the waiters' entries name their Client's hand-over channel.
func placed(ctx context.Context, rdb *redis.Client, name string, c *dlock.Client) bool {
	k := wire.KeysOf(wire.DefaultPrefix, name)
	for _, v := range rdb.HGetAll(ctx, k.Waiters).Val() {
		if strings.HasSuffix(v, wire.InfixHandOver+dlock.ClientID(c)) {
			return true
		}
	}
	return false
}
