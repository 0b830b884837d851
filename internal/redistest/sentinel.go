package redistest

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/redisproc"
)

// SentinelMaster is the name the sentinels of Replicated monitor.
const SentinelMaster = "mymaster"

// Replicated is topology R: a primary, one replica and three sentinels
// (quorum 2, down after 1s) monitoring it as SentinelMaster.
type Replicated struct {
	Primary, Replica *Server
	Sentinels        []*Server
}

// StartReplicated starts topology R and waits until the replica is in sync
// and every sentinel knows both servers and the other sentinels.
func StartReplicated(t testing.TB) *Replicated {
	t.Helper()
	r := &Replicated{Primary: Start(t)}
	r.Replica = Start(t, Options{Args: []string{"--replicaof", "127.0.0.1", strconv.Itoa(r.Primary.Port())}})
	r.Sentinels = Masters(t, 3, Options{Sentinel: true})
	for _, s := range r.Sentinels {
		s.Do(t, "SENTINEL", "MONITOR", SentinelMaster, "127.0.0.1", r.Primary.Port(), 2)
		s.Do(t, "SENTINEL", "SET", SentinelMaster, "down-after-milliseconds", "1000", "failover-timeout", "3000")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	waitFor(t, ctx, "the replica to sync", func() bool {
		return redisproc.InfoField(r.Replica.info(ctx), "master_link_status") == "up"
	})
	for _, s := range r.Sentinels {
		c := s.client()
		waitFor(t, ctx, "sentinel "+s.Addr()+" to see the replica and the other sentinels", func() bool {
			m, err := c.Do(ctx, "SENTINEL", "MASTER", SentinelMaster).Result()
			if err != nil {
				return false
			}
			f := fields(m)
			return f["num-slaves"] == "1" && f["num-other-sentinels"] == "2"
		})
		_ = c.Close()
	}
	return r
}

// Addrs returns the sentinels' addresses.
func (r *Replicated) Addrs() []string {
	var a []string
	for _, s := range r.Sentinels {
		a = append(a, s.Addr())
	}
	return a
}

// Client returns a go-redis failover client (through the sentinels), closed
// when the test ends.
func (r *Replicated) Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: SentinelMaster, SentinelAddrs: r.Addrs()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Failover asks a sentinel to promote the replica and waits until every
// sentinel names it the primary and it accepts writes.
func (r *Replicated) Failover(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r.Sentinels[0].Do(t, "SENTINEL", "FAILOVER", SentinelMaster)
	want := strconv.Itoa(r.Replica.Port())
	for _, s := range r.Sentinels {
		c := s.client()
		waitFor(t, ctx, "sentinel "+s.Addr()+" to name the replica primary", func() bool {
			a, err := c.Do(ctx, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SentinelMaster).StringSlice()
			return err == nil && len(a) == 2 && a[1] == want
		})
		_ = c.Close()
	}
	waitFor(t, ctx, "the promoted replica to be a primary", func() bool {
		return redisproc.InfoField(r.Replica.info(ctx), "role") == "master"
	})
	r.Primary, r.Replica = r.Replica, r.Primary
}

func (s *Server) client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: s.Addr(), PoolSize: 1, DisableIdentity: true})
}

func (s *Server) info(ctx context.Context) string {
	c := s.client()
	defer c.Close()
	v, _ := c.Info(ctx).Result()
	return v
}

// fields turns a flat [k1 v1 k2 v2 ...] or map reply into a map.
func fields(v any) map[string]string {
	out := map[string]string{}
	switch x := v.(type) {
	case []any:
		for i := 0; i+1 < len(x); i += 2 {
			out[fmt.Sprint(x[i])] = fmt.Sprint(x[i+1])
		}
	case map[any]any:
		for k, val := range x {
			out[fmt.Sprint(k)] = fmt.Sprint(val)
		}
	}
	return out
}

// waitFor polls cond every 50ms until it holds or ctx ends (then it fails t).
func waitFor(t testing.TB, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("redistest: timed out waiting for %s", what)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
