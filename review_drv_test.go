package dlock_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// TestReviewManyChannelsResubscribedAfterReset: a Client waits for many
// locks, each on a wake-up channel of its own, all on one subscription
// connection; the connection is reset, and the hub places every channel
// again at once, in one batch of SSUBSCRIBEs on one new connection. Every
// waiter must still be woken by its holder's release: here all the
// holders release well before their 60s TTL, and each waiter must obtain
// its lock within 20s.
func TestReviewManyChannelsResubscribedAfterReset(t *testing.T) {
	const n = 100
	ctx := ctxT(t, 60*time.Second)
	site := startS(t)
	holder, rdb := site.client(t)
	waiter, p := site.proxied(t, "")

	names := make([]string, n)
	leases := make([]*dlock.Lease, n)
	for i := range names {
		names[i] = fmt.Sprintf("many-%d", i)
		l, err := holder.Mutex(names[i], dlock.TTL(60*time.Second)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		leases[i] = l
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	got := make([]func() (*dlock.Lease, error), n)
	for i, name := range names {
		got[i] = async(t, wctx, waiter.Mutex(name, dlock.TTL(60*time.Second)).Lock)
	}
	channels := func() int {
		v, _ := rdb.Do(ctx, "PUBSUB", "SHARDCHANNELS", "*many-*").Slice()
		return len(v)
	}
	// The count is taken as the whole: two channels a waiter (its lock's
	// and its Client's hand-over channel for that lock), waited for, not
	// slept on (a hundred waits take their time to start on a loaded
	// machine, and a count taken early is never seen again once the reset
	// has placed every channel).
	waitFor(t, ctx, fmt.Sprintf("the %d channels of %d waiters subscribed", 2*n, n), func() bool { return channels() >= 2*n })
	all := channels()
	if all < n {
		t.Fatalf("%d channels subscribed for %d waiters", all, n)
	}
	subscribed := func() bool { return channels() == all }
	gaps := dlock.SubscriptionsRepaired(waiter)
	p.ResetAll()
	// The hub sees the reset and subscribes every channel again.
	waitFor(t, ctx, "the subscriptions dropped by the reset", func() bool {
		return channels() < all
	})
	waitWithin(t, ctx, 15*time.Second, "every channel subscribed again", subscribed)
	t.Logf("%d channels, %d repaired", all, dlock.SubscriptionsRepaired(waiter)-gaps)
	for _, l := range leases {
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for i := range got {
		l, err := got[i]()
		if err != nil {
			t.Fatalf("waiter %d of %d after the reset: %v", i, n, err)
		}
		_ = l.Unlock(ctx)
	}
}

// TestReviewBackgroundLockAcrossPause: Lock with context.Background()
// waits for a lock whose holder's server is stopped (SIGSTOP) past the
// holder's TTL, then resumed. The waiter's calls fail while the server is
// stopped; it must obtain the lock once the server runs again, and only
// after the holder's lease has ended on the holder's side.
func TestReviewBackgroundLockAcrossPause(t *testing.T) {
	ctx := ctxT(t, 60*time.Second)
	site := startS(t)
	holderC, rdb := site.client(t)
	waiterC, _ := site.client(t)
	s := site.serverOf(t, "")
	const name = "bg-pause"
	warmUp(t, ctx, waiterC, name)
	held, err := holderC.Mutex(name, dlock.TTL(2*time.Second)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		l   *dlock.Lease
		err error
	}
	done := make(chan result, 1)
	go func() {
		l, err := waiterC.Mutex(name, dlock.TTL(10*time.Second)).Lock(context.Background())
		done <- result{l, err}
	}()
	waitLine(t, ctx, rdb, "dlock:{"+name+"}", 1)
	s.Pause()
	time.Sleep(5 * time.Second) // stopped past the holder's TTL and the clients' 3s bound
	s.Resume()
	var r result
	select {
	case r = <-done:
	case <-time.After(40 * time.Second):
		t.Fatal("Lock(context.Background()) did not return 40s after the server resumed")
	}
	if r.err != nil {
		t.Fatalf("Lock after the pause: %v", r.err)
	}
	select {
	case <-held.Context().Done():
	default:
		t.Fatal("the waiter obtained the lock while the holder's lease was still live")
	}
	if o := owner(ctx, rdb, name); o != r.l.Token() {
		t.Fatalf("owner %q, want the waiter's token %q", o, r.l.Token())
	}
	if err := r.l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	_ = held.Unlock(ctx)
}

// TestReviewWaiterAfterRestart: a server restarted without persistence
// loses a held lock (documented); a waiter's subscription connection is
// cut by the restart, and the hub's repair (a Gap) makes the waiter look
// again: it must obtain the lock within 20s, well before the lost
// holder's 60s TTL.
func TestReviewWaiterAfterRestart(t *testing.T) {
	ctx := ctxT(t, 60*time.Second)
	site := startS(t)
	holderC, rdb := site.client(t)
	waiterC, _ := site.client(t)
	s := site.serverOf(t, "")
	const name = "restart-wait"
	held, err := holderC.Mutex(name, dlock.TTL(60*time.Second)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = held.Unlock(ctx) }()
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	got := async(t, wctx, waiterC.Mutex(name, dlock.TTL(10*time.Second)).Lock)
	waitLine(t, ctx, rdb, "dlock:{"+name+"}", 1)
	s.Restart(t)
	l, err := got()
	if err != nil {
		t.Fatalf("waiter after the restart: %v", err)
	}
	if o := owner(ctx, rdb, name); o != l.Token() {
		t.Fatalf("owner %q, want the waiter's token %q", o, l.Token())
	}
	_ = l.Unlock(ctx)
}

// TestReviewCloseWhileServerStopped: Close while the server is stopped
// (SIGSTOP) and a Lock(context.Background()) and a Lock with a deadline
// are in flight: Close must return, and both Locks with it (ErrClosed or
// the calls' failure), while the server is still stopped (each call is
// bounded by the client's 3s).
func TestReviewCloseWhileServerStopped(t *testing.T) {
	ctx := ctxT(t, 60*time.Second)
	site := startS(t)
	c, _ := site.client(t)
	s := site.serverOf(t, "")
	warmUp(t, ctx, c, "close-stopped")
	s.Pause()
	defer s.Resume()
	type result struct {
		l   *dlock.Lease
		err error
	}
	bg, dl := make(chan result, 1), make(chan result, 1)
	go func() {
		l, err := c.Mutex("close-stopped").Lock(context.Background())
		bg <- result{l, err}
	}()
	go func() {
		lctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		l, err := c.Mutex("close-stopped-2").Lock(lctx)
		dl <- result{l, err}
	}()
	time.Sleep(500 * time.Millisecond) // both sent to the stopped server
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case <-closed:
	case <-time.After(20 * time.Second):
		t.Fatal("Close did not return within 20s with the server stopped")
	}
	for _, w := range []struct {
		what string
		ch   chan result
	}{{"Lock(ctx)", dl}, {"Lock(context.Background())", bg}} {
		select {
		case r := <-w.ch:
			if r.err == nil {
				t.Fatalf("%s obtained the lock from a stopped server", w.what)
			}
			t.Logf("%s: %v", w.what, r.err)
		case <-time.After(20 * time.Second):
			t.Fatalf("%s still running 20s after Close, the server stopped", w.what)
		}
	}
}
