package dlock_test

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// TestSentinelFailover runs dlock through a go-redis failover client on
// topology R (primary, replica, three sentinels): waiters are woken by
// message before and after a failover, and fences keep increasing across it.
// (A lock granted just before a failover can be lost with the writes the
// replica had not received: docs/SAFETY.md; not what this test checks.)
func TestSentinelFailover(t *testing.T) {
	r := redistest.StartReplicated(t)
	ctx := ctxT(t, 90*time.Second)
	var clients []*dlock.Client
	for i := 0; i < 2; i++ {
		c := newDlock(t, r.Client(t))
		t.Cleanup(func() { _ = c.Close() })
		clients = append(clients, c)
	}
	var last uint64
	lock := func(c *dlock.Client) (*dlock.Lease, error) { return c.Mutex("ha").Lock(ctx) }
	check := func(phase string) {
		t.Helper()
		if el := handOffs(t, ctx, clients, &last, lock); el > 3*time.Second {
			t.Fatalf("%s: 80 hand-offs took %v: waiters are not woken", phase, el)
		} else {
			t.Logf("%s: 80 hand-offs in %v", phase, el)
		}
	}
	check("before the failover")
	r.Failover(t)
	// The failover client finds the new primary; a lock call during the
	// switch may fail (READONLY, reconnects) but must never report success
	// wrongly, and calls succeed again within a bound.
	deadline := time.Now().Add(20 * time.Second)
	for {
		l, err := clients[0].Mutex("ha").TryLock(ctx)
		if err == nil {
			if l.Fence() <= last {
				t.Fatalf("fence %d after the failover, %d before", l.Fence(), last)
			}
			last = l.Fence()
			_ = l.Unlock(ctx)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no lock 20s after the failover: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // retry; the 20s bound is what is tested
	}
	check("after the failover")
}
