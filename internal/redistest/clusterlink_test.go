package redistest

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/faultproxy"
)

// In a LinkedCluster a held link holds the master's replication stream
// and nothing else: clients and the cluster bus reach the nodes directly.
// After a crash and a rejoin, the old master replicates from the promoted
// one through the promoted one's link.
func TestLinkedCluster(t *testing.T) {
	t.Parallel()
	c := StartLinkedCluster(t, 3, 1)
	rdb := c.Client(t)
	const key = "k"
	m := c.MasterOf(t, key)
	rs := c.ReplicasOf(t, m)
	if len(rs) != 1 {
		t.Fatalf("%d replicas of the key's master, want 1", len(rs))
	}
	for _, n := range ClusterView(t, c.Nodes[0]) {
		s := c.servers[n.ID]
		if want := c.Link(s).Addr(); n.Addr != want {
			t.Errorf("node %s announces %s, want its link's %s", s.Addr(), n.Addr, want)
		}
	}
	if v := c.Nodes[0].Do(t, "CLUSTER", "NODES").(string); !strings.Contains(v, "@"+strconv.Itoa(m.Port()+10000)) {
		t.Errorf("the bus port of %s is not announced as its own:\n%s", m.Addr(), v)
	}

	// wait writes key on the master that serves it and counts the
	// replicas that confirm within d.
	wait := func(m *Server, v string, d time.Duration) int64 {
		t.Helper()
		c := m.client()
		defer c.Close()
		p := c.Pipeline()
		p.Set(ctx(t), key, v, 0)
		w := p.Do(ctx(t), "WAIT", 1, d.Milliseconds())
		if _, err := p.Exec(ctx(t)); err != nil {
			t.Fatalf("SET and WAIT on %s: %v", m.Addr(), err)
		}
		n, _ := w.Int64()
		return n
	}
	if n := wait(m, "1", 5*time.Second); n != 1 {
		t.Fatalf("WAIT with the link open: %d replicas", n)
	}
	c.Link(m).Hold(faultproxy.Both)
	// Clients still reach every node, the held one's included.
	if err := rdb.Set(ctx(t), key, "2", 0).Err(); err != nil {
		t.Fatalf("SET through the cluster client, the link held: %v", err)
	}
	if n := wait(m, "3", 300*time.Millisecond); n != 0 {
		t.Fatalf("WAIT with the link held: %d replicas confirmed", n)
	}
	if v := replicaGet(t, rs[0], key); v != "1" {
		t.Fatalf("the replica has %q with the link held, want the value from before (1)", v)
	}
	// The bus works: the cluster sees no node failing for longer than its
	// node timeout.
	time.Sleep(3 * time.Second)
	for _, n := range ClusterView(t, rs[0]) {
		if strings.Contains(strings.Join(n.Flags, ","), "fail") {
			t.Fatalf("node %s is flagged %v with only the replication link held", n.Addr, n.Flags)
		}
	}

	promoted, took := c.CrashMaster(t, m)
	if promoted != rs[0] {
		t.Fatalf("promoted %s, want the replica %s", promoted.Addr(), rs[0].Addr())
	}
	t.Logf("promoted %v after the kill", took.Round(time.Millisecond))
	if v := replicaGet(t, promoted, key); v != "1" {
		t.Fatalf("the promoted replica has %q, want 1: the held writes were lost with the master", v)
	}
	c.Rejoin(t, m)
	if got := c.ReplicasOf(t, promoted); len(got) != 1 || got[0] != m {
		t.Fatalf("after the rejoin %s's replicas are %v, want the old master", promoted.Addr(), got)
	}
	if n := wait(promoted, "4", 5*time.Second); n != 1 {
		t.Fatalf("WAIT on the promoted master after the rejoin: %d replicas", n)
	}
	c.Link(promoted).Hold(faultproxy.Downstream)
	if n := wait(promoted, "5", 300*time.Millisecond); n != 0 {
		t.Fatalf("WAIT with the promoted master's link held: %d replicas confirmed", n)
	}
	c.Link(promoted).Release(faultproxy.Downstream)
	if v, err := rdb.Get(ctx(t), key).Result(); err != nil || v != "5" {
		t.Fatalf("GET through the cluster client after the failover: %q, %v", v, err)
	}
}

// replicaGet returns GET key on replica s (READONLY on the same
// connection).
func replicaGet(t *testing.T, s *Server, key string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := s.client()
	defer c.Close()
	p := c.Pipeline()
	p.ReadOnly(ctx)
	get := p.Get(ctx, key)
	_, _ = p.Exec(ctx)
	v, err := get.Result()
	if err != nil {
		t.Fatalf("GET %s on %s: %v", key, s.Addr(), err)
	}
	return v
}
