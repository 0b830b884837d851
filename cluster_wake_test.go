package dlock_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// wakeBound is how long after a fault (once the cluster serves every slot
// again) a contended Lock must be woken by message again: the hub retries a
// refused or dropped subscription within its backoff (at most 1s), checks
// the slot map every second and reloads it every 5 (docs/SAFETY.md).
const wakeBound = 20 * time.Second

// clusterWake is a 3-master Cluster, one replica each, with two Clients:
// a holds, b waits.
type clusterWake struct {
	masters []*redistest.Server
	nodes   []*redistest.Server
	replica [][]*redistest.Server
	rdb     *redis.ClusterClient
	a, b    *dlock.Client
	names   []string // perMaster names on every master, each in a slot of its own
}

func startClusterWake(t *testing.T, perMaster int) *clusterWake {
	t.Helper()
	w := &clusterWake{}
	w.masters, w.replica = redistest.ReplicatedCluster(t, 3, 1)
	w.nodes = append([]*redistest.Server(nil), w.masters...)
	for _, rs := range w.replica {
		w.nodes = append(w.nodes, rs...)
	}
	w.rdb = redistest.ClusterClient(t, w.masters)
	w.a, w.b = newDlock(t, w.rdb), newDlock(t, w.rdb)
	t.Cleanup(func() { _ = w.a.Close(); _ = w.b.Close() })
	count := map[*redistest.Server]int{}
	slots := map[int]bool{}
	for i := 0; i < 10000 && len(w.names) < 3*perMaster; i++ {
		name := fmt.Sprintf("wake-%d", i)
		s := w.owner(t, name)
		slot := redistest.KeySlot(t, w.masters[0], "dlock:{"+name+"}")
		if count[s] < perMaster && !slots[slot] {
			count[s]++
			slots[slot] = true
			w.names = append(w.names, name)
		}
	}
	if len(w.names) < 3*perMaster {
		t.Fatalf("found only %d names", len(w.names))
	}
	return w
}

// owner returns the master that serves name's keys now.
func (w *clusterWake) owner(t *testing.T, name string) *redistest.Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	node, err := w.rdb.MasterForKey(ctx, "dlock:{"+name+"}")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range w.nodes {
		if s.Addr() == node.Options().Addr {
			return s
		}
	}
	t.Fatalf("no server at %s", node.Options().Addr)
	return nil
}

// contend makes a hold name and b wait for it, asleep in line: it returns
// a's lease and b's pending Lock.
func (w *clusterWake) contend(t *testing.T, ctx context.Context, name string) (*dlock.Lease, <-chan lockResult) {
	t.Helper()
	held, err := w.a.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatalf("a's Lock of %s: %v", name, err)
	}
	return held, w.waitFor(t, ctx, name)
}

type lockResult struct {
	l   *dlock.Lease
	err error
}

// waitFor starts b's Lock of name and waits until it sleeps in line.
func (w *clusterWake) waitFor(t *testing.T, ctx context.Context, name string) <-chan lockResult {
	t.Helper()
	res := make(chan lockResult, 1)
	go func() {
		l, err := w.b.Mutex(name).Lock(ctx)
		res <- lockResult{l, err}
	}()
	waitFor(t, ctx, "b asleep in the line of "+name, func() bool {
		n, asleep := dlock.QueuedLocally(w.b, name)
		return n == 1 && asleep
	})
	return res
}

// handOver unlocks held and returns b's lease once its Lock has returned,
// and whether a hand-over message woke it.
func (w *clusterWake) handOver(t *testing.T, ctx context.Context, held *dlock.Lease, res <-chan lockResult) (*dlock.Lease, bool) {
	t.Helper()
	before := dlock.HandOversHeard(w.b)
	if err := held.Unlock(ctx); err != nil {
		t.Fatalf("a's Unlock of %s: %v", held.Name(), err)
	}
	select {
	case r := <-res:
		if r.err != nil {
			t.Fatalf("b's Lock of %s: %v", held.Name(), r.err)
		}
		return r.l, dlock.HandOversHeard(w.b) > before
	case <-ctx.Done():
		t.Fatalf("b's Lock of %s never returned", held.Name())
		return nil, false
	}
}

// resumed hands name over from held to the waiter res that waited through
// a fault, once b's hand-over channel is subscribed again on the master
// that serves name now; then hand-overs of name must come by message.
func (w *clusterWake) resumed(t *testing.T, ctx context.Context, name string, held *dlock.Lease, res <-chan lockResult) {
	t.Helper()
	s := w.owner(t, name)
	waitFor(t, ctx, "b's hand-over channel of "+name+" subscribed on "+s.Addr()+" again", func() bool {
		chans, _ := s.Do(t, "PUBSUB", "SHARDCHANNELS", "dlock:{"+name+"}:c:*").([]any)
		return len(chans) > 0
	})
	l, heard := w.handOver(t, ctx, held, res)
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("b's Unlock of %s: %v", name, err)
	}
	if !heard {
		// The look that the hub's Gap (after the resubscription) asks
		// for may find the hand-over first: it returned, which counts.
		t.Logf("%s: the waiter that waited through the fault found its hand-over by a look", name)
	}
	w.wokenByMessage(t, name)
}

// wokenByMessage hands name from a to b until one hand-over reaches b by
// message (not found by b's own look), within wakeBound. It fails the test
// if none does.
func (w *clusterWake) wokenByMessage(t *testing.T, name string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wakeBound)
	defer cancel()
	for round := 1; ; round++ {
		held, res := w.contend(t, ctx, name)
		l, heard := w.handOver(t, ctx, held, res)
		if err := l.Unlock(ctx); err != nil {
			t.Fatalf("b's Unlock of %s: %v", name, err)
		}
		if heard {
			return
		}
		t.Logf("%s: hand-over %d was found by a look, not by message", name, round)
		if ctx.Err() != nil {
			t.Fatalf("%s: no hand-over by message within %v", name, wakeBound)
		}
	}
}

func (w *clusterWake) allWokenByMessage(t *testing.T) {
	t.Helper()
	for _, name := range w.names {
		w.wokenByMessage(t, name)
	}
}

// TestClusterWaitersWokenAfterFaults: contended Locks on many names spread
// over many slots of every master are woken by message; after each fault a
// Cluster goes through (every pub/sub connection killed, a slot migrated
// while a waiter waits, a master failed over while a waiter waits, a slot
// unserved while a waiter starts), the waiter that was waiting returns, and
// hand-overs come by message again within wakeBound.
func TestClusterWaitersWokenAfterFaults(t *testing.T) {
	w := startClusterWake(t, 4)
	ctx := ctxT(t, 3*time.Minute)
	w.allWokenByMessage(t)

	if !t.Run("pubsub connections killed", func(t *testing.T) {
		type pair struct {
			held *dlock.Lease
			res  <-chan lockResult
		}
		var pairs []pair
		for _, name := range w.names {
			held, res := w.contend(t, ctx, name)
			pairs = append(pairs, pair{held, res})
		}
		// Every master drops every subscriber: go-redis alone would
		// resubscribe a connection's channels of many slots in one
		// command, which the node refuses (CROSSSLOT).
		for _, s := range w.masters {
			s.Do(t, "CLIENT", "KILL", "TYPE", "pubsub")
		}
		for i, p := range pairs {
			w.resumed(t, ctx, w.names[i], p.held, p.res)
		}
		w.allWokenByMessage(t)
	}) {
		return
	}

	if !t.Run("slot migrated while waiting", func(t *testing.T) {
		name := w.names[0]
		from := w.owner(t, name)
		to := w.masters[0]
		if to == from {
			to = w.masters[1]
		}
		held, res := w.contend(t, ctx, name)
		redistest.MigrateSlot(t, w.nodes, redistest.KeySlot(t, from, "dlock:{"+name+"}"), from, to)
		waitFor(t, ctx, "the client to place "+name+" on "+to.Addr(), func() bool {
			w.rdb.ReloadState(ctx)
			return w.owner(t, name) == to
		})
		w.resumed(t, ctx, name, held, res)
	}) {
		return
	}

	if !t.Run("master failed over while waiting", func(t *testing.T) {
		name := w.names[len(w.names)-1]
		old := w.owner(t, name)
		var promoted *redistest.Server
		for i, m := range w.masters {
			if m == old {
				promoted = w.replica[i][0]
			}
		}
		if promoted == nil {
			t.Fatalf("%s lives on no original master", name)
		}
		held, res := w.contend(t, ctx, name)
		redistest.ClusterFailover(t, w.nodes, promoted)
		// Every node sees the failover; the client's slot map follows at
		// its next reload.
		waitFor(t, ctx, "the client to place "+name+" on the promoted replica", func() bool {
			w.rdb.ReloadState(ctx)
			return w.owner(t, name) == promoted
		})
		w.resumed(t, ctx, name, held, res)
		for _, n := range w.names {
			if n != name && w.owner(t, n) == promoted {
				w.wokenByMessage(t, n)
			}
		}
	}) {
		return
	}

	if !t.Run("slot unserved while a waiter starts", func(t *testing.T) {
		name := w.names[1]
		owner := w.owner(t, name)
		slot := redistest.KeySlot(t, owner, "dlock:{"+name+"}")
		held, err := w.a.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		owner.Do(t, "CLUSTER", "DELSLOTS", slot)
		res := make(chan lockResult, 1)
		go func() {
			l, err := w.b.Mutex(name).Lock(ctx)
			res <- lockResult{l, err}
		}()
		// Unserved for longer than a waiter waits for its subscriptions
		// (1s): the waiter must go on without them, not stall.
		time.Sleep(1500 * time.Millisecond)
		owner.Do(t, "CLUSTER", "ADDSLOTS", slot)
		redistest.WaitSlotOwner(t, w.masters, slot, owner)
		waitFor(t, ctx, "b in line for "+name, func() bool {
			n, asleep := dlock.QueuedLocally(w.b, name)
			return n == 1 && asleep
		})
		w.resumed(t, ctx, name, held, res)
	}) {
		return
	}
}
