package dlock_test

// Faults of shared/SAFETY.md injected on topology Q: five independent
// masters, each behind a fault proxy of its own, so that a fault hits one
// master (for one Client) at a time. Each test names its row.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faultproxy"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/wire"
	"github.com/redis/go-redis/v9"
)

// proxiedQuorum starts n masters as quorumMasters does, with a fault proxy
// in front of each: rdbs[i] reaches servers[i] through proxies[i].
func proxiedQuorum(t *testing.T, n int) ([]*redistest.Server, []*faultproxy.Proxy, []redis.UniversalClient) {
	t.Helper()
	servers, _ := quorumMasters(t, n)
	proxies, rdbs := throughProxies(t, servers)
	return servers, proxies, rdbs
}

// throughProxies starts a fault proxy in front of each server (closed when
// the test ends) and returns clients that reach the servers through them.
// Several Clients of one quorum may each have proxies of their own, so that
// a master is cut off for one of them only.
func throughProxies(t *testing.T, servers []*redistest.Server) ([]*faultproxy.Proxy, []redis.UniversalClient) {
	t.Helper()
	proxies := make([]*faultproxy.Proxy, len(servers))
	rdbs := make([]redis.UniversalClient, len(servers))
	for i, s := range servers {
		p, err := faultproxy.Start(s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		proxies[i] = p
		// A call to a blackholed master holds its goroutine until the
		// read timeout: a short one lets the test end soon after.
		rdbs[i] = s.Client(t, func(o *redis.Options) { o.Addr, o.ReadTimeout = p.Addr(), time.Second })
	}
	return proxies, rdbs
}

// ownersOf returns the owner token of lock name on each server, read
// directly ("" if nobody holds it there, "down" for a killed server).
func ownersOf(t *testing.T, servers []*redistest.Server, name string) []string {
	t.Helper()
	out := make([]string, len(servers))
	for i, s := range servers {
		if s.PID() == 0 {
			out[i] = "down"
			continue
		}
		if o, _ := s.Do(t, "hget", wire.HashKey(wire.DefaultPrefix, name), "o").(string); o != "" {
			out[i] = o
		}
	}
	return out
}

// heldOn returns the indexes of the servers on which token holds lock name.
func heldOn(t *testing.T, servers []*redistest.Server, name, token string) []int {
	t.Helper()
	var on []int
	for i, o := range ownersOf(t, servers, name) {
		if o == token {
			on = append(on, i)
		}
	}
	return on
}

// freeOnAll fails the test if lock name has an owner on any running server.
func freeOnAll(t *testing.T, servers []*redistest.Server, name, when string) {
	t.Helper()
	for i, o := range ownersOf(t, servers, name) {
		if o != "" && o != "down" {
			t.Fatalf("%s: lock %q still held on master %d by %q (owners %q)", when, name, i, o, ownersOf(t, servers, name))
		}
	}
}

// Fault 12: two of the five masters down, killed or blackholed (their
// requests time out): every call still works. Three down: TryLock fails,
// and leaves nothing locked on the two that are up.
func TestFault12QuorumMastersDown(t *testing.T) {
	for _, how := range []string{"killed", "blackholed"} {
		t.Run(how, func(t *testing.T) {
			servers, proxies, rdbs := proxiedQuorum(t, 5)
			down := func(i int) {
				switch {
				case how == "killed":
					servers[i].Kill()
				case i%2 == 0:
					proxies[i].Drop(faultproxy.Both) // requests vanish
				default:
					proxies[i].Hold(faultproxy.Both) // requests wait forever
				}
			}
			const node = 100 * time.Millisecond
			a := newQuorum(t, rdbs, dlock.WithNodeTimeout(node))
			b := newQuorum(t, rdbs, dlock.WithNodeTimeout(node))
			ctx := ctxT(t, 30*time.Second)
			const name = "q12"
			ttl := dlock.TTL(600 * time.Millisecond)
			down(3)
			down(4)

			l, err := a.Mutex(name, ttl).TryLock(ctx)
			if err != nil {
				t.Fatalf("TryLock with 2 of 5 masters down: %v", err)
			}
			if on := heldOn(t, servers, name, l.Token()); len(on) != 3 {
				t.Fatalf("held on masters %v, want the three that are up", on)
			}
			if _, err := b.Mutex(name, ttl).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
				t.Fatalf("another Client's TryLock of the held lock: %v, want ErrNotObtained", err)
			}
			if err := l.Extend(ctx, 900*time.Millisecond); err != nil {
				t.Fatalf("Extend with 2 of 5 masters down: %v", err)
			}
			if d, err := l.TTL(ctx); err != nil || d <= 600*time.Millisecond {
				t.Fatalf("TTL after Extend to 900ms: %v, %v", d, err)
			}
			// Renewals keep it past two TTLs (a time property: the renewals
			// must happen meanwhile).
			time.Sleep(2 * time.Second)
			if !stillValid(l) {
				t.Fatalf("renewed lease ended with 2 of 5 masters down: %v", context.Cause(l.Context()))
			}
			waiter := async(t, ctx, b.Mutex(name, ttl).Lock)
			if err := l.Unlock(ctx); err != nil {
				t.Fatalf("Unlock with 2 of 5 masters down: %v", err)
			}
			next, err := waiter()
			if err != nil {
				t.Fatalf("waiting Lock with 2 of 5 masters down: %v", err)
			}
			if next.Fence() <= l.Fence() {
				t.Fatalf("fence %d after %d", next.Fence(), l.Fence())
			}
			if err := next.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			freeOnAll(t, servers, name, "after both Unlocks")

			// Three down: no majority can be had. A long TTL, so that a
			// partial lock left behind would still be there when looked at.
			down(2)
			start := time.Now()
			_, err = a.Mutex(name, dlock.TTL(10*time.Second)).TryLock(ctx)
			took := time.Since(start)
			if err == nil {
				t.Fatal("TryLock obtained the lock with 3 of 5 masters down")
			}
			t.Logf("TryLock with 3 of 5 down failed after %v (node timeout %v): %v", took, node, err)
			freeOnAll(t, servers, name, "after a TryLock with 3 of 5 down")
			lctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			_, err = b.Mutex(name, dlock.TTL(10*time.Second)).Lock(lctx)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Lock with 3 of 5 masters down: %v, want its ctx's end", err)
			}
			freeOnAll(t, servers, name, "after a Lock with 3 of 5 down")
		})
	}
}
