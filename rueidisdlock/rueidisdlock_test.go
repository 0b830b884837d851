package rueidisdlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faultproxy"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/rueidisdlock"
	"github.com/redis/rueidis"
)

// The root package's tests run whole over this driver with
// DLOCK_DRIVER=rueidis (make test); these check what only it can get wrong.

func client(t *testing.T, addr string) rueidis.Client {
	t.Helper()
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true, ForceSingleClient: true, ConnWriteTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	return rc
}

func newDlock(t *testing.T, rc rueidis.Client, opts ...dlock.Option) *dlock.Client {
	t.Helper()
	c, err := rueidisdlock.New(rc, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func TestNilClient(t *testing.T) {
	if c, err := rueidisdlock.New(nil); c != nil || !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Fatalf("New(nil) = %v, %v; want nil, ErrInvalidArgument", c, err)
	}
}

// TestWaiterWokenByRelease: a waiter over one rueidis client is woken by
// the release of a holder over another, through its subscription (the
// hold's TTL is far longer than the test's ctx).
func TestWaiterWokenByRelease(t *testing.T) {
	s := redistest.Start(t)
	a, b := newDlock(t, client(t, s.Addr())), newDlock(t, client(t, s.Addr()))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	l, err := a.Mutex("woken", dlock.TTL(time.Minute)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Mutex("woken", dlock.TTL(time.Minute)).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock of a held lock: %v, want ErrNotObtained", err)
	}
	got := make(chan error, 1)
	go func() {
		l2, err := b.Mutex("woken", dlock.TTL(time.Minute)).Lock(ctx)
		if err == nil {
			err = l2.Unlock(ctx)
		}
		got <- err
	}()
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatalf("the waiter: %v, want the lock (woken by the release)", err)
	}
}

// TestReleaseNotResentByRueidis: a release runs at Redis, another holder
// takes the lock, and the release's reply is lost with its connection.
// Had rueidis resent the release by itself, its second run's "not the
// owner" would come back as the answer, and Unlock would report
// ErrLockLost for a lease held to the end; dlock must learn of the failure
// and resend it knowingly.
func TestReleaseNotResentByRueidis(t *testing.T) {
	s := redistest.Start(t)
	p, err := faultproxy.Start(s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	c := newDlock(t, client(t, p.Addr()))
	other := newDlock(t, client(t, s.Addr()))
	rdb := s.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// Warm up: the first lock call asks which pub/sub the server has, and
	// a release waits for that answer, which Hold would keep back.
	for range 2 {
		l, err := c.Mutex("resent", dlock.TTL(time.Minute)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	l, err := c.Mutex("resent", dlock.TTL(time.Minute)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p.Hold(faultproxy.Downstream) // the release's reply is held back, then lost
	done := make(chan error, 1)
	go func() { done <- l.Unlock(ctx) }()
	for rdb.HGet(ctx, "dlock:{resent}", "o").Val() != "" {
		select {
		case <-ctx.Done():
			t.Fatal("the release never ran at Redis")
		case <-time.After(5 * time.Millisecond):
		}
	}
	// Another holder takes the lock before the reset: a second run of the
	// release finds it someone else's (a run that finds it free and its own
	// fence last would say "already released").
	cur, err := other.Mutex("resent", dlock.TTL(time.Minute)).TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock once the release ran: %v", err)
	}
	p.ResetAll()
	p.Release(faultproxy.Downstream)
	if err := <-done; err != nil {
		t.Fatalf("Unlock whose release ran but whose reply was lost: %v, want nil", err)
	}
	if o := rdb.HGet(ctx, "dlock:{resent}", "o").Val(); o != cur.Token() {
		t.Fatalf("owner %q after the resent release, want the new holder %q", o, cur.Token())
	}
}
