package dlock_test

// The topologies of docs/SAFETY.md as the fault tests that run on each of
// them see one (a site). A check of the fault matrix that holds on every
// topology is a function of a site; its S test runs it on a server of its
// own (startS).

import (
	"context"
	"fmt"
	"net"
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
	c := dlock.New(rdb, opts...)
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

// childRedis is the go-redis client of a child process given addr, a
// server's address.
func childRedis(addr string) redis.UniversalClient {
	return redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
}
