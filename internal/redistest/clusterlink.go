package redistest

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/faultproxy"
	"github.com/dlock-go/dlock/internal/redisproc"
)

// LinkedCluster is a Redis Cluster whose replicas replicate through fault
// proxies, while clients and the cluster bus reach every node directly:
// holding a node's link holds the replication stream to its replicas and
// nothing else.
//
// How: each node has a proxy (its link) in front of its client port and
// announces the proxy's port to the cluster (cluster-announce-port), so a
// replica, which dials the address its master announces, replicates
// through its master's link, whichever node is master after failovers and
// restarts. The cluster bus port is announced as the node's own (its port
// + 10000, cluster-announce-bus-port), so gossip, failure detection and
// failover votes bypass the proxies. The announced addresses are what
// CLUSTER SLOTS and MOVED give clients too, so Client's go-redis client
// dials each link's address as its node's own (Dial): client traffic
// bypasses the proxies as well.
//
// In cluster mode a replica's master cannot be set with REPLICAOF (the
// server refuses it), and CLUSTER REPLICATE takes a node id, not an
// address, so the announced address is the one place to put a proxy.
type LinkedCluster struct {
	// Masters are the masters as started, in slot order, and Replicas
	// each one's replicas; roles change with CrashMaster and Rejoin
	// (MasterOf and ReplicasOf give them as they are now).
	Masters  []*Server
	Replicas [][]*Server
	// Nodes are all the servers, Masters first.
	Nodes []*Server

	links   map[*Server]*faultproxy.Proxy
	real    map[string]string // a link's address -> its node's
	servers map[string]*Server
}

// StartLinkedCluster starts a cluster of masters masters with replicas
// replicas each, as ReplicatedCluster does, with every node behind its
// link (see LinkedCluster). A replica may be promoted however long its
// link was held (cluster-replica-validity-factor 0): a held link must not
// decide whether a failover happens. The node timeout is 1s, so that a
// killed master is replaced within about 3s (less than the leases of the
// fault tests that use it live).
func StartLinkedCluster(t testing.TB, masters, replicas int) *LinkedCluster {
	t.Helper()
	c := &LinkedCluster{
		links:   map[*Server]*faultproxy.Proxy{},
		real:    map[string]string{},
		servers: map[string]*Server{},
	}
	extra := []string{"--cluster-node-timeout", "1000", "--cluster-replica-validity-factor", "0"} // and fastSync, as every replicated cluster
	c.Masters, c.Replicas = replicatedCluster(t, masters, replicas, extra, func(s *Server) {
		link := startLink(t, s)
		c.links[s] = link
		c.real[link.Addr()] = s.Addr()
		c.announce(t, s)
	})
	c.Nodes = slices.Clone(c.Masters)
	for _, rs := range c.Replicas {
		c.Nodes = append(c.Nodes, rs...)
	}
	for _, s := range c.Nodes {
		c.servers[NodeID(t, s)] = s
	}
	return c
}

// announce makes s announce its link's port, and its own bus port.
func (c *LinkedCluster) announce(t testing.TB, s *Server) {
	t.Helper()
	s.Do(t, "CONFIG", "SET",
		"cluster-announce-port", c.links[s].Port(),
		"cluster-announce-bus-port", s.Port()+10000)
}

// Link returns the proxy in front of s: s's replicas replicate through it.
func (c *LinkedCluster) Link(s *Server) *faultproxy.Proxy { return c.links[s] }

// Dial dials addr, or the node behind it if it is a link's address: the
// Dialer of Client.
func (c *LinkedCluster) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if a, ok := c.real[addr]; ok {
		addr = a
	}
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// Client returns a new go-redis cluster client that reaches the nodes
// directly (see Dial), closed when the test ends.
func (c *LinkedCluster) Client(t testing.TB) *redis.ClusterClient {
	t.Helper()
	var addrs []string
	for _, s := range c.Nodes {
		addrs = append(addrs, s.Addr())
	}
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, Dialer: c.Dial})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// view returns CLUSTER NODES of a node that runs.
func (c *LinkedCluster) view(t testing.TB, ctx context.Context) []ClusterNode {
	t.Helper()
	for _, s := range c.Nodes {
		if s.PID() != 0 {
			return clusterView(t, ctx, s)
		}
	}
	t.Fatalf("redistest: no node of the cluster runs")
	return nil
}

// MasterOf returns the node that serves key's slot now.
func (c *LinkedCluster) MasterOf(t testing.TB, key string) *Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	slot := KeySlot(t, c.Nodes[0], key)
	for _, n := range c.view(t, ctx) {
		if !n.Replica() && n.Serves(slot) {
			return c.servers[n.ID]
		}
	}
	t.Fatalf("redistest: no node serves slot %d (key %q)", slot, key)
	return nil
}

// ReplicasOf returns m's replicas now.
func (c *LinkedCluster) ReplicasOf(t testing.TB, m *Server) []*Server {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	id := NodeID(t, m)
	var rs []*Server
	for _, n := range c.view(t, ctx) {
		if n.Replica() && n.Master == id {
			rs = append(rs, c.servers[n.ID])
		}
	}
	return rs
}

// running returns the nodes that run.
func (c *LinkedCluster) running() []*Server {
	var up []*Server
	for _, s := range c.Nodes {
		if s.PID() != 0 {
			up = append(up, s)
		}
	}
	return up
}

// CrashMaster kills master m with SIGKILL (whatever it had not yet sent to
// its replicas is lost with it) and waits, at most 30s, until the cluster
// has found it failed and promoted one of its replicas on its own: every
// running node names that replica the master of m's slots, and it accepts
// writes. It returns the promoted replica and how long the promotion took,
// from the kill.
func (c *LinkedCluster) CrashMaster(t testing.TB, m *Server) (promoted *Server, took time.Duration) {
	t.Helper()
	return c.failMaster(t, m, "killed", m.Kill)
}

// PauseMaster stops master m with SIGSTOP and waits, as CrashMaster does,
// until the cluster has promoted one of its replicas. m keeps its
// connections and its data: what clients and the other nodes send it
// waits, unread, until the test resumes it (m.Resume), when it may run
// its clients' commands before it learns that it was replaced.
// WaitReplica waits until it is its replacement's replica.
func (c *LinkedCluster) PauseMaster(t testing.TB, m *Server) (promoted *Server, took time.Duration) {
	t.Helper()
	return c.failMaster(t, m, "stopped", m.Pause)
}

// failMaster is CrashMaster and PauseMaster: stop takes master m down, as
// what says.
func (c *LinkedCluster) failMaster(t testing.TB, m *Server, what string, stop func()) (promoted *Server, took time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), topologyTimeout)
	defer cancel()
	id := NodeID(t, m)
	var slot = -1
	replicas := map[string]bool{}
	for _, n := range c.view(t, ctx) {
		switch {
		case n.ID == id && len(n.Slots) > 0:
			slot = n.Slots[0][0]
		case n.Replica() && n.Master == id:
			replicas[n.ID] = true
		}
	}
	if slot < 0 || len(replicas) == 0 {
		t.Fatalf("redistest: %s is not a master with slots and a replica", m.Addr())
	}
	// A stopped node would not answer CLUSTER NODES: ask the others.
	others := slices.DeleteFunc(c.running(), func(s *Server) bool { return s == m })
	start := time.Now()
	stop()
	var newID string
	waitTopology(t, ctx, others, fmt.Sprintf("every node to give slot %d to a replica of the %s %s", slot, what, m.Addr()), func(view []ClusterNode) bool {
		for _, n := range view {
			if !n.Replica() && n.Serves(slot) {
				if !replicas[n.ID] || (newID != "" && n.ID != newID) {
					return false
				}
				newID = n.ID
				return true
			}
		}
		return false
	})
	promoted = c.servers[newID]
	waitFor(t, ctx, "the promoted replica "+promoted.Addr()+" to be a master", func() bool {
		return redisproc.InfoField(promoted.info(ctx), "role") == "master"
	})
	return promoted, time.Since(start)
}

// Rejoin restarts s, a node CrashMaster killed, with its data directory
// (so it knows the cluster) and without its data: it finds its slots
// taken by its promoted replica and becomes that node's replica, through
// the node's link. Its own link, held or not, is released and announced
// again. Rejoin returns once s is a replica again (see WaitReplica).
func (c *LinkedCluster) Rejoin(t testing.TB, s *Server) {
	t.Helper()
	s.Restart(t)
	c.announce(t, s)
	c.links[s].Release(faultproxy.Both)
	c.WaitReplica(t, s)
}

// WaitReplica waits, at most 30s, until s replicates a master (s may be a
// master the cluster replaced, see Rejoin and PauseMaster): s is in sync,
// its master lists it as online (so that WAIT counts it) and every node
// sees it as a replica that is not failing.
func (c *LinkedCluster) WaitReplica(t testing.TB, s *Server) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), topologyTimeout)
	defer cancel()
	id := NodeID(t, s)
	var master *Server
	waitFor(t, ctx, s.Addr()+" to replicate, in sync", func() bool {
		info := s.info(ctx)
		if redisproc.InfoField(info, "role") != "slave" || redisproc.InfoField(info, "master_link_status") != "up" {
			return false
		}
		for _, n := range clusterView(t, ctx, s) {
			if n.ID == id && n.Replica() {
				master = c.servers[n.Master]
			}
		}
		return master != nil
	})
	// The master names its replicas by the port they listen on.
	waitFor(t, ctx, "the master "+master.Addr()+" to list "+s.Addr()+" online", func() bool {
		online, _ := replicaOnline(master.info(ctx), strconv.Itoa(s.Port()))
		return online
	})
	mid := NodeID(t, master)
	for _, n := range clusterView(t, ctx, master) {
		if n.ID == mid {
			awaitInStep(t, ctx, master, s, probeKey(n.Serves))
		}
	}
	waitTopology(t, ctx, c.running(), "every node to see "+s.Addr()+" as a replica", func(view []ClusterNode) bool {
		for _, n := range view {
			if n.ID == id {
				return n.Replica() && !slices.Contains(n.Flags, "fail") && !slices.Contains(n.Flags, "fail?")
			}
		}
		return false
	})
}
