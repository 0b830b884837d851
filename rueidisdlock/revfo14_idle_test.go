package rueidisdlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/wire"
)

// TestRevFo14IdleThroughFailoverThenBack: a Client idle through a
// failover (P to Q) makes its next call while Q is stopped (SIGSTOP), and
// the sentinels fail Q over back to P. The call's acquire went to Q; Q,
// resumed as the client moves back to P, grants it, and rueidis reads
// that reply on its closing connection to Q. It must not be believed: P,
// the primary, never saw it, and another Client takes the lock there
// (go-redis loses such a reply, as it closes its connections to Q, and
// asks P again). The check fails if the mark a send is checked against is
// the primary that the latest look saw (P, before the idle failover) and
// not the one the send went to (Q): the look after the reply sees P again.
func TestRevFo14IdleThroughFailoverThenBack(t *testing.T) {
	r := redistest.StartReplicated(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	// rueidis's default ConnWriteTimeout (10 s) outlasts the stop: the
	// sentinels fail Q over within about 2 s of it, or up to 6 s after the
	// first failover.
	waiter := newDlock(t, sentinelClient(t, r, "revfo14-idle"))
	other := newDlock(t, sentinelClient(t, r, "revfo14-idle-other"))
	warm := func(c *dlock.Client) {
		t.Helper()
		l, err := c.Mutex("revfo14-idle-warm", dlock.NoRenew()).TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	warm(waiter)
	warm(other)
	p, q := r.Primary, r.Replica
	r.Failover(t) // P to Q; the waiter makes no call
	redistest.WaitUntil(t, ctx, "the idle client to follow "+q.Addr(), func() bool {
		list, _ := q.Do(t, "CLIENT", "LIST").(string)
		return redistest.RanCommand(list, "revfo14-idle")
	})
	redistest.WaitUntil(t, ctx, "the idle client's connections to "+p.Addr()+" to close", func() bool {
		list, _ := p.Do(t, "CLIENT", "LIST").(string)
		return !redistest.RanCommand(list, "revfo14-idle")
	})
	warm(other) // loads the scripts on Q, so that an EVALSHA queued there runs
	const name = "revfo14-idle"
	key := wire.HashKey(wire.DefaultPrefix, name)
	q.Pause()
	t.Cleanup(q.Resume)
	res := resumeReplaced(t, ctx, r, q, p, "revfo14-idle", key,
		goTryLock(context.Background(), waiter.Mutex(name, dlock.TTL(time.Minute), dlock.NoRenew())))
	if res.err != nil {
		t.Fatalf("TryLock: %v, want the lock (free on the primary %s)", res.err, p.Addr())
	}
	defer res.l.Unlock(ctx)
	o, _ := p.Do(t, "HGET", key, wire.FieldOwner).(string)
	if o == res.l.Token() {
		return
	}
	if l2, err := other.Mutex(name, dlock.NoRenew()).TryLock(ctx); err == nil {
		defer l2.Unlock(ctx)
		t.Fatalf("two holders: the waiter's lease (%s, granted by the replaced primary %s) and another Client's (%s, on the primary %s)", res.l.Token(), q.Addr(), l2.Token(), p.Addr())
	}
	t.Fatalf("the primary %s has owner %q, not the lease's token %q: the grant came from the replaced primary", p.Addr(), o, res.l.Token())
}
