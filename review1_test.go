package dlock_test

// Review 1 (adversarial read of the rewritten engine): each test reproduces
// one defect against a real redis-server and fails on the code it was
// written against (eee7bdf). See the test comments for the interleaving.

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faults"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// reviewClient is faultyClient with a longer cap on injected delays and
// Client options.
func reviewClient(t testing.TB, s *redistest.Server, maxDelay time.Duration, opts []dlock.Option, rules ...faults.Rule) (*dlock.Client, *faults.Injector) {
	t.Helper()
	loadScripts(t, s.Client(t))
	in := faults.New(faults.Config{Scripts: faults.EngineScripts(), Rules: rules, MaxDelay: maxDelay})
	rdb := s.Client(t)
	injectFaults(t, rdb, in)
	c := newDlock(t, rdb, opts...)
	t.Cleanup(func() { _ = c.Close() })
	return c, in
}

// owner returns the owner token of a mutex at Redis ("" when free or gone).
func owner(ctx context.Context, rdb redis.Cmdable, name string) string {
	o, _ := rdb.HGet(ctx, "dlock:{"+name+"}", "o").Result()
	return o
}

// TestReviewFailedRenewalAfterHandOver: a lease handed over through Redis is
// dated with min(TTL, 1s) from the waiter's last look, and its watchdog
// retries a failed renewal only tried + TTL/10 later (nextDue), with the
// full TTL (10s here), not the proved one. So one renewal that fails (here:
// never sent, connection refused) right after a hand-over pushes the retry
// past the 1s deadline: the 10s lease is lost within a second while the
// lock is still ours at Redis, and Unlock then says ErrLockLost and leaves
// it held at Redis (nothing releases a lost holding).
func TestReviewFailedRenewalAfterHandOver(t *testing.T) {
	s := redistest.Start(t)
	plain, _ := newClient(t, s)
	c, _ := reviewClient(t, s, 5*time.Second, nil,
		faults.Rule{Script: "extend", Via: faults.Batch, Kind: faults.FailSend, Calls: []int{1}})
	_, rdb := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	holder, err := plain.Mutex("renew-after-handover").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := async(t, ctx, c.Mutex("renew-after-handover").Lock)
	waitLine(t, ctx, rdb, "dlock:{renew-after-handover}", 1)
	if err := holder.Unlock(ctx); err != nil { // hands it to the waiter in line
		t.Fatal(err)
	}
	l, err := got()
	if err != nil {
		t.Fatal(err)
	}
	// The first renewal fails before reaching Redis; the TTL is 10s, so a
	// retry has seconds to succeed.
	time.Sleep(1500 * time.Millisecond)
	if err := l.Context().Err(); err != nil {
		t.Errorf("a 10s lease was lost 1.5s after one failed renewal: %v (owner at Redis: ours=%v, PTTL %v)",
			context.Cause(l.Context()), owner(ctx, rdb, "renew-after-handover") == l.Token(), rdb.PTTL(ctx, "dlock:{renew-after-handover}").Val())
	}
	if err := l.Unlock(ctx); err != nil {
		t.Errorf("Unlock: %v", err)
	}
	if o := owner(ctx, rdb, "renew-after-handover"); o != "" {
		t.Errorf("the lock is still held at Redis after Unlock returned (owner %q, PTTL %v)", o, rdb.PTTL(ctx, "dlock:{renew-after-handover}").Val())
	}
}

// TestReviewExtendOfAPassedLease: passedIn bounds a pending lease with
// doubtLocked(now, ttl), which leaves h.doubt = ttl for the rest of the
// holding's life; every later proof counts with min(its TTL, doubt). So
// Extend(5s) on a lease that was passed within the Client (TTL 1s, NoRenew)
// succeeds at Redis but the lease is still believed to end 1s after the
// record: its context ends with ErrLockLost while Redis holds the lock for
// ~4s more, and Unlock reports ErrLockLost and leaves it held.
func TestReviewExtendOfAPassedLease(t *testing.T) {
	s := redistest.Start(t)
	cs, rdb := newClients(t, s, 2)
	ctx := ctxT(t, 20*time.Second)
	const name = "extend-passed"
	a, passed := inTurn(t, ctx, cs, rdb, name, dlock.TTL(time.Second), dlock.NoRenew())
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	w := <-passed
	if w == nil {
		t.FailNow()
	}
	if w.Fence() != a.Fence()+1 {
		t.Fatalf("fence %d after %d: not passed", w.Fence(), a.Fence())
	}
	if err := w.Extend(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	pttl := rdb.PTTL(ctx, "dlock:{"+name+"}").Val()
	if err := w.Context().Err(); err != nil {
		t.Errorf("lease extended to 5s ended 1.5s later: %v; at Redis it is ours=%v for %v more",
			context.Cause(w.Context()), owner(ctx, rdb, name) == w.Token(), pttl)
	}
	if err := w.Unlock(ctx); err != nil {
		t.Errorf("Unlock: %v", err)
	}
	if o := owner(ctx, rdb, name); o != "" {
		t.Errorf("still held at Redis after Unlock returned: owner %q, PTTL %v", o, rdb.PTTL(ctx, "dlock:{"+name+"}").Val())
	}
}

// TestReviewLockReturnsLateWhenServerPaused: a waiter in line whose ctx ends
// while Redis does not answer leaves the line synchronously (lock.quit:
// giveBack under min(TTL, 5s), on a client that bounds I/O by its read
// timeout, not by ctx): Lock returns seconds after its ctx ended. TryLock
// (abandon, in the background) returns within its ctx, as
// TestPausedServerWithinCtx checks.
func TestReviewLockReturnsLateWhenServerPaused(t *testing.T) {
	s := redistest.Start(t)
	holderC, _ := newClient(t, s)
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 30*time.Second)
	for _, tc := range []struct {
		what string
		hold func() (*dlock.Lease, error)
		wait func(context.Context) (*dlock.Lease, error)
		line string
	}{
		{"Mutex", func() (*dlock.Lease, error) { return holderC.Mutex("paused-m").Lock(ctx) }, c.Mutex("paused-m").Lock, "dlock:{paused-m}"},
		{"Semaphore", func() (*dlock.Lease, error) { return holderC.Semaphore("paused-s", 1).Acquire(ctx, 1) },
			func(ctx context.Context) (*dlock.Lease, error) { return c.Semaphore("paused-s", 1).Acquire(ctx, 1) }, "dlock:{paused-s}"},
	} {
		t.Run(tc.what, func(t *testing.T) {
			h, err := tc.hold()
			if err != nil {
				t.Fatal(err)
			}
			defer h.Unlock(ctx)
			lctx, cancel := context.WithCancel(ctx)
			defer cancel()
			done := make(chan time.Time, 1)
			go func() { _, _ = tc.wait(lctx); done <- time.Now() }()
			waitLine(t, ctx, rdb, tc.line, 1)
			s.Pause()
			time.Sleep(400 * time.Millisecond) // the waiter's next look is stuck at the paused server
			cancel()
			cancelled := time.Now()
			var returned time.Time
			select {
			case returned = <-done:
			case <-time.After(15 * time.Second):
				s.Resume()
				t.Fatal("Lock did not return 15s after its ctx ended")
			}
			s.Resume()
			if d := returned.Sub(cancelled); d > time.Second {
				t.Errorf("Lock returned %v after its ctx ended (server paused)", d.Round(time.Millisecond))
			}
		})
	}
}

// blockingLog is a slog.Handler that, on the first record whose message is
// msg, reports it on hit and blocks until release is closed (at most 10s).
type blockingLog struct {
	msg     string
	hit     chan struct{}
	release chan struct{}
	once    atomic.Bool
}

func (b *blockingLog) Enabled(context.Context, slog.Level) bool { return true }
func (b *blockingLog) WithAttrs([]slog.Attr) slog.Handler       { return b }
func (b *blockingLog) WithGroup(string) slog.Handler            { return b }
func (b *blockingLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message == b.msg && b.once.CompareAndSwap(false, true) {
		close(b.hit)
		select {
		case <-b.release:
		case <-time.After(10 * time.Second):
		}
	}
	return nil
}

// TestReviewCloseMissesADueHolding: the watchdog pops every due holding off
// its heap, then (outside watchdog.mu) looks at each and pushes it back.
// Close collects the live holdings by draining that heap, so a holding the
// watchdog has popped and not yet pushed back is neither closed nor
// released: its context stays live after Close (and its Done channel never
// closes, even after the lock expired at Redis, since the watchdog is gone),
// the lock stays held at Redis, and, when the renewal goroutine can no
// longer start, the holding stays busy for good and its Unlock blocks past
// its ctx.
//
// The window is a few microseconds per holding in the batch; a logger that
// is slow on "lease lost" (the watchdog logs while it goes through the
// batch) makes it as long as the test needs: lease B (NoRenew) expires and
// is popped in the same pass as lease A's renewal, B first.
func TestReviewCloseMissesADueHolding(t *testing.T) {
	s := redistest.Start(t)
	log := &blockingLog{msg: "dlock: lease lost", hit: make(chan struct{}), release: make(chan struct{})}
	c, _ := newClient(t, s, dlock.WithLogger(slog.New(log)))
	_, rdb := newClient(t, s)
	ctx := ctxT(t, 30*time.Second)
	// A: renewed, due 1s after its grant, 250ms early at most. B: NoRenew,
	// deadline 891ms after its grant: popped first, A in the same pass.
	a, err := c.Mutex("close-a", dlock.TTL(3*time.Second)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Mutex("close-b", dlock.TTL(900*time.Millisecond), dlock.NoRenew()).Lock(ctx); err != nil {
		t.Fatal(err)
	}
	// C: on the heap, so Close releases it: shows Close got past its drain.
	if _, err := c.Mutex("close-c").Lock(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case <-log.hit: // the watchdog is inside its batch: A popped, not pushed back
	case <-time.After(5 * time.Second):
		t.Fatal("lease B was never found expired by the watchdog")
	}
	closed := make(chan struct{})
	go func() { _ = c.Close(); close(closed) }()
	waitFor(t, ctx, "Close released lease C", func() bool { return owner(ctx, rdb, "close-c") == "" })
	time.Sleep(200 * time.Millisecond) // Close is waiting for its goroutines
	close(log.release)
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	if err := a.Context().Err(); err == nil {
		t.Errorf("lease A's context is live after Close returned (want cause ErrClosed)")
	} else if cause := context.Cause(a.Context()); !errors.Is(cause, dlock.ErrClosed) && !errors.Is(cause, dlock.ErrLockLost) {
		// ErrLockLost when its deadline passed while the logger held the
		// watchdog (Close waits for the watchdog before it collects leases).
		t.Errorf("lease A ended with %v, want ErrClosed or ErrLockLost", cause)
	}
	if o := owner(ctx, rdb, "close-a"); o == a.Token() {
		t.Errorf("Close did not release lease A (still owner at Redis, PTTL %v)", rdb.PTTL(ctx, "dlock:{close-a}").Val())
	}
	done := a.Context().Done()
	waitFor(t, ctx, "lease A's key gone at Redis", func() bool { return owner(ctx, rdb, "close-a") != a.Token() })
	select {
	case <-done:
	case <-time.After(200 * time.Millisecond):
		t.Errorf("lease A's Done channel is still open after its lock expired at Redis")
	}
	uctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	_ = a.Unlock(uctx)
	if d := time.Since(start); d > time.Second {
		t.Errorf("Unlock with a 200ms ctx took %v", d.Round(time.Millisecond))
	}
}

// TestReviewUnlockOfPendingLeaseGivesUp: the passed lease is unlocked with
// an ended ctx while its record is still in flight; finishLater waits for
// the record's request slot at most min(TTL, 5s), but the record may retry
// (or be delayed) until the passer's deadline, up to a TTL. When it lands
// after finishLater gave up, the lock is the new token's at Redis for a
// full TTL from then, not renewed, and nothing releases it: held longer
// than one TTL after every caller returned.
func TestReviewUnlockOfPendingLeaseGivesUp(t *testing.T) {
	s := redistest.Start(t)
	plain, _ := newClient(t, s)
	// The record reaches Redis 5.3s after it is sent: after finishLater's
	// 5s, before the passer's deadline.
	c, _ := reviewClient(t, s, 10*time.Second, nil,
		faults.Rule{Script: "pass", Kind: faults.DelaySend, Calls: []int{1}, Min: 5300 * time.Millisecond, Max: 5300 * time.Millisecond})
	_, rdb := newClient(t, s)
	ctx := ctxT(t, 30*time.Second)
	const name = "pending-gives-up"
	const ttl = 6 * time.Second
	a, passed := inTurn(t, ctx, []*dlock.Client{plain, c}, rdb, name, dlock.TTL(ttl))
	if err := a.Extend(ctx, ttl); err != nil { // the passer's deadline: ~5.9s from now
		t.Fatal(err)
	}
	actx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	aDone := make(chan error, 1)
	go func() { aDone <- a.Unlock(actx) }()
	w := <-passed
	if w == nil {
		t.FailNow()
	}
	ended, cancelEnded := context.WithCancel(ctx)
	cancelEnded()
	_ = w.Unlock(ended) // the request is over: defer l.Unlock(reqCtx)
	<-aDone
	returned := time.Now() // every caller has returned
	waitFor(t, ctx, "the record at Redis", func() bool {
		return owner(ctx, rdb, name) == w.Token() || owner(ctx, rdb, name) == "" && time.Since(returned) > 5500*time.Millisecond
	})
	for time.Since(returned) < ttl+500*time.Millisecond {
		time.Sleep(50 * time.Millisecond)
	}
	if o := owner(ctx, rdb, name); o != "" {
		t.Errorf("the lock is held at Redis %v after every caller returned (TTL %v): owner is the passed lease=%v, PTTL %v",
			time.Since(returned).Round(time.Millisecond), ttl, o == w.Token(), rdb.PTTL(ctx, "dlock:{"+name+"}").Val())
	}
}

// TestReviewLostAcquireReplyQueuesBehindItsOwnWaiter: a default-mode Lock
// whose first look is granted at Redis but whose reply is lost goes on to
// wait with the same token (so that its next look finds the lock its own).
// But it joins the Client's local queue at the back: a second Lock of the
// same Client that arrived meanwhile is the head, waits in line at Redis for
// the lock the first one holds (unrenewed: nobody knows it is held), and the
// first waits for its turn behind it. Both wait a full TTL with the lock
// held by nobody's lease, and so does every other Client.
func TestReviewLostAcquireReplyQueuesBehindItsOwnWaiter(t *testing.T) {
	s := redistest.Start(t)
	c, _ := reviewClient(t, s, 5*time.Second, nil,
		faults.Rule{Script: "acquire", Kind: faults.LoseReply, Calls: []int{1}, Min: 300 * time.Millisecond, Max: 300 * time.Millisecond})
	_, rdb := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	const name = "lost-first-look"
	const ttl = 4 * time.Second
	start := time.Now()
	first := async(t, ctx, c.Mutex(name, dlock.TTL(ttl)).Lock)
	// The first look ran (the lock is the first Lock's token at Redis); its
	// caller hears of it only 300ms later. Meanwhile a second Lock comes.
	waitFor(t, ctx, "the first look granted at Redis", func() bool { return owner(ctx, rdb, name) != "" })
	second := async(t, ctx, c.Mutex(name, dlock.TTL(ttl)).Lock)
	waitLine(t, ctx, rdb, "dlock:{"+name+"}", 1)
	got := make(chan time.Duration, 2)
	for _, f := range []func() (*dlock.Lease, error){first, second} {
		go func() {
			l, err := f()
			if err != nil {
				got <- -1
				return
			}
			got <- time.Since(start)
			_ = l.Unlock(ctx)
		}()
	}
	select {
	case d := <-got:
		if d < 0 {
			t.Fatal("Lock failed")
		}
		if d > 2*time.Second {
			t.Errorf("the first grant came after %v (TTL %v): the lock sat with a token whose Lock waited behind the Client's own head", d.Round(time.Millisecond), ttl)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no Lock returned within 10s")
	}
	<-got
}

// TestReviewSecondCloseReturnsEarly: Close is idempotent by returning at
// once when closed was already set, even while the first Close is still
// releasing the held leases and waiting for the goroutines. A second Close
// (defer c.Close() beside a shutdown hook, or TestPassCloseRace's own
// Close after its AfterFunc's) returns with the lock still held at Redis
// and goroutines running. This is the flake of TestPassCloseRace ("owner
// left at Redis after Close", with the owner gone a moment later).
func TestReviewSecondCloseReturnsEarly(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	l, err := c.Mutex("close-twice").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.Pause() // the first Close's release waits for the server
	first := make(chan struct{})
	go func() { _ = c.Close(); close(first) }()
	// The first Close has ended the lease and is releasing it.
	waitFor(t, ctx, "the first Close to end the lease", func() bool { return l.Context().Err() != nil })
	var resumed atomic.Bool
	time.AfterFunc(500*time.Millisecond, func() { // within the first Close's window for releasing
		resumed.Store(true)
		s.Resume()
	})
	_ = c.Close()
	// The first Close's release cannot land before the server resumes, so a
	// second Close that returns before then did not wait for it. (Whether
	// the first goroutine has yet run close(first) is up to the scheduler.)
	if !resumed.Load() {
		t.Errorf("the second Close returned while the first was still releasing (lease context ended: %v)", l.Context().Err() != nil)
	}
	<-first
	if o := owner(ctx, rdb, "close-twice"); o != "" {
		t.Errorf("owner %q at Redis after both Closes returned", o)
	}
}
