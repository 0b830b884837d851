package dlock_test

// The topologies of docs/SAFETY.md as the fault tests that run on each of
// them see one: S (one redis-server), R (a primary, its replica and three
// Sentinels, reached through go-redis's failover client) and C (a Redis
// Cluster of three masters). A check of the fault matrix that holds on
// every topology is a function of a site: its S test runs it on a server
// of its own, TestFaultsOnR and TestFaultsOnC run every such check on one
// R and one C (starting either takes about two seconds).

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faultproxy"
	"github.com/dlock-go/dlock/internal/redistest"
)

// dialer makes a go-redis client's connections.
type dialer = func(ctx context.Context, network, addr string) (net.Conn, error)

func dialDirect(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}

// site is a started topology.
type site struct {
	// newRedis returns a new go-redis client of the topology, named name
	// (CLIENT SETNAME), whose connections dial makes (go-redis's own
	// dialer if nil); closed when the test ends.
	newRedis func(t *testing.T, name string, dial dialer) redis.UniversalClient
	// serverOf returns the server that serves key now: S's server, R's
	// primary, the master of key's slot on C.
	serverOf func(t *testing.T, key string) *redistest.Server
	// child is the address a child process dials (see childRedis).
	child string
	// frozen waits for what the topology does while stopped, the server
	// of the lock key, is stopped past a lease's TTL; names are the
	// go-redis client names of the Clients that wait for the lock. resumed
	// (if not nil) checks what it does once stopped runs again. See
	// TestFault14ServerPausedPastTTL.
	frozen  func(t *testing.T, ctx context.Context, stopped *redistest.Server, names []string)
	resumed func(t *testing.T, stopped *redistest.Server, key string)

	made  atomic.Int64
	names map[*dlock.Client]string
}

// siteChecks are the checks of the fault matrix that run on every
// topology, named for their S tests (Test and the name), in the order they
// run on one site: each uses lock names of its own, and the last fails R's
// primary over.
var siteChecks = []struct {
	name  string
	check func(*testing.T, *site)
}{
	{"PausedHolderLosesLease", pausedHolderLosesLease},       // faults 1, 2
	{"ExtendOfATakenLockChangesNothing", extendOfATakenLock}, // fault 2
	{"Fault4AcquireReplyLost", acquireReplyLost},             // fault 4
	{"Fault13ContentionStorm", contentionStorm},              // fault 13
	{"Fault17ReleaseRetry", releaseRetry},                    // fault 17
	{"Fault14ServerPausedPastTTL", serverPausedPastTTL},      // fault 14
}

// TestFaultsOnR runs the checks of siteChecks on topology R, each as a
// subtest named for its S test.
func TestFaultsOnR(t *testing.T) { onSite(t, startR(t)) }

// TestFaultsOnC runs the checks of siteChecks on topology C, each as a
// subtest named for its S test.
func TestFaultsOnC(t *testing.T) { onSite(t, startC(t)) }

func onSite(t *testing.T, s *site) {
	for _, c := range siteChecks {
		t.Run(c.name, func(t *testing.T) { c.check(t, s) })
	}
}

// client returns a new dlock Client of the site and its go-redis client.
func (s *site) client(t *testing.T, opts ...dlock.Option) (*dlock.Client, redis.UniversalClient) {
	t.Helper()
	return s.clientVia(t, nil, opts...)
}

// clients returns n Clients of the site (as n processes would have) and a
// go-redis client for checks.
func (s *site) clients(t *testing.T, n int) ([]*dlock.Client, redis.UniversalClient) {
	t.Helper()
	var cs []*dlock.Client
	for range n {
		c, _ := s.client(t)
		cs = append(cs, c)
	}
	_, rdb := s.client(t)
	return cs, rdb
}

func (s *site) clientVia(t *testing.T, dial dialer, opts ...dlock.Option) (*dlock.Client, redis.UniversalClient) {
	t.Helper()
	name := fmt.Sprintf("dlock-test-%d", s.made.Add(1))
	rdb := s.newRedis(t, name, dial)
	if dial != nil {
		// Through a proxy the test holds, drops or resets what comes
		// after its warm-up: over rueidis, every command on the one
		// connection the warm-up opened (see oneConnOnRueidis).
		oneConnOnRueidis(t, rdb)
	}
	c := newDlock(t, rdb, opts...)
	t.Cleanup(func() { _ = c.Close() })
	if s.names == nil {
		s.names = map[*dlock.Client]string{}
	}
	s.names[c] = name
	return c, rdb
}

// proxied returns a new dlock Client whose connections to the server that
// serves key now go through a fault proxy of their own, and that proxy
// (closed when the test ends); its connections to any other server, and
// to a server that serves key after a failover, are direct.
func (s *site) proxied(t *testing.T, key string, opts ...dlock.Option) (*dlock.Client, *faultproxy.Proxy) {
	t.Helper()
	target := s.serverOf(t, key).Addr()
	p, err := faultproxy.Start(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	c, _ := s.clientVia(t, func(ctx context.Context, network, addr string) (net.Conn, error) {
		if addr == target {
			addr = p.Addr()
		}
		return dialDirect(ctx, network, addr)
	}, opts...)
	return c, p
}

// failoverBound bounds how long a failover may take to be seen: the
// sentinels retry a split vote after twice their failover-timeout (3s).
const failoverBound = 30 * time.Second

// pastTTL is how a topology stays frozen past a lease's TTL when nothing
// else happens: for a second.
func pastTTL(*testing.T, context.Context, *redistest.Server, []string) {
	time.Sleep(time.Second) // frozen past the TTL: the fault under test
}

func startS(t *testing.T) *site {
	t.Helper()
	s := redistest.Start(t)
	return &site{
		child: s.Addr(),
		newRedis: func(t *testing.T, name string, dial dialer) redis.UniversalClient {
			return s.Client(t, func(o *redis.Options) { o.ClientName, o.Dialer = name, dial })
		},
		serverOf: func(*testing.T, string) *redistest.Server { return s },
		frozen:   pastTTL,
	}
}

// startR starts topology R. A primary stopped for longer than the
// sentinels' down-after-milliseconds (1s) is failed over: see frozen and
// resumed below.
func startR(t *testing.T) *site {
	t.Helper()
	r := redistest.StartReplicated(t)
	return &site{
		child: "sentinel:" + strings.Join(r.Addrs(), ","),
		newRedis: func(t *testing.T, name string, dial dialer) redis.UniversalClient {
			c := redistest.NewFailoverClient(&redis.FailoverOptions{
				MasterName: redistest.SentinelMaster, SentinelAddrs: r.Addrs(),
				ClientName: name, Dialer: dial,
			})
			t.Cleanup(func() { _ = c.Close() })
			return c
		},
		serverOf: func(*testing.T, string) *redistest.Server { return r.Primary },
		// The sentinels promote the replica, and every waiting Client
		// follows it: a failover client closes its connections to the old
		// primary when it hears of the switch, or when it dials (it asks
		// a sentinel for the primary then), so one that has a connection
		// to the new primary reads no more replies of the old one; a
		// rueidis client still reads them as it closes them, and
		// rueidisdlock believes none that came across the switch.
		frozen: func(t *testing.T, ctx context.Context, stopped *redistest.Server, names []string) {
			if stopped != r.Primary {
				t.Fatalf("R: the stopped server %s is not the primary", stopped.Addr())
			}
			promoted := r.Replica
			waitWithin(t, ctx, failoverBound, "the sentinels to promote the replica", func() bool {
				return r.NamedPrimary(t, promoted)
			})
			waitWithin(t, ctx, failoverBound, "every waiting Client to connect to the promoted replica", func() bool {
				list, _ := promoted.Do(t, "CLIENT", "LIST").(string)
				for _, n := range names {
					if !redistest.RanCommand(list, n) {
						return false
					}
				}
				return true
			})
			r.Primary, r.Replica = promoted, stopped
		},
		// The old primary, resumed, runs what it had queued: the acquires
		// the waiters sent while it was frozen, one of which takes the
		// lock there (its holder expired by its clock), though no reply
		// reaches the waiter.
		resumed: func(t *testing.T, stopped *redistest.Server, key string) {
			stopped.Do(t, "PING") // answered once it ran what it had queued
			if o, _ := stopped.Do(t, "HGET", key, "o").(string); o == "" {
				t.Fatal("the resumed old primary granted no queued acquire: the test does not reproduce the fault")
			}
		},
	}
}

// startC starts topology C. Its nodes take a master for failed only after
// 10s without an answer (cluster-node-timeout), so that a master stopped
// past a lease's TTL is not, and the cluster keeps serving: it has no
// replica to promote, and would refuse every slot while one is unserved.
func startC(t *testing.T) *site {
	t.Helper()
	nodes := redistest.Cluster(t, 3)
	var addrs []string
	for _, n := range nodes {
		n.Do(t, "CONFIG", "SET", "cluster-node-timeout", "10000")
		addrs = append(addrs, n.Addr())
	}
	return &site{
		child: "cluster:" + strings.Join(addrs, ","),
		newRedis: func(t *testing.T, name string, dial dialer) redis.UniversalClient {
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ClientName: name, Dialer: dial})
			t.Cleanup(func() { _ = c.Close() })
			return c
		},
		serverOf: func(t *testing.T, key string) *redistest.Server {
			slot := redistest.KeySlot(t, nodes[0], key)
			for _, n := range redistest.ClusterView(t, nodes[0]) {
				if !n.Replica() && n.Serves(slot) {
					for _, s := range nodes {
						if s.Addr() == n.Addr {
							return s
						}
					}
				}
			}
			t.Fatalf("C: no master serves %s (slot %d)", key, slot)
			return nil
		},
		frozen: pastTTL,
	}
}

// childRedis is the go-redis client of a child process given addr: a
// server's address, "sentinel:" and the sentinels' addresses (R), or
// "cluster:" and the nodes' addresses (C), comma-separated.
func childRedis(addr string) redis.UniversalClient {
	if list, ok := strings.CutPrefix(addr, "sentinel:"); ok {
		return redis.NewFailoverClient(&redis.FailoverOptions{MasterName: redistest.SentinelMaster, SentinelAddrs: strings.Split(list, ","), PoolSize: 64})
	}
	if list, ok := strings.CutPrefix(addr, "cluster:"); ok {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: strings.Split(list, ","), PoolSize: 64})
	}
	return redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
}

// role returns what ROLE says s is: master, slave or sentinel.
func role(t *testing.T, s *redistest.Server) string {
	t.Helper()
	r, _ := s.Do(t, "ROLE").([]any)
	if len(r) == 0 {
		return ""
	}
	return fmt.Sprint(r[0])
}
