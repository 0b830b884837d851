package redistest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/redisproc"
)

// clusterReadyTimeout bounds how long Cluster waits for every node to agree
// that the cluster is up.
const clusterReadyTimeout = 20 * time.Second

// Cluster starts an n-master Redis Cluster (no replicas) on loopback: the
// 16384 slots are split evenly in order, node i taking the i-th range. Each
// node's cluster bus listens on its port + 10000. It returns the nodes in
// slot order. An Options value may add arguments or make every node speak
// TLS only (Options.TLS), its cluster bus included (tls-cluster yes).
func Cluster(t testing.TB, n int, opts ...Options) []*Server {
	t.Helper()
	if n < 1 {
		t.Fatalf("redistest: Cluster needs at least one node, got %d", n)
	}
	var o Options
	if len(opts) > 1 {
		t.Fatalf("redistest: at most one Options value may be given, got %d", len(opts))
	} else if len(opts) == 1 {
		o = opts[0]
	}
	args := []string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", "2000",
	}
	if o.TLS != nil {
		args = append(args, "--tls-cluster", "yes")
	}
	o.Args = append(args, o.Args...)
	nodes := Masters(t, n, o)
	ctx, cancel := context.WithTimeout(context.Background(), clusterReadyTimeout)
	defer cancel()
	for i, s := range nodes {
		lo, hi := i*16384/n, (i+1)*16384/n-1
		s.Do(t, "CLUSTER", "ADDSLOTSRANGE", lo, hi)
		if i > 0 {
			s.Do(t, "CLUSTER", "MEET", "127.0.0.1", nodes[0].Port())
		}
	}
	for _, s := range nodes {
		rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), TLSConfig: s.TLSConfig()})
		err := waitClusterOK(ctx, rdb, n)
		_ = rdb.Close()
		if err != nil {
			t.Fatalf("redistest: cluster node %s: %v", s.Addr(), err)
		}
	}
	return nodes
}

// waitClusterOK polls CLUSTER INFO until the node knows n nodes, every slot
// is served and the state is ok.
func waitClusterOK(ctx context.Context, rdb *redis.Client, n int) error {
	var last string
	for {
		info, err := rdb.ClusterInfo(ctx).Result()
		if err == nil {
			last = info
			if redisproc.InfoField(info, "cluster_state") == "ok" &&
				redisproc.InfoField(info, "cluster_known_nodes") == strconv.Itoa(n) &&
				redisproc.InfoField(info, "cluster_slots_ok") == "16384" {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster not ready: %w (last CLUSTER INFO: %s)", ctx.Err(), strings.ReplaceAll(last, "\r\n", " "))
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// ClusterClient returns a go-redis cluster client over nodes (over TLS for
// TLS nodes), closed when the test ends.
func ClusterClient(t testing.TB, nodes []*Server) *redis.ClusterClient {
	t.Helper()
	var addrs []string
	for _, s := range nodes {
		addrs = append(addrs, s.Addr())
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, TLSConfig: nodes[0].TLSConfig()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}
