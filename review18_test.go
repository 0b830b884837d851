package dlock_test

// Review 18 (adversarial read of the engine after 1c98a08, ee7f102 and
// 2a95f12): each test reproduces one defect against a real redis-server and
// fails on the code it was written against (57da81c).

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faults"
	"github.com/dlock-go/dlock/internal/redistest"
)

// acquireScript names the fault script of a kind's acquire.
var acquireScript = map[string]string{"mutex": "acquire", "fair": "fair_acquire", "rwmutex": "sem.a", "semaphore": "sem.a"}

// TestPipelinedAcquireResentAfterACut: the connection that carries a
// TryLock's acquire is closed once the acquire is written (Redis runs it).
// Sent straight to a pooled connection, go-redis sends it again by itself
// and the token finds the lock its own; sent through the autopipeliner
// (more than pipelineAbove calls in flight), every call goes in sent once
// since 1c98a08, and TryLock failed with "use of closed network connection"
// (the lock given back), though the comment promised that the engine asks
// again with the same token. The two paths must agree: both obtain it.
func TestPipelinedAcquireResentAfterACut(t *testing.T) {
	for _, p := range exclusives {
		for _, piped := range []bool{false, true} {
			name := p.kind
			if piped {
				name += "-pipelined"
			}
			t.Run(name, func(t *testing.T) {
				s := redistest.Start(t)
				script := acquireScript[p.kind]
				c, in := faultyClient(t, s, faults.Rule{Script: script, Kind: faults.Cut, Calls: []int{1}})
				if piped {
					dlock.ForcePipelined(c)
				}
				ctx := ctxT(t, 20*time.Second)
				l, err := p.tryWait(c, "cut-"+p.kind)(ctx)
				if n := in.Stats()[script+" cut single"] + in.Stats()[script+" cut batch"]; n != 1 {
					t.Fatalf("%d acquires cut, want 1: %v", n, in.Summary())
				}
				if err != nil {
					t.Fatalf("a free lock's try whose connection was cut after the acquire was written: %v, want it obtained", err)
				}
				// The cut acquire may yet run (setting the lock's TTL
				// again): a resend the engine made itself is known, and the
				// lease must account for it. (go-redis's own resends on a
				// pooled connection are not seen.)
				if d := dlock.Describe(l); piped && !strings.Contains(d, "acqDoubt true") {
					t.Errorf("a lease obtained by resending a cut acquire does not doubt it: %s", d)
				}
				if err := l.Unlock(ctx); err != nil {
					t.Fatalf("Unlock: %v", err)
				}
			})
		}
	}
}

// TestPipelinedScriptLoadWithinCtx: a TryLock through the autopipeliner
// meets NOSCRIPT (the server's script cache was flushed: a restart, a
// failover, SCRIPT FLUSH), and the server stops answering just then. The
// pipeliner's wait ends with the caller's ctx, but the SCRIPT LOAD that
// follows was sent straight on the go-redis client, which bounds its socket
// I/O by its own read timeout (10s here), not by ctx (without
// ContextTimeoutEnabled): TryLock returned that long after its ctx ended.
// A pooled connection's call runs aside (Client.aside) and returns with
// ctx; the pipelined path must too.
func TestPipelinedScriptLoadWithinCtx(t *testing.T) {
	s := redistest.Start(t)
	c, in := faultyClient(t, s, faults.Rule{Script: "acquire", Kind: faults.DelayReply, Calls: []int{1}, Min: 300 * time.Millisecond, Max: 300 * time.Millisecond})
	dlock.ForcePipelined(c)
	plain := s.Client(t)
	ctx := ctxT(t, 30*time.Second)
	if err := plain.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	tctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	end, _ := tctx.Deadline()
	done := make(chan error, 1)
	go func() {
		_, err := c.Mutex("noscript-paused").TryLock(tctx)
		done <- err
	}()
	// Redis answered the acquire NOSCRIPT (its reply is held back 300ms):
	// stop it before the reply reaches the engine.
	waitFor(t, ctx, "the acquire answered NOSCRIPT", func() bool {
		return strings.Contains(plain.Info(ctx, "errorstats").Val(), "errorstat_NOSCRIPT:count=1")
	})
	if !in.InFlight(func(k faults.Call) bool { return k.Script == "acquire" }) {
		t.Fatal("the acquire's reply reached the engine before the server was stopped: no SCRIPT LOAD to a stopped server")
	}
	s.Pause()
	defer s.Resume()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("TryLock obtained a lock on a stopped server")
		}
	case <-time.After(time.Until(end) + 3*time.Second):
		t.Fatal("TryLock did not return within 3s after its ctx ended (the SCRIPT LOAD after NOSCRIPT waits for the client's read timeout)")
	}
}
