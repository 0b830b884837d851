package dlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// TestClusterMasterKilled: a Cluster master is SIGKILLed and its replica
// promoted by the cluster itself. Locks in its slots are obtained again
// soon after the promotion, not only once go-redis reloads its slot map on
// its own (every minute): a call that cannot reach a node makes the Client
// ask the ClusterClient to reload it.
func TestClusterMasterKilled(t *testing.T) {
	w := startClusterWake(t, 1)
	ctx := ctxT(t, 90*time.Second)
	name := w.names[0]
	owner := w.owner(t, name)
	var replica *redistest.Server
	for i, m := range w.masters {
		if m == owner {
			replica = w.replica[i][0]
		}
	}
	l, err := w.a.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Unlock(ctx)
	slot := redistest.KeySlot(t, replica, "dlock:{"+name+"}")
	owner.Kill()
	killed := time.Now()
	waitFor(t, ctx, "the replica to be promoted", func() bool {
		for _, n := range redistest.ClusterView(t, replica) {
			if n.Addr == replica.Addr() && !n.Replica() && n.Serves(slot) {
				return true
			}
		}
		return false
	})
	promoted := time.Now()
	t.Logf("promoted %v after the kill", promoted.Sub(killed).Round(time.Millisecond))
	for {
		l, err := w.b.Mutex(name).TryLock(ctx)
		if err == nil {
			t.Logf("obtained %v after the promotion", time.Since(promoted).Round(time.Millisecond))
			_ = l.Unlock(ctx)
			break
		}
		if errors.Is(err, dlock.ErrNotObtained) {
			t.Fatalf("not obtained: nobody holds it: %v", err)
		}
		if time.Since(promoted) > 15*time.Second {
			t.Fatalf("still failing 15s after the promotion: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // retry; the 15s bound is what is tested
	}
}
