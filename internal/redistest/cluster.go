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
// slot order.
func Cluster(t testing.TB, n int) []*Server {
	t.Helper()
	if n < 1 {
		t.Fatalf("redistest: Cluster needs at least one node, got %d", n)
	}
	nodes := Masters(t, n, Options{Args: []string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf",
		"--cluster-node-timeout", "2000",
	}})
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
		rdb := redis.NewClient(&redis.Options{Addr: s.Addr()})
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

// ClusterClient returns a go-redis cluster client over nodes, closed when
// the test ends.
func ClusterClient(t testing.TB, nodes []*Server) *redis.ClusterClient {
	t.Helper()
	var addrs []string
	for _, s := range nodes {
		addrs = append(addrs, s.Addr())
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { _ = c.Close() })
	return c
}
