package redistest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/redisproc"
	"github.com/dlock-go/dlock/internal/wire"
	"github.com/redis/go-redis/v9"
)

// topologyTimeout bounds how long a topology change (a cluster with
// replicas coming up, a slot migration, a failover) may take to be seen by
// every node.
const topologyTimeout = 30 * time.Second

// ReplicatedCluster starts a Redis Cluster of masters masters, each with
// replicas replicas, on loopback. Slots are split evenly in order among the
// masters. It returns the masters in slot order and, for each, its replicas;
// it waits until every node agrees that the cluster is up and every replica
// is in sync with its master.
func ReplicatedCluster(t testing.TB, masters, replicas int) ([]*Server, [][]*Server) {
	t.Helper()
	return replicatedCluster(t, masters, replicas, nil, nil)
}

// replicatedCluster is ReplicatedCluster with extra config arguments for
// every node, and announce, if not nil, called on each node once it runs
// and before the nodes meet (so that the others learn the address it
// announces from its first message).
func replicatedCluster(t testing.TB, masters, replicas int, extra []string, announce func(*Server)) ([]*Server, [][]*Server) {
	t.Helper()
	if masters < 1 || replicas < 0 {
		t.Fatalf("redistest: ReplicatedCluster(%d, %d): need at least one master", masters, replicas)
	}
	all := Masters(t, masters*(1+replicas), Options{Args: append([]string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", "2000",
	}, append(append([]string(nil), fastSync...), extra...)...)})
	if announce != nil {
		for _, s := range all {
			announce(s)
		}
	}
	ms, rest := all[:masters], all[masters:]
	for i, s := range ms {
		s.Do(t, "CLUSTER", "ADDSLOTSRANGE", i*16384/masters, (i+1)*16384/masters-1)
	}
	for _, s := range all[1:] {
		s.Do(t, "CLUSTER", "MEET", "127.0.0.1", all[0].Port())
	}
	ctx, cancel := context.WithTimeout(context.Background(), topologyTimeout)
	defer cancel()
	for _, s := range all {
		rdb := s.client()
		err := waitClusterOK(ctx, rdb, len(all))
		_ = rdb.Close()
		if err != nil {
			t.Fatalf("redistest: cluster node %s: %v", s.Addr(), err)
		}
	}
	rs := make([][]*Server, masters)
	for i, m := range ms {
		rs[i] = rest[i*replicas : (i+1)*replicas]
		id := NodeID(t, m)
		for _, r := range rs[i] {
			r.Do(t, "CLUSTER", "REPLICATE", id)
		}
	}
	for i, m := range ms {
		lo, hi := i*16384/masters, (i+1)*16384/masters-1
		probe := probeKey(func(slot int) bool { return slot >= lo && slot <= hi })
		for _, r := range rs[i] {
			waitFor(t, ctx, "replica "+r.Addr()+" to sync with "+m.Addr(), func() bool {
				return redisproc.InfoField(r.info(ctx), "master_link_status") == "up"
			})
			awaitInStep(t, ctx, m, r, probe)
		}
	}
	waitTopology(t, ctx, all, "every node to see the replicas", func(view []ClusterNode) bool {
		slaves := 0
		for _, n := range view {
			if n.Replica() {
				slaves++
			}
		}
		return slaves == masters*replicas
	})
	return ms, rs
}

// probeKey returns a key whose hash slot serves says a master serves, or
// "" if it seems to serve none.
func probeKey(serves func(slot int) bool) string {
	for i := range 1 << 20 {
		k := "redistest:probe:" + strconv.Itoa(i)
		if serves(int(wire.Slot(k))) {
			return k
		}
	}
	return ""
}

// NodeID returns the server's cluster node id.
func NodeID(t testing.TB, s *Server) string {
	t.Helper()
	id, ok := s.Do(t, "CLUSTER", "MYID").(string)
	if !ok {
		t.Fatalf("redistest: CLUSTER MYID on %s: not a string", s.Addr())
	}
	return id
}

// KeySlot returns the hash slot of key (CLUSTER KEYSLOT on s).
func KeySlot(t testing.TB, s *Server, key string) int {
	t.Helper()
	n, ok := s.Do(t, "CLUSTER", "KEYSLOT", key).(int64)
	if !ok {
		t.Fatalf("redistest: CLUSTER KEYSLOT %q on %s: not an integer", key, s.Addr())
	}
	return int(n)
}

// MigrateSlot moves slot from one master to another the way redis-cli
// --cluster reshard does: IMPORTING on the target, MIGRATING on the source,
// MIGRATE of its keys, then SETSLOT NODE on the target, the source and every
// other master in nodes. It returns once every node in nodes names the target
// as the slot's owner.
func MigrateSlot(t testing.TB, nodes []*Server, slot int, from, to *Server) {
	t.Helper()
	fromID, toID := NodeID(t, from), NodeID(t, to)
	to.Do(t, "CLUSTER", "SETSLOT", slot, "IMPORTING", fromID)
	from.Do(t, "CLUSTER", "SETSLOT", slot, "MIGRATING", toID)
	for range 1000 { // bounded: 100 keys a round
		keys, _ := from.Do(t, "CLUSTER", "GETKEYSINSLOT", slot, 100).([]any)
		if len(keys) == 0 {
			break
		}
		args := []any{"MIGRATE", "127.0.0.1", to.Port(), "", 0, 5000, "KEYS"}
		from.Do(t, append(args, keys...)...)
	}
	to.Do(t, "CLUSTER", "SETSLOT", slot, "NODE", toID)
	from.Do(t, "CLUSTER", "SETSLOT", slot, "NODE", toID)
	ctx, cancel := context.WithTimeout(context.Background(), topologyTimeout)
	defer cancel()
	for _, s := range nodes {
		// Replicas refuse SETSLOT; they follow their masters.
		if s != from && s != to && redisproc.InfoField(s.info(ctx), "role") == "master" {
			s.Do(t, "CLUSTER", "SETSLOT", slot, "NODE", toID)
		}
	}
	WaitSlotOwner(t, nodes, slot, to)
}

// WaitSlotOwner waits until every node in nodes names owner as the master
// serving slot.
func WaitSlotOwner(t testing.TB, nodes []*Server, slot int, owner *Server) {
	t.Helper()
	id := NodeID(t, owner)
	ctx, cancel := context.WithTimeout(context.Background(), topologyTimeout)
	defer cancel()
	waitTopology(t, ctx, nodes, fmt.Sprintf("every node to give slot %d to %s", slot, owner.Addr()), func(view []ClusterNode) bool {
		for _, n := range view {
			if n.Serves(slot) {
				return n.ID == id && !n.Replica()
			}
		}
		return false
	})
}

// ClusterFailover runs CLUSTER FAILOVER on replica (a coordinated manual
// failover: its master stops writes until the replica has caught up) and
// waits until every node in nodes sees replica as a master and its old
// master as a replica.
func ClusterFailover(t testing.TB, nodes []*Server, replica *Server) {
	t.Helper()
	id := NodeID(t, replica)
	ctx, cancel := context.WithTimeout(context.Background(), topologyTimeout)
	defer cancel()
	var master string
	for _, n := range clusterView(t, ctx, replica) {
		if n.ID == id {
			master = n.Master
		}
	}
	if master == "" || master == "-" {
		t.Fatalf("redistest: ClusterFailover: %s is not a replica", replica.Addr())
	}
	replica.Do(t, "CLUSTER", "FAILOVER")
	waitTopology(t, ctx, nodes, "every node to see "+replica.Addr()+" promoted", func(view []ClusterNode) bool {
		promoted, demoted := false, false
		for _, n := range view {
			switch n.ID {
			case id:
				promoted = !n.Replica() && len(n.Slots) > 0
			case master:
				demoted = n.Replica() && n.Master == id
			}
		}
		return promoted && demoted
	})
}

// ClusterNode is one line of CLUSTER NODES.
type ClusterNode struct {
	ID     string
	Addr   string   // ip:port
	Flags  []string // myself, master, slave, fail?, ...
	Master string   // the master's id, or "-"
	Slots  [][2]int // served ranges, first and last slot (migration marks left out)
}

// Replica reports whether the node is a replica.
func (n ClusterNode) Replica() bool {
	for _, f := range n.Flags {
		if f == "slave" {
			return true
		}
	}
	return false
}

// Serves reports whether slot is in one of the node's ranges.
func (n ClusterNode) Serves(slot int) bool {
	for _, r := range n.Slots {
		if r[0] <= slot && slot <= r[1] {
			return true
		}
	}
	return false
}

// ClusterView returns s's CLUSTER NODES.
func ClusterView(t testing.TB, s *Server) []ClusterNode {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return clusterView(t, ctx, s)
}

func clusterView(t testing.TB, ctx context.Context, s *Server) []ClusterNode {
	t.Helper()
	rdb := s.client()
	defer rdb.Close()
	text, err := rdb.ClusterNodes(ctx).Result()
	if err != nil {
		t.Fatalf("redistest: CLUSTER NODES on %s: %v", s.Addr(), err)
	}
	return parseClusterNodes(text)
}

func parseClusterNodes(text string) []ClusterNode {
	var view []ClusterNode
	for line := range strings.SplitSeq(strings.TrimSpace(text), "\n") {
		f := strings.Fields(line)
		if len(f) < 8 {
			continue
		}
		addr, _, _ := strings.Cut(f[1], "@")
		n := ClusterNode{ID: f[0], Addr: addr, Flags: strings.Split(f[2], ","), Master: f[3]}
		for _, r := range f[8:] {
			if strings.HasPrefix(r, "[") {
				continue // a slot being imported or migrated
			}
			lo, hi, _ := strings.Cut(r, "-")
			if hi == "" {
				hi = lo
			}
			a, err1 := strconv.Atoi(lo)
			b, err2 := strconv.Atoi(hi)
			if err1 == nil && err2 == nil {
				n.Slots = append(n.Slots, [2]int{a, b})
			}
		}
		view = append(view, n)
	}
	return view
}

// waitTopology polls every node's CLUSTER NODES until cond holds for each.
func waitTopology(t testing.TB, ctx context.Context, nodes []*Server, what string, cond func([]ClusterNode) bool) {
	t.Helper()
	clients := make([]*redis.Client, len(nodes))
	for i, s := range nodes {
		clients[i] = s.client()
		defer clients[i].Close()
	}
	waitFor(t, ctx, what, func() bool {
		for _, c := range clients {
			text, err := c.ClusterNodes(ctx).Result()
			if err != nil || !cond(parseClusterNodes(text)) {
				return false
			}
		}
		return true
	})
}
