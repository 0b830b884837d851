package hub_test

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/hub"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// cluster is a Cluster with a hub that wants many channels: 200 names
// hashed over many slots of every master, and 8 that share one slot (a hash
// tag), all confirmed, placed and delivering when it is returned.
type cluster struct {
	masters []*redistest.Server
	nodes   []*redistest.Server // masters then replicas
	replica [][]*redistest.Server
	rdb     *redis.ClusterClient
	h       *hub.Hub
	rec     *recorder
	wanted  []string
	hot     []string // the channels of one slot
	slots   map[string]int
}

func startCluster(t *testing.T, replicas int) *cluster {
	t.Helper()
	c := &cluster{}
	c.masters, c.replica = redistest.ReplicatedCluster(t, 3, replicas)
	c.nodes = c.masters
	for _, rs := range c.replica {
		c.nodes = append(c.nodes, rs...)
	}
	c.rdb = redistest.ClusterClient(t, c.masters)
	c.h, c.rec = start(t, c.rdb)
	c.hot = names("{hot}:", 8)
	c.wanted = append(names("lock:", 200), c.hot...)
	c.slots = slotsOf(t, c.masters[0], c.wanted)
	wantAll(t, c.h, c.wanted)
	c.converged(t)
	return c
}

// converged waits until every wanted channel is subscribed on the master of
// its slot and nowhere else, and delivers a message.
func (c *cluster) converged(t *testing.T) {
	t.Helper()
	subscribedOn(t, hub.Sharded, c.nodes, c.wanted, c.slots)
	delivered(t, hub.Sharded, c.rdb, c.rec, c.wanted)
}

// owner returns the master that serves slot now.
func (c *cluster) owner(t *testing.T, slot int) *redistest.Server {
	t.Helper()
	for _, ch := range c.wanted {
		if c.slots[ch] == slot {
			return homes(t, c.nodes, c.slots)(ch)
		}
	}
	t.Fatalf("no wanted channel in slot %d", slot)
	return nil
}

// The pub/sub connections of every node are killed: go-redis would
// resubscribe each connection's channels in one SSUBSCRIBE, which spans many
// slots and is refused with CROSSSLOT; the hub subscribes every channel
// again, one a command, and calls Gap for each.
func TestClusterKillPubSub(t *testing.T) {
	c := startCluster(t, 0)
	for range 2 {
		before := c.rec.gapsOf(c.wanted)
		for _, s := range c.masters {
			killPubSub(t, s)
		}
		gapsAtLeast(t, c.rec, c.wanted, before)
		c.converged(t)
	}
}

// A slot holding wanted channels migrates to another master: the source
// unsubscribes them on its own, and the hub subscribes them on the target;
// Gap comes for them and for no other channel.
func TestClusterMigrateSlot(t *testing.T) {
	c := startCluster(t, 0)
	slot := c.slots[c.hot[0]]
	from := c.owner(t, slot)
	to := c.masters[0]
	if to == from {
		to = c.masters[1]
	}
	before := c.rec.gapsOf(c.wanted)
	redistest.MigrateSlot(t, c.nodes, slot, from, to)
	gapsAtLeast(t, c.rec, c.hot, before[len(c.wanted)-len(c.hot):])
	c.converged(t)
	after := c.rec.gapsOf(c.wanted)
	for i, ch := range c.wanted[:len(c.wanted)-len(c.hot)] {
		if after[i] != before[i] && c.slots[ch] != slot {
			t.Errorf("Gap for %s, whose slot did not move", ch)
		}
	}
}

// A master fails over to its replica (CLUSTER FAILOVER): the channels of
// its slots follow to the new master.
func TestClusterFailover(t *testing.T) {
	c := startCluster(t, 1)
	old := c.owner(t, c.slots[c.hot[0]])
	var promoted *redistest.Server
	for i, m := range c.masters {
		if m == old {
			promoted = c.replica[i][0]
		}
	}
	var moved []string
	for _, ch := range c.wanted {
		if homes(t, c.nodes, c.slots)(ch) == old {
			moved = append(moved, ch)
		}
	}
	before := c.rec.gapsOf(moved)
	redistest.ClusterFailover(t, c.nodes, promoted)
	gapsAtLeast(t, c.rec, moved, before)
	c.converged(t)
	if got := shardChannels(t, old); len(got) != 0 {
		t.Errorf("the demoted master still has %d of our channels", len(got))
	}
}

// A slot holding wanted channels is made unserved (CLUSTER DELSLOTS on its
// master): the node unsubscribes them, and the hub's retries are refused
// (CLUSTERDOWN, or MOVED by the nodes that still think it is served). Once the slot is served again they converge.
func TestClusterRefusedWhileUnserved(t *testing.T) {
	c := startCluster(t, 0)
	slot := c.slots[c.hot[0]]
	owner := c.owner(t, slot)
	rejected := func() int {
		n := 0
		for _, s := range c.masters {
			_, r := commandCalls(t, s, "ssubscribe")
			n += r
		}
		return n
	}
	before, refused := c.rec.gapsOf(c.hot), rejected()
	owner.Do(t, "CLUSTER", "DELSLOTS", slot)
	eventually(t, "the hub's SSUBSCRIBEs refused again and again", func() (bool, string) {
		return rejected() >= refused+3*len(c.hot), "not yet"
	})
	owner.Do(t, "CLUSTER", "ADDSLOTS", slot)
	gapsAtLeast(t, c.rec, c.hot, before)
	c.converged(t)
}

// A master is paused (SIGSTOP) for longer than the hub's read deadline: its
// connection answers no ping, the hub drops it and keeps trying; once the
// master resumes its channels converge and Gap comes for them.
func TestClusterPausedNode(t *testing.T) {
	c := startCluster(t, 0)
	paused := c.owner(t, c.slots[c.hot[0]])
	var mine []string
	for _, ch := range c.wanted {
		if homes(t, c.nodes, c.slots)(ch) == paused {
			mine = append(mine, ch)
		}
	}
	before := c.rec.gapsOf(mine)
	paused.Pause()
	time.Sleep(5 * time.Second) // longer than the hub's 3 s read deadline
	paused.Resume()
	gapsAtLeast(t, c.rec, mine, before)
	c.converged(t)
}
