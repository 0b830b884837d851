package dlock_test

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
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
