package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// namesOnEveryNode returns one lock name per cluster node: each name's key
// (and so its line, holders and channels) lives on a different master.
func namesOnEveryNode(t *testing.T, ctx context.Context, rdb *redis.ClusterClient, nodes int, prefix string) []string {
	t.Helper()
	seen := map[string]bool{}
	var names []string
	for i := 0; i < 1000 && len(names) < nodes; i++ {
		name := prefix + string(rune('a'+i%26)) + string(rune('a'+i/26))
		node, err := rdb.MasterForKey(ctx, "dlock:{"+name+"}")
		if err != nil {
			t.Fatal(err)
		}
		addr := node.Options().Addr
		if !seen[addr] {
			seen[addr] = true
			names = append(names, name)
		}
	}
	if len(names) < nodes {
		t.Fatalf("found names on only %d of %d nodes", len(names), nodes)
	}
	return names
}

// TestClusterEveryPrimitive runs every primitive on a 3-master Redis
// Cluster, on names spread over all three masters, with waiters that must be
// woken (not just time out): the scripts, the sharded wake-up channels and the
// hand-overs all have to reach the right node.
func TestClusterEveryPrimitive(t *testing.T) {
	nodes := redistest.Cluster(t, 3)
	rdb := redistest.ClusterClient(t, nodes)
	ctx := ctxT(t, 60*time.Second)
	var clients []*dlock.Client
	for i := 0; i < 2; i++ {
		c := newDlock(t, rdb)
		t.Cleanup(func() { _ = c.Close() })
		clients = append(clients, c)
	}
	// handOffs holds for 2ms, far shorter than the TTL: a waiter that is not
	// woken waits for the holder's whole TTL (default mode) or a refresh (a
	// line at Redis), which the elapsed-time check below would show.
	kinds := []struct {
		kind string
		lock func(c *dlock.Client, name string) (*dlock.Lease, error)
	}{
		{"mutex", func(c *dlock.Client, n string) (*dlock.Lease, error) { return c.Mutex(n).Lock(ctx) }},
		{"fair", func(c *dlock.Client, n string) (*dlock.Lease, error) { return c.Mutex(n, dlock.Fair()).Lock(ctx) }},
		{"rw", func(c *dlock.Client, n string) (*dlock.Lease, error) { return c.RWMutex(n).Lock(ctx) }},
		{"sem", func(c *dlock.Client, n string) (*dlock.Lease, error) { return c.Semaphore(n, 2).Acquire(ctx, 2) }},
	}
	var rwNames []string
	for _, k := range kinds {
		names := namesOnEveryNode(t, ctx, rdb, 3, k.kind+"-")
		if k.kind == "rw" {
			rwNames = names
		}
		for _, name := range names {
			var last uint64
			el := handOffs(t, ctx, clients, &last, func(c *dlock.Client) (*dlock.Lease, error) { return k.lock(c, name) })
			// 80 holds of 2ms; waking by message keeps it far below the
			// 333ms refresh or 10s TTL a missed wake-up would cost each time.
			if el > 5*time.Second {
				t.Fatalf("%s on %s: 80 hand-offs took %v: waiters are not woken", k.kind, name, el)
			}
			t.Logf("%s on %s: 80 hand-offs in %v", k.kind, name, el)
		}
	}
	// Fault 15 on a cluster: every master forgets its scripts; every
	// primitive reloads them on whichever master its name lives.
	for _, n := range nodes {
		n.Do(t, "SCRIPT", "FLUSH")
	}
	for _, k := range kinds {
		for _, name := range namesOnEveryNode(t, ctx, rdb, 3, k.kind+"-") {
			l, err := k.lock(clients[0], name)
			if err != nil {
				t.Fatalf("%s on %s after SCRIPT FLUSH: %v", k.kind, name, err)
			}
			if err := l.Extend(ctx, 5*time.Second); err != nil {
				t.Fatalf("%s on %s: Extend after SCRIPT FLUSH: %v", k.kind, name, err)
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatalf("%s on %s: Unlock after SCRIPT FLUSH: %v", k.kind, name, err)
			}
		}
		for _, n := range nodes {
			n.Do(t, "SCRIPT", "FLUSH")
		}
	}
	// Readers share on a cluster too, and a name is one primitive there.
	r1, err := clients[0].RWMutex(rwNames[1]).RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := clients[1].RWMutex(rwNames[1]).TryRLock(ctx)
	if err != nil {
		t.Fatalf("second reader on a cluster: %v", err)
	}
	if _, err := clients[1].Mutex(rwNames[1]).TryLock(ctx); !errors.Is(err, dlock.ErrForeignKey) {
		t.Fatalf("mutex on an rwmutex name: %v", err)
	}
	_ = r1.Unlock(ctx)
	_ = r2.Unlock(ctx)
}
