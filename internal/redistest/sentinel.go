package redistest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/faultproxy"
	"github.com/dlock-go/dlock/internal/redisproc"
)

// SentinelMaster is the name the sentinels of Replicated monitor.
const SentinelMaster = "mymaster"

// Replicated is topology R: a primary, one replica and three sentinels
// (quorum 2, down after 1s) monitoring it as SentinelMaster.
type Replicated struct {
	Primary, Replica *Server
	Sentinels        []*Server
	// Link is the fault proxy the replica replicates through (from
	// StartReplicatedVia): hold, drop or reset it to cut the replication
	// link. Nil when the replica connects to the primary directly.
	Link *faultproxy.Proxy
}

// Failover timeouts the sentinels are given. A sentinel rewrites the
// configuration of a replica that names a master at another address than
// its own record (+fix-slave-config) once failover-timeout has passed
// since it last saw that replica change: a replica that replicates through
// Link would be pointed at the primary directly. So with a Link the
// timeout is longer than any test; CrashPrimary shortens it while a
// primary is down, which is when the sentinels vote (a split vote is
// retried after twice the timeout) and when none of them rewrites a
// replica (they do so only while the master looks sane).
const (
	failoverTimeout     = 3 * time.Second
	failoverTimeoutLink = 10 * time.Minute
)

// StartReplicated starts topology R and waits until the replica is in sync
// and every sentinel knows both servers and the other sentinels.
func StartReplicated(t testing.TB) *Replicated {
	t.Helper()
	return startReplicated(t, false)
}

// StartReplicatedVia starts topology R with the replica replicating
// through a fault proxy, r.Link: the replica is started with --replicaof
// the proxy's port, so the test can hold, drop or reset the replication
// stream while clients and sentinels talk to both servers directly. The
// replica announces its own port (REPLCONF listening-port), so the
// sentinels list it, and promote it, at its real address.
func StartReplicatedVia(t testing.TB) *Replicated {
	t.Helper()
	return startReplicated(t, true)
}

func startReplicated(t testing.TB, via bool) *Replicated {
	t.Helper()
	// Both servers may become the primary. A full sync starts at once
	// rather than after Redis's default 5s wait for more replicas to come.
	r := &Replicated{Primary: Start(t, Options{Args: fastSync})}
	timeout := failoverTimeout
	if via {
		timeout = failoverTimeoutLink
	}
	r.Replica, r.Link = StartReplica(t, r.Primary, via)
	r.Sentinels = Masters(t, 3, Options{Sentinel: true})
	for _, s := range r.Sentinels {
		s.Do(t, "SENTINEL", "MONITOR", SentinelMaster, "127.0.0.1", r.Primary.Port(), 2)
		s.Do(t, "SENTINEL", "SET", SentinelMaster, "down-after-milliseconds", "1000",
			"failover-timeout", strconv.FormatInt(timeout.Milliseconds(), 10))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
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

// fastSync makes a full sync start at once rather than after Redis's
// default 5s wait for more replicas to come; given to every server that may
// be a primary.
var fastSync = []string{"--repl-diskless-sync-delay", "0"}

// StartReplica starts a replica of primary, through a fault proxy (link)
// if via: the test can then hold, drop or reset the replication stream
// while clients talk to both servers directly. It returns once the replica
// is in sync and the primary counts it among its replicas (so that WAIT
// does).
func StartReplica(t testing.TB, primary *Server, via bool) (replica *Server, link *faultproxy.Proxy) {
	t.Helper()
	// The full sync starts at once (see fastSync), whatever primary was
	// started with.
	pc := primary.client()
	err := pc.ConfigSet(context.Background(), "repl-diskless-sync-delay", "0").Err()
	_ = pc.Close()
	if err != nil {
		t.Fatalf("redistest: CONFIG SET repl-diskless-sync-delay on %s: %v", primary.Addr(), err)
	}
	upstream := primary.Port()
	if via {
		link = startLink(t, primary)
		upstream = link.Port()
	}
	replica = Start(t, Options{Args: append(append([]string(nil), fastSync...), "--replicaof", "127.0.0.1", strconv.Itoa(upstream))})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	waitFor(t, ctx, "the replica to sync", func() bool {
		return redisproc.InfoField(replica.info(ctx), "master_link_status") == "up"
	})
	awaitInStep(t, ctx, primary, replica, "redistest:probe")
	return replica, link
}

// awaitInStep waits until replica acknowledges primary's writes: after a
// diskless sync the primary streams its writes to the replica (and counts
// it for WAIT) only from the replica's first acknowledgement, which it
// sends once a second, though INFO says online before (a test's first
// WAIT was seen to time out). A SET and DEL of key, which primary must
// serve, so that no key is left (none: a master without slots, not waited
// for), then a WAIT, which asks every replica for its offset: the
// replica's own acknowledged offset (INFO's offset= for its port) must
// have reached the primary's after the DEL. (A WAIT's count alone would
// be answered by another replica already in step.)
func awaitInStep(t testing.TB, ctx context.Context, primary, replica *Server, key string) {
	t.Helper()
	if key == "" {
		return
	}
	port := strconv.Itoa(replica.Port())
	pc := primary.client() // one connection: WAIT waits for its writes
	defer pc.Close()
	waitFor(t, ctx, "replica "+replica.Addr()+" to acknowledge the writes of "+primary.Addr(), func() bool {
		online, _ := replicaOnline(pc.Info(ctx).Val(), port)
		if !online {
			return false
		}
		if pc.Set(ctx, key, "", 0).Err() != nil || pc.Del(ctx, key).Err() != nil {
			return false
		}
		want, err := strconv.ParseInt(redisproc.InfoField(pc.Info(ctx).Val(), "master_repl_offset"), 10, 64)
		if err != nil {
			return false
		}
		n, err := strconv.Atoi(redisproc.InfoField(pc.Info(ctx).Val(), "connected_slaves"))
		if err != nil || n < 1 {
			return false
		}
		if pc.Wait(ctx, n, 100*time.Millisecond).Err() != nil {
			return false
		}
		online, acked := replicaOnline(pc.Info(ctx).Val(), port)
		return online && acked >= want
	})
}

// replicaOnline reports whether a primary's INFO lists the replica that
// listens on port as online ("slaveN:ip=...,port=PORT,state=online,
// offset=OFF,..."), and the offset it last acknowledged.
func replicaOnline(info, port string) (bool, int64) {
	for line := range strings.SplitSeq(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(k, "slave") || k == "slave_read_repl_offset" {
			continue
		}
		f := map[string]string{}
		for kv := range strings.SplitSeq(v, ",") {
			if a, b, ok := strings.Cut(kv, "="); ok {
				f[a] = b
			}
		}
		if f["port"] == port && f["state"] == "online" {
			off, _ := strconv.ParseInt(f["offset"], 10, 64)
			return true, off
		}
	}
	return false, 0
}

// startLink starts a fault proxy to s, closed when the test ends.
func startLink(t testing.TB, s *Server) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.Start(s.Addr())
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return p
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
	c := NewFailoverClient(&redis.FailoverOptions{MasterName: SentinelMaster, SentinelAddrs: r.Addrs()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// failovers remembers the options of the failover clients NewFailoverClient
// made, by client.
var failovers sync.Map

// NewFailoverClient is redis.NewFailoverClient, and remembers o for
// FailoverOptionsOf: a test that makes a client of another library to the
// same servers needs the sentinels and the master's name, which a go-redis
// failover client does not tell.
func NewFailoverClient(o *redis.FailoverOptions) *redis.Client {
	c := redis.NewFailoverClient(o)
	failovers.Store(c, o)
	return c
}

// FailoverOptionsOf returns the options NewFailoverClient made c with.
func FailoverOptionsOf(c *redis.Client) (*redis.FailoverOptions, bool) {
	o, ok := failovers.Load(c)
	if !ok {
		return nil, false
	}
	return o.(*redis.FailoverOptions), true
}

// Failover asks a sentinel to promote the replica and waits until every
// sentinel names it the primary and it accepts writes.
func (r *Replicated) Failover(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), topologyTimeout)
	defer cancel()
	r.Sentinels[0].Do(t, "SENTINEL", "FAILOVER", SentinelMaster)
	r.awaitPromoted(t, ctx)
	r.Primary, r.Replica = r.Replica, r.Primary
}

// CrashPrimary kills the primary with SIGKILL (whatever it had not yet
// sent to the replica is lost with it) and waits, at most 30s, until the
// sentinels have found it down (after down-after-milliseconds) and
// promoted the replica on their own: every sentinel names the replica the
// primary and it accepts writes. Then r.Primary is the promoted replica
// and r.Replica the killed server, which Rejoin restarts. It returns how
// long the promotion took, from the kill.
func (r *Replicated) CrashPrimary(t testing.TB) time.Duration {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), topologyTimeout)
	defer cancel()
	start := time.Now()
	r.Primary.Kill()
	if r.Link != nil {
		r.setFailoverTimeout(t, ctx, failoverTimeout, true)
	}
	r.awaitPromoted(t, ctx)
	took := time.Since(start)
	if r.Link != nil {
		r.setFailoverTimeout(t, ctx, failoverTimeoutLink, false)
	}
	r.Primary, r.Replica = r.Replica, r.Primary
	return took
}

// setFailoverTimeout gives every sentinel failover-timeout d; with
// afterDown, each only once it has found the primary down or already
// promoted the replica (see failoverTimeoutLink).
func (r *Replicated) setFailoverTimeout(t testing.TB, ctx context.Context, d time.Duration, afterDown bool) {
	t.Helper()
	promoted := strconv.Itoa(r.Replica.Port())
	for _, s := range r.Sentinels {
		if afterDown {
			c := s.client()
			waitFor(t, ctx, "sentinel "+s.Addr()+" to find the primary down", func() bool {
				m, err := c.Do(ctx, "SENTINEL", "MASTER", SentinelMaster).Result()
				f := fields(m)
				return err == nil && (strings.Contains(f["flags"], "s_down") || f["port"] == promoted)
			})
			_ = c.Close()
		}
		s.Do(t, "SENTINEL", "SET", SentinelMaster, "failover-timeout", strconv.FormatInt(d.Milliseconds(), 10))
	}
}

// awaitPromoted waits until every sentinel names the replica the primary,
// has had a reply to a PING from it since, and the replica has become one.
//
// The reply matters: a sentinel that switches to a new primary counts a
// PING as pending from the switch on, but may send it only up to a second
// later, so with down-after-milliseconds 1000 it can find the new primary
// down for a moment. When every sentinel switched at once, that is a
// quorum, and they would fail over again to any replica they have (a
// rejoined old primary, say).
func (r *Replicated) awaitPromoted(t testing.TB, ctx context.Context) {
	t.Helper()
	want := strconv.Itoa(r.Replica.Port())
	for _, s := range r.Sentinels {
		c := s.client()
		waitFor(t, ctx, "sentinel "+s.Addr()+" to name the replica primary and hear from it", func() bool {
			m, err := c.Do(ctx, "SENTINEL", "MASTER", SentinelMaster).Result()
			f := fields(m)
			return err == nil && f["port"] == want && f["flags"] == "master" && f["last-ping-sent"] == "0"
		})
		_ = c.Close()
	}
	waitFor(t, ctx, "the promoted replica to be a primary", func() bool {
		return redisproc.InfoField(r.Replica.info(ctx), "role") == "master"
	})
}

// Rejoin restarts the server CrashPrimary killed (r.Replica), empty, as a
// replica of r.Primary (through a new r.Link when the topology has one),
// and waits until it is in sync and every sentinel lists it as a replica
// that is up.
func (r *Replicated) Rejoin(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), topologyTimeout)
	defer cancel()
	r.Replica.Restart(t)
	upstream := r.Primary.Port()
	if r.Link != nil {
		_ = r.Link.Close()
		r.Link = startLink(t, r.Primary)
		upstream = r.Link.Port()
	}
	// At once: a sentinel turns a server it knows as a replica and finds a
	// master into a replica of the primary directly, a few seconds later.
	r.Replica.Do(t, "REPLICAOF", "127.0.0.1", upstream)
	waitFor(t, ctx, "the rejoined replica to sync", func() bool {
		return redisproc.InfoField(r.Replica.info(ctx), "master_link_status") == "up"
	})
	awaitInStep(t, ctx, r.Primary, r.Replica, "redistest:probe")
	port := strconv.Itoa(r.Replica.Port())
	for _, s := range r.Sentinels {
		c := s.client()
		waitFor(t, ctx, "sentinel "+s.Addr()+" to list the rejoined replica", func() bool {
			reps, err := c.Do(ctx, "SENTINEL", "REPLICAS", SentinelMaster).Slice()
			if err != nil {
				return false
			}
			for _, rep := range reps {
				f := fields(rep)
				if f["port"] == port {
					return f["flags"] == "slave" // answering, not down
				}
			}
			return false
		})
		_ = c.Close()
	}
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
