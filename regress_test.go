package dlock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faults"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/wire"
	"github.com/redis/go-redis/v9"
)

// faultyClient is a dlock Client whose Redis client injects faults by rules.
// The server has every script loaded first, so that a fault never meets a
// NOSCRIPT reply instead of the script's work.
func faultyClient(t testing.TB, s *redistest.Server, rules ...faults.Rule) (*dlock.Client, *faults.Injector) {
	t.Helper()
	return reviewClient(t, s, 5*time.Second, nil, rules...)
}

// loadScripts loads every script of the engine on rdb's server, so that a
// fault never meets a NOSCRIPT reply instead of the script's work.
func loadScripts(t testing.TB, rdb *redis.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, sc := range wire.Scripts() {
		if err := rdb.ScriptLoad(ctx, sc.Src).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// slowRecords returns Clients on s for inTurn: a plain one, and one whose
// pass records are sent d late; and a go-redis client to look with.
func slowRecords(t *testing.T, s *redistest.Server, d time.Duration) ([]*dlock.Client, *faults.Injector, *redis.Client) {
	t.Helper()
	plain, _ := newClient(t, s)
	c, in := faultyClient(t, s, faults.Rule{Script: "pass", Kind: faults.DelaySend, P: 1, Min: d, Max: d})
	_, rdb := newClient(t, s)
	return []*dlock.Client{plain, c}, in, rdb
}

// stillValid reports whether l's holder would still rely on it.
func stillValid(l *dlock.Lease) bool { return l.Context().Err() == nil }

// endedBeforeTaken waits until other takes the lock name (once it expires
// at Redis) and fails the test if l is still believed valid then.
func endedBeforeTaken(t *testing.T, ctx context.Context, other *dlock.Client, name string, l *dlock.Lease) {
	t.Helper()
	o, err := other.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer o.Unlock(ctx)
	if stillValid(l) {
		t.Fatal("another Client got the lock while the lease was still believed valid")
	}
}

// TestConcurrentUnlocksOfAPassedLease (review defect 1): two Unlock calls
// at once on a lease whose Unlock passes the lock to a waiter of its own
// Client, with the pass record slow. The second call must not release the
// lock at Redis under the old token (which would hand it to another
// Client's waiter while the passed lease holds it): both calls return nil
// and the other Client gets the lock only after the passed lease unlocks.
func TestConcurrentUnlocksOfAPassedLease(t *testing.T) {
	s := redistest.Start(t)
	plain, _ := newClient(t, s)
	c, _ := faultyClient(t, s, faults.Rule{Script: "pass", Kind: faults.DelaySend, P: 1, Min: 100 * time.Millisecond, Max: 100 * time.Millisecond})
	other, rdb := newClient(t, s)
	ctx := ctxT(t, 60*time.Second)
	for round := 0; round < 12; round++ {
		name := "unlock2x-" + string(rune('a'+round))
		a, passed := inTurn(t, ctx, []*dlock.Client{plain, c}, rdb, name)
		// Another Client waits in line at Redis too (c's head waits beside
		// a, its own Client's holder, out of the line).
		got := async(t, ctx, other.Mutex(name).Lock)
		waitLine(t, ctx, rdb, "dlock:{"+name+"}", 1)

		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i := range errs {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = a.Unlock(ctx) }()
		}
		wg.Wait()
		w := <-passed
		if w == nil {
			t.FailNow()
		}
		for _, err := range errs {
			if err != nil {
				t.Fatalf("round %d: concurrent Unlock: %v", round, err)
			}
		}
		time.Sleep(150 * time.Millisecond) // let a wrong release hand the lock to the other Client
		if !stillValid(w) {
			t.Fatalf("round %d: the passed lease ended: %v", round, context.Cause(w.Context()))
		}
		done := make(chan struct{})
		go func() { _, _ = got(); close(done) }()
		select {
		case <-done:
			if l, _ := got(); l != nil {
				t.Fatalf("round %d: another Client got the lock while the passed lease held it", round)
			}
		default:
		}
		if err := w.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		o, err := got()
		if err != nil {
			t.Fatal(err)
		}
		_ = o.Unlock(ctx)
	}
}

// TestRetriedPassRecordDatesFromFirstSend (review defect 2): the first
// record of a pass runs but its reply is lost; the retry comes late. The
// passed lease must end no later than the lock expires at Redis, which
// another Client then takes.
func TestRetriedPassRecordDatesFromFirstSend(t *testing.T) {
	s := redistest.Start(t)
	plain, _ := newClient(t, s)
	c, _ := faultyClient(t, s,
		faults.Rule{Script: "pass", Kind: faults.LoseReply, Calls: []int{1}},
		// The retries fail before reaching Redis for a while: the one that
		// lands is sent about 1.2 s after the first.
		faults.Rule{Script: "pass", Kind: faults.FailSend, Calls: []int{2, 3, 4}, Min: 400 * time.Millisecond, Max: 400 * time.Millisecond},
	)
	other, rdb := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	ttl := dlock.TTL(2 * time.Second)
	a, passed := inTurn(t, ctx, []*dlock.Client{plain, c}, rdb, "retried", ttl, dlock.NoRenew())
	w, _ := unlockPassing(t, ctx, a, passed)
	endedBeforeTaken(t, ctx, other, "retried", w)
}

// TestRenewalInFlightWhileExtend (review defect 3): a renewal with the old
// TTL is in flight (sent late) when Extend sets a longer one, and Extend's
// reply comes back last. The lease must never be believed valid past its
// expiry at Redis, whichever lands last: were the two not made one at a
// time, the renewal would run last at Redis (the lock expiring 900ms after
// it) and Extend's reply, applied last, would date the lease 30s on.
func TestRenewalInFlightWhileExtend(t *testing.T) {
	s := redistest.Start(t)
	c, in := faultyClient(t, s,
		faults.Rule{Script: "extend", Via: faults.Batch, Kind: faults.DelaySend, Calls: []int{1}, Min: 300 * time.Millisecond, Max: 300 * time.Millisecond},
		faults.Rule{Script: "extend", Via: faults.Single, Kind: faults.DelayReply, Calls: []int{1}, Min: 400 * time.Millisecond, Max: 400 * time.Millisecond})
	other, _ := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	l, err := c.Mutex("extend-race", dlock.TTL(900*time.Millisecond)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !in.WaitInFlight(2*time.Second, func(k faults.Call) bool { return k.Script == "extend" && k.Via == faults.Batch }) {
		t.Fatal("no renewal in flight")
	}
	if err := l.Extend(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	// If the renewal's TTL won at Redis, another Client gets the lock
	// within a second; then the lease must have ended by then.
	octx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	o, err := other.Mutex("extend-race").Lock(octx)
	if err == nil {
		defer o.Unlock(ctx)
		if stillValid(l) {
			t.Fatal("another Client got the lock while the extended lease was still believed valid")
		}
	} else if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
	_ = l.Unlock(ctx)
}

// TestUnlockWithEndedCtxOfAPassedLease (review defect 4): a lease passed to
// a waiter is unlocked at once with a ctx that has already ended (defer
// l.Unlock(reqCtx) after the request), while its record is still in
// flight. The lock must be released once the record lands, not renewed
// forever, nor left to its TTL.
func TestUnlockWithEndedCtxOfAPassedLease(t *testing.T) {
	s := redistest.Start(t)
	cs, _, rdb := slowRecords(t, s, 200*time.Millisecond)
	ctx := ctxT(t, 20*time.Second)
	for round := 0; round < 8; round++ {
		name := "ended-" + string(rune('a'+round))
		// A TTL longer than waitFor's bound: a lock that nothing released
		// would still be held when the check below gives up.
		a, passed := inTurn(t, ctx, cs, rdb, name, dlock.TTL(30*time.Second))
		w, _ := unlockPassing(t, ctx, a, passed)
		ended, cancel := context.WithCancel(ctx)
		cancel()
		_ = w.Unlock(ended)
		if stillValid(w) {
			t.Fatal("the lease context outlived its Unlock")
		}
		waitFor(t, ctx, "the lock free again at Redis (round "+name+")", func() bool {
			return rdb.HGet(ctx, "dlock:{"+name+"}", "o").Err() == redis.Nil
		})
	}
}

// TestRetriedUnlockAfterLostReply: the first release runs but its reply is
// lost; before the retry, the idle key expires, or another Client takes
// and frees the lock. The retry finds the lock not this lease's and reports
// success: the first attempt released it (the lease held until Unlock was
// called), rather than ErrLockLost.
func TestRetriedUnlockAfterLostReply(t *testing.T) {
	s := redistest.Start(t)
	// Each lease's first Unlock loses the replies of its release and of the
	// release's resends (1 + releaseResends calls).
	c, _ := faultyClient(t, s, faults.Rule{Script: "release", Kind: faults.LoseReply, Calls: []int{1, 2, 3, 4, 6, 7, 8, 9}})
	other, rdb := newClient(t, s)
	ctx := ctxT(t, 10*time.Second)
	for _, between := range []struct {
		what string
		do   func(name string)
	}{
		{"the key expired", func(name string) { rdb.Del(ctx, "dlock:{"+name+"}") }},
		{"another Client took and freed it", func(name string) {
			l, err := other.Mutex(name).Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			_ = l.Unlock(ctx)
		}},
	} {
		name := "retry-" + between.what
		l, err := c.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(ctx); err == nil {
			t.Fatalf("%s: the first Unlock's reply was lost, yet it returned nil", between.what)
		}
		between.do(name)
		if err := l.Unlock(ctx); err != nil {
			t.Fatalf("%s: retried Unlock: %v, want nil", between.what, err)
		}
	}
}

// TestRenewsBeforeADoubtedShorterExtend: an Extend to a shorter TTL whose
// reply is lost may have run (here it did): the lock then expires that TTL
// after it was sent, before the renewal the last proof scheduled. The
// watchdog must renew before that earlier deadline, not let the lease run
// out while Redis would have renewed it. Every send's reply is lost: over
// a driver that does not resend by itself (rueidis), dlock sends an
// Extend again after a failed send, up to three times (see resend).
func TestRenewsBeforeADoubtedShorterExtend(t *testing.T) {
	s := redistest.Start(t)
	c, _ := faultyClient(t, s, faults.Rule{Script: "extend", Via: faults.Single, Kind: faults.LoseReply, Calls: []int{1, 2, 3, 4}})
	rdb := s.Client(t)
	ctx := ctxT(t, 30*time.Second)
	l, err := c.Mutex("doubted-extend", dlock.TTL(3*time.Second)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Extend(ctx, 300*time.Millisecond); err == nil {
		t.Fatal("Extend with its reply lost returned nil")
	}
	// The lost Extend ran: without a renewal the key expires 300ms after
	// it was sent. Past three of those, the lease must still be held, at
	// Redis and by its holder.
	time.Sleep(time.Second) // a time property: the lease outlives the doubted TTL
	if err := l.Context().Err(); err != nil {
		t.Fatalf("the lease ended: %v (%v)", err, context.Cause(l.Context()))
	}
	if o := rdb.HGet(ctx, "dlock:{doubted-extend}", "o").Val(); o != l.Token() {
		t.Fatalf("owner at Redis is %q, want the holder", o)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
