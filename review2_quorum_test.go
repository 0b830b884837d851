package dlock_test

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faults"
	"github.com/redis/go-redis/v9"
)

// quorumWorkRunning reports the stacks of goroutines still in a quorum
// request (fanOut) of this package.
func quorumWorkRunning() []string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "dlock.(*quorum).fanOut") {
			out = append(out, g)
		}
	}
	return out
}

// TestReview2QuorumAskLeavesNoWorkPastClose: TTL and Extend return once
// the answers in decide them, and the request to a master that has not
// answered goes on in the background, up to the per-master timeout. Close
// did not wait for it: it ran on after Close returned (a goroutine leak
// that goleak sees in a user's tests, holding the user's go-redis client).
// Here A is frozen after the lock is taken, TTL is decided by B and C,
// Unlock's ctx ends before A's timeout, and Close returns at once.
func TestReview2QuorumAskLeavesNoWorkPastClose(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	servers, _ := quorumMasters(t, 3)
	rdbs := make([]redis.UniversalClient, len(servers))
	for i, s := range servers {
		rdbs[i] = s.Client(t, func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	}
	q := newQuorum(t, rdbs, dlock.WithNodeTimeout(3*time.Second))
	l, err := q.Mutex("asked").TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// TryLock returned once two granted: the third's grant may still be
	// on its way, and a TTL asked before it would find one master fewer.
	grantedOnAll(t, ctx, servers, "asked", l)
	servers[0].Pause()
	defer servers[0].Resume()
	if _, err := l.TTL(ctx); err != nil {
		t.Fatal(err)
	}
	uctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if err := l.Unlock(uctx); err != nil {
		t.Fatal(err)
	}
	if err := q.Close(); err != nil {
		t.Fatal(err)
	}
	if g := quorumWorkRunning(); len(g) > 0 {
		t.Fatalf("%d quorum requests still running after Close, e.g.\n%s", len(g), g[0])
	}
}

// TestReview2QuorumLateGrantCountedByRenewal: a master whose grant's reply
// came after its per-master timeout was given back by token, even when
// the attempt had won and the lease lived on. But the lease's renewals go
// to every master and count that master's extension once it granted: a
// renewal proved the lease on a majority that included it, and the
// give-back then took it away. Here A, B and C: the lock is won on A and
// B, C grants at once but its reply comes 900 ms late (100 ms per-master
// timeout), A fails every extension, and the renewal at a third of the
// 1.5 s TTL extends B and C; C's late reply then gave C back. Once A's
// grant expired, another Client took A and C while the first lease was
// believed valid until its renewal's TTL.
func TestReview2QuorumLateGrantCountedByRenewal(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	servers, rdbs := quorumMasters(t, 3)
	a, _ := faultyMaster(t, servers[0], faults.Rule{Script: "extend", Kind: faults.FailSend, P: 1, Min: 5 * time.Millisecond, Max: 5 * time.Millisecond})
	c, in := faultyMaster(t, servers[2], faults.Rule{Script: "quorum_acquire", Kind: faults.DelayReply, Calls: []int{1}, Min: 900 * time.Millisecond, Max: 900 * time.Millisecond})
	q := newQuorum(t, []redis.UniversalClient{a, rdbs[1], c}, dlock.WithNodeTimeout(100*time.Millisecond))
	other := newQuorum(t, rdbs, dlock.WithNodeTimeout(100*time.Millisecond))
	const ttl = 1500 * time.Millisecond
	l, err := q.Mutex("renewed", dlock.TTL(ttl)).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Unlock(ctx) }()
	waitFor(t, ctx, "C's late reply", func() bool { return !in.InFlight(func(c faults.Call) bool { return c.Script == "quorum_acquire" }) })
	noSecondGrant(t, ctx, other.Mutex("renewed", dlock.TTL(ttl)), l, servers, 3*time.Second, false)
}
