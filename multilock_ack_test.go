package dlock_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// TestReplicaAckMultiLock: with WithReplicaAck a MultiLock's grant is on
// the replica, every name of it, when Lock returns; with the replica
// stopped, Lock and TryLock fail closed with ErrNotReplicated and leave
// every name free at the primary (none is held by a grant the caller was
// told failed), and a waiting MultiLock that then obtains its names does
// the same.
func TestReplicaAckMultiLock(t *testing.T) {
	_, replica, pc, rc := primaryAndReplica(t)
	ctx := ctxT(t, 60*time.Second)
	c := newDlock(t, pc, dlock.WithReplicaAck(1, 200*time.Millisecond))
	t.Cleanup(func() { _ = c.Close() })
	other := newDlock(t, pc)
	t.Cleanup(func() { _ = other.Close() })
	names := []string{"ack/a", "ack/b", "ack/c"}

	l, err := c.MultiLock(names).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range names {
		if got, _ := rc.HGet(ctx, "dlock:{"+n+"}", "o").Result(); got != l.Token() {
			t.Fatalf("%s: the replica names owner %q, want the multi lease's %q", n, got, l.Token())
		}
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	free := func(what string) {
		t.Helper()
		for _, n := range names {
			if o, _ := pc.HGet(ctx, "dlock:{"+n+"}", "o").Result(); o != "" {
				t.Fatalf("%s: %s is left owned by %q at the primary", what, n, o)
			}
		}
	}
	notReplicated := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, dlock.ErrNotReplicated) || !strings.Contains(err.Error(), "0 of 1 replicas confirmed") {
			t.Fatalf("%s: %v, want ErrNotReplicated saying 0 of 1 replicas confirmed", what, err)
		}
	}

	// A waiter: another Client holds the middle name; the MultiLock
	// takes the first, waits for the second, and is granted it (and the
	// third) once the replica has stopped.
	hb, err := other.Mutex("ack/b").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waiting := async(t, ctx, c.MultiLock(names).Lock)
	waitFor(t, ctx, "the MultiLock waiting for ack/b", func() bool {
		return pc.LLen(ctx, "dlock:{ack/b}:q").Val() > 0 || pc.HGet(ctx, "dlock:{ack/b}", "w").Val() == "1"
	})

	replica.Pause()
	defer replica.Resume()

	_, err = c.MultiLock([]string{"ack/x", "ack/y"}).Lock(ctx)
	notReplicated("Lock", err)
	_, err = c.MultiLock([]string{"ack/x", "ack/y"}).TryLock(ctx)
	notReplicated("TryLock", err)
	for _, n := range []string{"ack/x", "ack/y"} {
		if o, _ := pc.HGet(ctx, "dlock:{"+n+"}", "o").Result(); o != "" {
			t.Fatalf("after ErrNotReplicated, %s is left owned by %q", n, o)
		}
	}

	if err := hb.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	w, err := waiting()
	if err == nil {
		_ = w.Unlock(ctx)
		t.Fatal("a MultiLock waiting through the replica's stop was granted every name unconfirmed")
	}
	// The wait either ends in ErrNotReplicated (its grant was not
	// confirmed) or in the ctx-free error of an earlier part's renewal
	// not being confirmed; whichever, nothing is left held.
	if !errors.Is(err, dlock.ErrNotReplicated) && !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("waiting MultiLock: %v, want ErrNotReplicated or ErrLockLost", err)
	}
	waitFor(t, ctx, "every name free at the primary", func() bool {
		for _, n := range names {
			if o, _ := pc.HGet(ctx, "dlock:{"+n+"}", "o").Result(); o != "" {
				return false
			}
		}
		return true
	})
	free("after the waiting MultiLock failed")
}
