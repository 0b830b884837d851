package dlock_test

import (
	"context"
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

// TestFault16SlotMovedWhileHeld is fault 16: the hash slot of a held lock
// is migrated to another master (as redis-cli --cluster reshard does) while
// its holder keeps it. The lock key moves with its expiry: the holder's
// renewals and Extend follow the slot and succeed, nobody else obtains the
// lock meanwhile, and the holder's Unlock releases it on the new master.
func TestFault16SlotMovedWhileHeld(t *testing.T) {
	w := startClusterWake(t, 1)
	ctx := ctxT(t, 60*time.Second)
	name := w.names[0]
	from := w.owner(t, name)
	to := w.masters[0]
	if to == from {
		to = w.masters[1]
	}
	key := "dlock:{" + name + "}"
	l, err := w.a.Mutex(name, dlock.TTL(time.Second)).Lock(ctx) // renewed every third of a second
	if err != nil {
		t.Fatal(err)
	}
	redistest.MigrateSlot(t, w.nodes, redistest.KeySlot(t, from, key), from, to)
	if n := to.Do(t, "EXISTS", key); n != int64(1) {
		t.Fatalf("the lock key is not on the new master after the migration (EXISTS %v)", n)
	}
	// Held across several renewals on the new master, and refused to others.
	for end := time.Now().Add(2 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if _, err := w.b.Mutex(name).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
			t.Fatalf("another Client's TryLock after the migration: %v, want ErrNotObtained", err)
		}
		if err := l.Context().Err(); err != nil {
			t.Fatalf("the lease ended after the migration: %v", context.Cause(l.Context()))
		}
	}
	if err := l.Extend(ctx, 5*time.Second); err != nil {
		t.Fatalf("Extend after the migration: %v", err)
	}
	if ms := to.Do(t, "PTTL", key); ms.(int64) < 4000 {
		t.Fatalf("the new master's PTTL after Extend(5s) is %v ms", ms)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("Unlock after the migration: %v", err)
	}
	if o := to.Do(t, "HGET", key, "o"); o != nil {
		t.Fatalf("the lock is still owned on the new master after Unlock: %v", o)
	}
	l2, err := w.b.Mutex(name).TryLock(ctx)
	if err != nil {
		t.Fatalf("after the Unlock: %v", err)
	}
	if l2.Fence() <= l.Fence() {
		t.Fatalf("fence %d after the migration, %d before", l2.Fence(), l.Fence())
	}
	_ = l2.Unlock(ctx)
}
