package dlock_test

// Faults of shared/SAFETY.md injected on topology Q: five independent
// masters, each behind a fault proxy of its own, so that a fault hits one
// master (for one Client) at a time. Each test names its row.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
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
func throughProxies(t *testing.T, servers []*redistest.Server, opts ...func(*redis.Options)) ([]*faultproxy.Proxy, []redis.UniversalClient) {
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
		rdbs[i] = s.Client(t, append([]func(*redis.Options){func(o *redis.Options) { o.Addr, o.ReadTimeout = p.Addr(), time.Second }}, opts...)...)
	}
	// The tests hold, drop and refuse what comes through the proxies
	// after their clients connected.
	oneConnOnRueidis(t, rdbs...)
	return proxies, rdbs
}

// cutOff makes each proxy refuse new connections and resets those open:
// its master is down for the clients through it. A go-redis client
// dials on first use, but a rueidis client has a connection open from
// the moment it was made.
func cutOff(proxies ...*faultproxy.Proxy) {
	for _, p := range proxies {
		p.Refuse(true)
		p.ResetAll()
	}
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

// grantedOnAll waits until l holds lock name on every server: a quorum
// Lock returns once a majority granted, the others' grants on their way.
func grantedOnAll(t *testing.T, ctx context.Context, servers []*redistest.Server, name string, l *dlock.Lease) {
	t.Helper()
	waitFor(t, ctx, "the grant on every master", func() bool { return len(heldOn(t, servers, name, l.Token())) == len(servers) })
}

// epochSet waits (10 s at most) for master s's epoch key and returns it,
// "START RUN_ID": a quorum call returns once a majority answered, and the
// vote of s, whose script sets the key (quorum_acquire.lua), may still be
// on its way.
func epochSet(t *testing.T, ctx context.Context, s *redistest.Server) string {
	t.Helper()
	var v string
	waitFor(t, ctx, s.Addr()+"'s epoch key", func() bool {
		var ok bool
		v, ok = s.Do(t, "get", "dlock:epoch").(string)
		return ok
	})
	return v
}

// releasedOnAll waits for lock name to be free on every running server,
// and fails the test as freeOnAll does if it is not soon: an Unlock returns
// once a majority released, its releases to the other masters on their way.
func releasedOnAll(t *testing.T, servers []*redistest.Server, name, when string) {
	t.Helper()
	freedOnAllWithin(t, servers, name, when, 5*time.Second)
}

// freedOnAllWithin is releasedOnAll with its own bound: below the TTL of a
// lease left behind, so that a grant never given back is still seen.
func freedOnAllWithin(t *testing.T, servers []*redistest.Server, name, when string, within time.Duration) {
	t.Helper()
	free := func() bool {
		for _, o := range ownersOf(t, servers, name) {
			if o != "" && o != "down" {
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(within); !free() && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	freeOnAll(t, servers, name, when)
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
			waitFor(t, ctx, "the waiter to subscribe on the masters up", func() bool {
				n, _ := servers[0].Do(t, "pubsub", "shardnumsub", wire.HashKey(wire.DefaultPrefix, name)).([]any)[1].(int64)
				return n > 0
			})
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
			releasedOnAll(t, servers, name, "after both Unlocks")

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
			// What the masters up granted in time is given back before
			// TryLock returns; a grant whose reply came after the node
			// timeout (a loaded machine), in the background: waited for,
			// below the TTL.
			releasedOnAll(t, servers, name, "after a TryLock with 3 of 5 down")
			lctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			_, err = b.Mutex(name, dlock.TTL(10*time.Second)).Lock(lctx)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Lock with 3 of 5 masters down: %v, want its ctx's end", err)
			}
			// An attempt that the ctx's end cut short gives back in the
			// background (its give-back's own calls ended with the ctx).
			releasedOnAll(t, servers, name, "after a Lock with 3 of 5 down")
		})
	}
}

// Fault 3: the acquire's replies from a majority come late.
//
// Counted but past the lease's validity (the node timeout above the TTL):
// reported as an error, never as obtained. The lock's counter is set ahead
// of the masters' clocks and alike on all of them (as a grant raised on
// every master leaves it, when the clock behind it is ahead of theirs), so
// that every master hands out the same fence and nothing is raised: the
// validity check alone must refuse. (Otherwise the raise would, finding the
// lock expired: a reply later than the validity finds it expired at its
// master, or about to.)
//
// Past the node timeout (below the TTL): not obtained either; the masters
// whose replies came give it back at once, and those whose replies were late
// as their replies come (a new connection to them, for the give-back, waits
// as long for its handshake), long before the TTL.
func TestFault3QuorumRepliesPastValidity(t *testing.T) {
	servers, proxies, rdbs := proxiedQuorum(t, 5)
	ctx := ctxT(t, 30*time.Second)
	const name, delay = "q3", 450 * time.Millisecond
	for _, tc := range []struct {
		what      string
		node, ttl time.Duration
	}{
		{"counted past the TTL", time.Second, 300 * time.Millisecond},
		{"past the node timeout", 100 * time.Millisecond, 5 * time.Second},
	} {
		t.Run(tc.what, func(t *testing.T) {
			c := newQuorum(t, rdbs, dlock.WithNodeTimeout(tc.node))
			m := c.Mutex(name, dlock.TTL(tc.ttl))
			// Connections open, scripts loaded, masters certified: the
			// late round trip is the acquire's alone.
			l, err := m.TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			ahead := l.Fence() + 1_000_000_000_000 // µs: some 11 days
			for _, s := range servers {
				s.Do(t, "hset", wire.HashKey(wire.DefaultPrefix, name), "f", ahead)
			}
			for _, p := range proxies[2:] {
				p.SetLatency(faultproxy.Downstream, delay)
			}
			l, err = m.TryLock(ctx)
			if err == nil {
				t.Fatalf("TryLock obtained the lock with a majority's replies %v late, TTL %v (fence %d)", delay, tc.ttl, l.Fence())
			}
			t.Logf("TryLock: %v", err)
			freeOnAll(t, servers[:2], name, "on the masters whose replies came, when TryLock returned")
			lctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
			l, err = m.Lock(lctx)
			cancel()
			if err == nil {
				t.Fatalf("Lock obtained the lock with a majority's replies %v late, TTL %v (fence %d)", delay, tc.ttl, l.Fence())
			}
			// The late replies arrive and are given back: a give-back may
			// need a new connection, whose handshake's reply is as late, and
			// a loaded machine adds its own. Waited for, but well below the
			// 5 s TTL past the node timeout (the last attempt was sent at
			// most 1.5 s ago), so that a grant never given back would still
			// be there.
			freedOnAllWithin(t, servers, name, "once the late replies came", 3*time.Second)
			for _, p := range proxies {
				p.SetLatency(faultproxy.Downstream, 0)
			}
			l, err = m.TryLock(ctx)
			if err != nil {
				t.Fatalf("TryLock once the replies are on time: %v", err)
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// warmQuorum makes a quorum Client of servers through fault proxies of its
// own and warms it up on lock name: connections open, masters certified,
// scripts loaded. A test that cuts replies needs it: a call on a new
// connection waits for its handshake's reply, and never runs if that is
// cut. Each case that leaves connections stuck starts with a new one.
func warmQuorum(t *testing.T, ctx context.Context, servers []*redistest.Server, name string, opts ...dlock.Option) ([]*faultproxy.Proxy, *dlock.Client) {
	t.Helper()
	proxies, rdbs := throughProxies(t, servers)
	c := newQuorum(t, rdbs, opts...)
	warmUp(t, ctx, c, name)
	releasedOnAll(t, servers, name, "after warming up")
	return proxies, c
}

// warmUp locks name with c, extends and unlocks it: c's connections are
// open and the scripts of those calls loaded.
func warmUp(t *testing.T, ctx context.Context, c *dlock.Client, name string) {
	t.Helper()
	l, err := c.Mutex(name).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Extend(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// Fault 4: the acquire runs on the masters but replies are lost. It is
// never reported as obtained unless a majority's grants arrived, and the
// lock is free again on every master within its TTL. Where a master can be
// reached again (its connections were reset, then work), what it granted is
// given back at once, though the caller never saw its grant; where its
// replies stay lost it cannot be told (a new connection's handshake needs a
// reply) and the lock expires there.
func TestFault4QuorumReplyLost(t *testing.T) {
	servers, _ := quorumMasters(t, 5)
	ctx := ctxT(t, 30*time.Second)
	const name = "q4"
	fast := dlock.WithNodeTimeout(100 * time.Millisecond)

	for _, n := range []int{3, 5} {
		t.Run(fmt.Sprintf("replies of %d dropped", n), func(t *testing.T) {
			proxies, c := warmQuorum(t, ctx, servers, name, fast)
			for _, p := range proxies[:n] {
				p.Drop(faultproxy.Downstream)
			}
			const ttl = time.Second
			sent := time.Now()
			l, err := c.Mutex(name, dlock.TTL(ttl)).TryLock(ctx)
			if err == nil {
				t.Fatalf("TryLock reported success with the replies of %d masters dropped (fence %d, held on %v)", n, l.Fence(), heldOn(t, servers, name, l.Token()))
			}
			t.Logf("TryLock: %v; owners when it returned: %q", err, ownersOf(t, servers, name))
			freeOnAll(t, servers[n:], name, "on the masters whose replies came")
			// Not ordering: past the TTL, by which every master is free.
			time.Sleep(time.Until(sent.Add(ttl + 100*time.Millisecond)))
			freeOnAll(t, servers, name, "a TTL after a TryLock whose replies were dropped")
		})
	}

	// The connections to three masters reset after the acquire ran there,
	// before its replies came. go-redis sends it again on a new connection
	// (by itself: it resends after a reset), and the masters recognise the
	// token: a majority truly confirmed the grant.
	t.Run("reset after the acquire ran", func(t *testing.T) {
		proxies, c := warmQuorum(t, ctx, servers, name, dlock.WithNodeTimeout(2*time.Second))
		for _, p := range proxies[:3] {
			p.Hold(faultproxy.Downstream)
		}
		got := async(t, ctx, c.Mutex(name, dlock.TTL(10*time.Second)).TryLock)
		waitFor(t, ctx, "the acquire to run on every master", func() bool {
			os := ownersOf(t, servers, name)
			return os[0] != "" && os[0] == os[1] && os[1] == os[2] && os[2] == os[3] && os[3] == os[4]
		})
		for _, p := range proxies[:3] {
			p.ResetAll()
			p.Release(faultproxy.Downstream)
		}
		l, err := got()
		if err != nil {
			t.Fatalf("TryLock whose first replies were reset, sent again: %v", err)
		}
		if on := heldOn(t, servers, name, l.Token()); len(on) != 5 {
			t.Fatalf("held on masters %v, want all 5", on)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		// A resend that runs after the release is given back just after.
		waitFor(t, ctx, "the lock free on every master after Unlock", func() bool {
			return slices.Equal(ownersOf(t, servers, name), make([]string, 5))
		})
	})

	// Replies lost from a minority: obtained, the lock held on the masters
	// whose replies were lost too (by the same token), freed there too by
	// Unlock once they can be reached.
	t.Run("replies of 2 dropped", func(t *testing.T) {
		proxies, c := warmQuorum(t, ctx, servers, name, fast)
		for _, p := range proxies[:2] {
			p.Drop(faultproxy.Downstream)
		}
		l, err := c.Mutex(name, dlock.TTL(10*time.Second)).TryLock(ctx)
		if err != nil {
			t.Fatalf("TryLock with the replies of 2 of 5 masters dropped: %v", err)
		}
		// TryLock returns once a majority granted: the requests to the
		// others may still be on their way.
		waitFor(t, ctx, "the lock held on all 5 masters (the 2 whose replies were lost too)", func() bool {
			return len(heldOn(t, servers, name, l.Token())) == 5
		})
		for _, p := range proxies[:2] {
			p.Undrop(faultproxy.Downstream)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatalf("Unlock: %v", err)
		}
		releasedOnAll(t, servers, name, "after Unlock")
	})
}

// Fault 7 on Q, the scenario of Kleppmann's critique of Redlock: A holds
// the lock on exactly three masters, {0, 1, 2} (3 and 4 refuse A's
// connections), master 2 restarts without persistence, and B, which
// reaches every master, asks for the lock while A's lease is believed
// valid. With the restart check off (WithRestartDelay(0)) B gets it from
// {2, 3, 4}: the double grant, reproduced. With a restart delay as long as
// the TTL, or the default, master 2 does not vote until the delay has
// passed since its restart, and B gets the lock only once A's lease has
// ended. B had asked before the restart (its masters certified: master 2
// answers that it lost its epoch key), and a Client new since (C) asks
// too, which sets master 2's epoch again from its young uptime.
func TestFault7QuorumRestartWithoutPersistence(t *testing.T) {
	const name, ttl = "q7", 1500 * time.Millisecond
	for _, tc := range []struct {
		what  string
		delay time.Duration // 0: the check off; -1: the default
	}{
		{"restart check off", 0},
		{"restart delay of one TTL", ttl},
		{"default restart delay", -1},
	} {
		t.Run(tc.what, func(t *testing.T) {
			ctx := ctxT(t, 30*time.Second)
			servers, direct := quorumMasters(t, 5)
			proxies, viaProxies := throughProxies(t, servers)
			opts := []dlock.Option{dlock.WithNodeTimeout(100 * time.Millisecond)}
			if tc.delay >= 0 {
				opts = append(opts, dlock.WithRestartDelay(tc.delay))
			}
			a, b := newQuorum(t, viaProxies, opts...), newQuorum(t, direct, opts...)
			cutOff(proxies[3:]...)
			la, err := a.Mutex(name, dlock.TTL(ttl)).Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if on := heldOn(t, servers, name, la.Token()); len(on) != 3 || on[2] != 2 {
				t.Fatalf("A holds the lock on masters %v, want 0, 1 and 2", on)
			}
			if _, err := b.Mutex(name, dlock.TTL(ttl)).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
				t.Fatalf("B's TryLock before the restart: %v, want ErrNotObtained", err)
			}
			servers[2].Restart(t)
			if o := ownersOf(t, servers[2:3], name)[0]; o != "" {
				t.Fatalf("master 2 kept the lock (owner %q) across a restart without persistence", o)
			}
			if tc.delay == 0 {
				lctx, cancel := context.WithTimeout(ctx, ttl/2)
				lb, err := b.Mutex(name, dlock.TTL(ttl)).Lock(lctx)
				cancel()
				if err != nil || !stillValid(la) {
					t.Fatalf("double grant not reproduced: B's Lock %v, A's lease believed valid %v", err, stillValid(la))
				}
				t.Logf("double grant reproduced: B holds the lock on masters %v while A's lease is believed valid", heldOn(t, servers, name, lb.Token()))
				return
			}
			c := newQuorum(t, direct, opts...)
			for _, who := range []*dlock.Client{b, c} {
				if l, err := who.Mutex(name, dlock.TTL(ttl)).TryLock(ctx); err == nil {
					t.Fatalf("obtained the lock (on masters %v) right after master 2 restarted; A's lease believed valid: %v", heldOn(t, servers, name, l.Token()), stillValid(la))
				}
			}
			// Each TryLock failed once every vote was in or timed out: a
			// vote of master 2's past its timeout (a new connection to the
			// restarted master, on a loaded machine) sets the key later.
			start, _, _ := strings.Cut(epochSet(t, ctx, servers[2]), " ") // "START RUN_ID"
			epoch, _ := strconv.ParseInt(start, 10, 64)
			now := servers[2].Do(t, "time").([]any)
			secs, _ := strconv.ParseInt(now[0].(string), 10, 64)
			if age := time.Duration(secs*1000-epoch) * time.Millisecond; age > 5*time.Second {
				t.Fatalf("master 2's data counted as %v old after its restart", age)
			}
			lb, err := b.Mutex(name, dlock.TTL(ttl)).Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if stillValid(la) {
				t.Fatalf("B obtained the lock (on masters %v) while A's lease was believed valid", heldOn(t, servers, name, lb.Token()))
			}
			t.Logf("B obtained the lock on masters %v after A's lease ended (%v)", heldOn(t, servers, name, lb.Token()), context.Cause(la.Context()))
			if err := lb.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// Fault 1 on Q: a holder paused past its TTL (it stops renewing: NoRenew)
// while another Client takes the lock once it expired on the masters. The
// paused holder's lease context has ended by the time it resumes, and its
// late write is refused by a resource that checks fences: the new holder's
// fence is higher, though the masters' counters expired with the first
// lease (the clock term of acquire.lua, which quorum_acquire.lua runs, carries fences over that).
func TestFault1QuorumPausedHolderFenced(t *testing.T) {
	servers, rdbs := quorumMasters(t, 5)
	a, b := newQuorum(t, rdbs), newQuorum(t, rdbs)
	register := servers[0].Client(t)
	ctx := ctxT(t, 20*time.Second)
	const name = "q1"
	paused, err := a.Mutex(name, dlock.TTL(500*time.Millisecond), dlock.NoRenew()).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cur, err := b.Mutex(name, dlock.TTL(5*time.Second)).Lock(ctx) // once the first lease expired
	if err != nil {
		t.Fatal(err)
	}
	if stillValid(paused) {
		t.Fatal("B obtained the lock while the paused holder's lease was believed valid")
	}
	if cur.Fence() <= paused.Fence() {
		t.Fatalf("new holder's fence %d not above the paused holder's %d", cur.Fence(), paused.Fence())
	}
	if !writeFenced(ctx, register, cur.Fence(), "new holder") {
		t.Fatal("the new holder's fenced write was refused")
	}
	// The paused holder resumes: the very first look sees the end.
	if !errors.Is(context.Cause(paused.Context()), dlock.ErrLockLost) {
		t.Fatalf("paused holder's lease context: %v, want ended with ErrLockLost", context.Cause(paused.Context()))
	}
	if writeFenced(ctx, register, paused.Fence(), "paused holder") {
		t.Fatal("the paused holder's stale write was accepted by the fenced register")
	}
	if v := register.HGet(ctx, "register", "value").Val(); v != "new holder" {
		t.Fatalf("register = %q", v)
	}
	if err := cur.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// Fault 2 on Q: Extend and Unlock of a lease that expired on the masters
// while another Client took the lock. The masters' clocks jumped (PEXPIRE
// on each: the lease expires there early), so the holder still believes it
// valid and its calls reach the masters. B, which reaches masters 0 to 2
// only, takes the lock there; 3 and 4 have no key. Extend and Unlock say
// ErrLockLost and change nothing on any master: B's owner and expiry stay,
// and Extend does not make a key again on 3 and 4.
func TestFault2QuorumExtendUnlockAfterExpiry(t *testing.T) {
	servers, direct := quorumMasters(t, 5)
	proxies, viaProxies := throughProxies(t, servers)
	ctx := ctxT(t, 20*time.Second)
	const name = "q2"
	key := wire.HashKey(wire.DefaultPrefix, name)
	a := newQuorum(t, direct)
	b := newQuorum(t, viaProxies, dlock.WithNodeTimeout(100*time.Millisecond))
	old, err := a.Mutex(name, dlock.TTL(10*time.Second)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Lock returns once three granted: a grant that came after the
	// PEXPIREs would set the key again there, for 10 s (seen over rueidis).
	grantedOnAll(t, ctx, servers, name, old)
	for _, s := range servers {
		s.Do(t, "pexpire", key, 1)
	}
	waitFor(t, ctx, "the lease to expire on every master", func() bool {
		return heldOn(t, servers, name, old.Token()) == nil
	})
	cutOff(proxies[3:]...)
	cur, err := b.Mutex(name, dlock.TTL(2*time.Second)).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !stillValid(old) {
		t.Fatal("the old lease ended before Extend: the test does not reach the masters with it")
	}
	if err := old.Extend(ctx, 20*time.Second); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Extend of a lease expired on the masters: %v, want ErrLockLost", err)
	}
	if cause := context.Cause(old.Context()); !errors.Is(cause, dlock.ErrLockLost) {
		t.Fatalf("the old lease's context: %v, want ErrLockLost", cause)
	}
	if err := old.Unlock(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Unlock of a lease expired on the masters: %v, want ErrLockLost", err)
	}
	for i, s := range servers {
		o, _ := s.Do(t, "hget", key, "o").(string)
		ms := s.Do(t, "pttl", key).(int64)
		switch {
		case i < 3 && (o != cur.Token() || ms > 2000):
			t.Fatalf("master %d: owner %q, expiry in %d ms; want B's (%q), within 2 s", i, o, ms, cur.Token())
		case i >= 3 && ms != -2:
			t.Fatalf("master %d: the lock's key is there again (owner %q, expiry in %d ms)", i, o, ms)
		}
	}
	if _, err := cur.TTL(ctx); err != nil {
		t.Fatalf("the new holder's lease after the stale calls: %v", err)
	}
	if err := cur.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// Fault 13 on Q: a contention storm, 100 goroutines on 3 Clients, each
// locking once and incrementing a counter read-modify-write inside: no lost
// update, never two inside, fences increasing in grant order, and the storm
// ends (bounded by its ctx).
func TestFault13QuorumContentionStorm(t *testing.T) {
	servers, rdbs := quorumMasters(t, 5)
	// A per-master timeout above the 50ms default: with 100 callers and
	// five servers on two loaded cores, a master's answer often took longer,
	// no attempt reached a majority in time and the storm made no progress
	// within a minute (exclusion is what is checked, at any timeout).
	node := dlock.WithNodeTimeout(500 * time.Millisecond)
	cs := []*dlock.Client{newQuorum(t, rdbs, node), newQuorum(t, rdbs, node), newQuorum(t, rdbs, node)}
	start := time.Now()
	contend(t, ctxT(t, 60*time.Second), servers[0].Client(t), 100, 1, func(g int) *dlock.Mutex { return cs[g%3].Mutex("q13") })
	t.Logf("100 grants in %v", time.Since(start))
}

// gatedDialer is a go-redis Dialer that connects to to() (the address
// given to go-redis is not used), and while the gate is shut makes each new
// connection wait for its own turn (let), so that a test can choose which
// of two connections comes up first.
type gatedDialer struct {
	to      func() string
	mu      sync.Mutex
	shut    bool
	waiting []chan struct{}
}

// client returns a client of s that dials with g.
func (g *gatedDialer) client(t *testing.T, s *redistest.Server) *redis.Client {
	rdb := s.Client(t, func(o *redis.Options) { o.Addr, o.Dialer = g.to(), g.dial })
	oneConnOnRueidis(t, rdb) // each new connection is one the test lets through
	return rdb
}

func (g *gatedDialer) dial(ctx context.Context, network, _ string) (net.Conn, error) {
	g.mu.Lock()
	var turn chan struct{}
	if g.shut {
		turn = make(chan struct{})
		g.waiting = append(g.waiting, turn)
	}
	g.mu.Unlock()
	if turn != nil {
		select {
		case <-turn:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	var d net.Dialer
	return d.DialContext(ctx, network, g.to())
}

// waiters returns how many connections have waited at the gate.
func (g *gatedDialer) waiters() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.waiting)
}

// let lets the i-th connection that waited through.
func (g *gatedDialer) let(i int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	close(g.waiting[i])
}

// A reply lost in one attempt of a Lock, found after a later attempt of the
// same Lock won (fault 4 meets a retry). A's first attempt: masters 0 and 1
// run the acquire but their replies are held past the node timeout, 3 and 4
// refuse A's connections: no majority, so A tries again, and its new
// connections to 0 and 1 (each master's client dials through a second
// proxy from then on) carry the second attempt, which wins on 0, 1 and 2.
// Then the first attempt's connections are reset: what comes of them (an
// error, or go-redis's resend of the acquire) must not take the lock away
// from the lease on 0 and 1, nor let another Client obtain it while the
// lease is believed valid.
func TestFault4QuorumLateReplyOfEarlierAttempt(t *testing.T) {
	servers, direct := quorumMasters(t, 5)
	first, rdbs := throughProxies(t, servers)
	second, _ := throughProxies(t, servers[:2])
	var switched atomic.Bool
	for i := range 2 {
		g := &gatedDialer{to: func() string {
			if switched.Load() {
				return second[i].Addr()
			}
			return first[i].Addr()
		}}
		rdbs[i] = g.client(t, servers[i])
	}
	ctx := ctxT(t, 20*time.Second)
	const name = "q4-late"
	a := newQuorum(t, rdbs, dlock.WithNodeTimeout(100*time.Millisecond))
	d := newQuorum(t, direct)
	m := a.Mutex(name, dlock.TTL(5*time.Second))
	l, err := m.TryLock(ctx) // connections open, masters certified
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range first[:2] {
		p.Hold(faultproxy.Downstream)
	}
	cutOff(first[3:]...)
	switched.Store(true) // the first attempt goes on the connections open now
	l, err = m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if on := heldOn(t, servers, name, l.Token()); len(on) != 3 {
		t.Fatalf("the lease is held on masters %v, want 0, 1 and 2", on)
	}
	for _, p := range first[:2] {
		p.ResetAll()
		p.Release(faultproxy.Downstream)
	}
	// Not ordering: time for what comes of the first attempt (go-redis
	// resends after a backoff; the late give-back runs in the background).
	time.Sleep(500 * time.Millisecond)
	if on := heldOn(t, servers, name, l.Token()); len(on) != 3 {
		t.Errorf("the lease, believed valid: %v, is held on masters %v only (owners %q)", stillValid(l), on, ownersOf(t, servers, name))
	}
	if o, err := d.Mutex(name, dlock.TTL(5*time.Second)).TryLock(ctx); err == nil {
		t.Fatalf("another Client obtained the lock (on masters %v) while the lease is believed valid: %v", heldOn(t, servers, name, o.Token()), stillValid(l))
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// An acquire that runs on a master after the Unlock was asked for: TryLock
// won on masters 1 to 4 while master 0's connection was slow to come up (as
// after a reset, when go-redis sends the acquire again on a new
// connection). Unlock returns once masters 1 to 4 released; its release to
// master 0 waits for the acquire's answer there, so it runs after the grant
// and frees it, rather than reaching master 0 first and leaving the grant
// that follows for its TTL (30 s here). The gate lets no other connection
// to master 0 through: a release that did not wait would be stuck on one.
// It shuts once the Client is made (a rueidis client connects then), and
// the connection open then is reset.
func TestFault4QuorumAcquireAfterUnlock(t *testing.T) {
	servers, _ := quorumMasters(t, 5)
	proxies, rdbs := throughProxies(t, servers)
	gate := &gatedDialer{to: proxies[0].Addr}
	rdbs[0] = gate.client(t, servers[0])
	ctx := ctxT(t, 30*time.Second)
	const name = "q4-after"
	c := newQuorum(t, rdbs, dlock.WithNodeTimeout(5*time.Second))
	gate.mu.Lock()
	gate.shut = true
	gate.mu.Unlock()
	proxies[0].ResetAll()
	l, err := c.Mutex(name, dlock.TTL(30*time.Second)).TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock with master 0 slow to connect: %v", err)
	}
	// Over rueidis the acquire meets the reset connection first, and is
	// sent again (by dlock) on a new one.
	waitFor(t, ctx, "a connection to master 0 at the gate", func() bool { return gate.waiters() > 0 })
	if gate.waiters() != 1 {
		t.Fatalf("%d connections to master 0 waited, want the acquire's", gate.waiters())
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	releasedOnAll(t, servers[1:], name, "after Unlock")
	gate.let(0)
	waitFor(t, ctx, "the acquire to run on master 0 and be released after it", func() bool {
		return ownersOf(t, servers[:1], name)[0] == "" && servers[0].Do(t, "exists", wire.HashKey(wire.DefaultPrefix, name)) == int64(1)
	})
}

// Fault 17 on Q: connections reset during a release or an extend.
//
// Release: A's release runs on the masters, the replies of three are held
// back, and B takes the lock meanwhile; then those connections are reset.
// Sending the release again there finds B's lock, which is not A's loss:
// A's Unlock says nil (its release went through), and B keeps the lock
// where it had it. A release whose replies never come is an error (outcome
// unknown); a later Unlock of it says nil too and leaves B alone.
//
// Extend: the extension runs on the masters, and the connections of three
// are reset before their replies and refuse new ones: the outcome is
// unknown, so Extend fails and the lease still ends at its old deadline,
// though the masters extended it.
//
// Each case has proxies and a Client of its own (see warmQuorum).
func TestFault17QuorumResetOnReleaseOrExtend(t *testing.T) {
	servers, direct := quorumMasters(t, 5)
	ctx := ctxT(t, 30*time.Second)
	const name = "q17"
	key := wire.HashKey(wire.DefaultPrefix, name)
	b := newQuorum(t, direct)
	// ranOn waits until a call of A's ran on masters 3 and 4 (no fault) and
	// then, for a while, on 0 to 2 (a call on a new connection there waits
	// for its handshake's reply, held back), and returns on which of them.
	ranOn := func(t *testing.T, what string, done <-chan error, ran func(i int) bool) []int {
		waitFor(t, ctx, what+" to run on masters 3 and 4", func() bool {
			select {
			case err := <-done:
				t.Fatalf("%s returned before it ran on masters 3 and 4: %v (owners %q)", what, err, ownersOf(t, servers, name))
			default:
			}
			return ran(3) && ran(4)
		})
		var on []int
		for deadline := time.Now().Add(300 * time.Millisecond); len(on) < 3 && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			on = on[:0]
			for i := range 3 {
				if ran(i) {
					on = append(on, i)
				}
			}
		}
		t.Logf("%s ran on faulty masters %v", what, on)
		return on
	}
	// B takes the lock; later, it must still hold it where it did. Its
	// TryLock returns once three granted: a grant of B's on its way then
	// comes after bOn was read, and adds a master (A's calls cannot).
	var bOn []int
	bHolds := func(t *testing.T) *dlock.Lease {
		l, err := b.Mutex(name, dlock.TTL(10*time.Second)).TryLock(ctx)
		if err != nil {
			t.Fatalf("B's TryLock: %v", err)
		}
		bOn = heldOn(t, servers, name, l.Token())
		return l
	}
	bKept := func(t *testing.T, l *dlock.Lease) {
		on := heldOn(t, servers, name, l.Token())
		for _, i := range bOn {
			if !slices.Contains(on, i) {
				t.Fatalf("B holds the lock on masters %v, it did on %v (owners %q)", on, bOn, ownersOf(t, servers, name))
			}
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatalf("B's Unlock: %v", err)
		}
	}

	t.Run("release reset", func(t *testing.T) {
		proxies, a := warmQuorum(t, ctx, servers, name, dlock.WithNodeTimeout(time.Second))
		l, err := a.Mutex(name, dlock.TTL(10*time.Second)).TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range proxies[:3] {
			p.Hold(faultproxy.Downstream)
		}
		unlocked := make(chan error, 1)
		go func() { unlocked <- l.Unlock(ctx) }()
		token := l.Token()
		ranOn(t, "the release", unlocked, func(i int) bool { return ownersOf(t, servers[i:i+1], name)[0] != token })
		cur := bHolds(t)
		for _, p := range proxies[:3] {
			p.ResetAll()
			p.Release(faultproxy.Downstream)
		}
		if err := <-unlocked; err != nil {
			t.Fatalf("Unlock whose replies were reset after it ran, the lock taken since: %v, want nil", err)
		}
		bKept(t, cur)
	})

	t.Run("release replies lost", func(t *testing.T) {
		proxies, a := warmQuorum(t, ctx, servers, name, dlock.WithNodeTimeout(time.Second))
		l, err := a.Mutex(name, dlock.TTL(10*time.Second)).TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range proxies[:3] {
			p.Drop(faultproxy.Downstream)
		}
		if err := l.Unlock(ctx); err == nil || errors.Is(err, dlock.ErrLockLost) {
			t.Fatalf("Unlock with 3 of 5 replies lost: %v, want an error of unknown outcome", err)
		}
		cur := bHolds(t)
		for _, p := range proxies[:3] {
			p.Undrop(faultproxy.Downstream)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatalf("Unlock again, the lock taken since: %v, want nil (the first one released it)", err)
		}
		bKept(t, cur)
	})

	t.Run("extend reset", func(t *testing.T) {
		proxies, a := warmQuorum(t, ctx, servers, name, dlock.WithNodeTimeout(time.Second))
		const short = 1500 * time.Millisecond
		l, err := a.Mutex(name, dlock.TTL(short), dlock.NoRenew()).TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// TryLock returned once three granted; an extension that reached
		// a master before its grant would find another owner there.
		grantedOnAll(t, ctx, servers, name, l)
		for _, p := range proxies[:3] {
			p.Hold(faultproxy.Downstream)
		}
		extended := make(chan error, 1)
		go func() { extended <- l.Extend(ctx, 20*time.Second) }()
		ranOn(t, "the extension", extended, func(i int) bool { return servers[i].Do(t, "pttl", key).(int64) > 10000 })
		for _, p := range proxies[:3] {
			p.Refuse(true)
			p.ResetAll()
			p.Release(faultproxy.Downstream)
		}
		if err := <-extended; err == nil || errors.Is(err, dlock.ErrLockLost) {
			t.Fatalf("Extend with 3 of 5 replies reset: %v, want an error of unknown outcome", err)
		}
		// Not ordering: past the old deadline, which must stand.
		time.Sleep(short)
		if stillValid(l) {
			t.Fatal("the lease is believed valid past its TTL after an Extend of unknown outcome")
		}
		for _, p := range proxies[:3] {
			p.Refuse(false)
		}
		_ = l.Unlock(ctx)
		releasedOnAll(t, servers, name, "after the Unlock of the lease whose Extend was unknown")
	})
}

// A documented limit, reproduced: a quorum lock's counters live in its
// keys, which expire with a lease that was never released, and the next
// grant's fence then comes from the clocks of its masters. When one
// master's clock ran 10 s ahead of the others (here: its last fence says
// so), a holder paused past its 0.5 s lease had a fence above the next
// holder's, and a fenced resource that saw the next holder's write still
// takes the paused holder's. Fences under quorum increase across expiries
// only while the masters' clocks agree to within the TTL
// (docs/PROTOCOL.md, Fences under quorum).
func TestFault1QuorumFenceLimitAcrossExpiryWithClockOffset(t *testing.T) {
	servers, _ := quorumMasters(t, 5)
	pa, ra := throughProxies(t, servers)
	pb, rb := throughProxies(t, servers)
	ctx := ctxT(t, 20*time.Second)
	const name = "q1-offset"
	a, b := newQuorum(t, ra, dlock.WithNodeTimeout(100*time.Millisecond)), newQuorum(t, rb, dlock.WithNodeTimeout(100*time.Millisecond))
	register := servers[0].Client(t)
	now, _ := strconv.ParseUint(servers[0].Do(t, "time").([]any)[0].(string), 10, 64)
	// The last grant on master 0 came from its clock, 10 s ahead.
	servers[0].Do(t, "hset", wire.HashKey(wire.DefaultPrefix, name), "f", (now+10)*1_000_000)
	cutOff(pa[3:]...) // A's grant is on 0, 1 and 2
	cutOff(pb[0])     // B's on 1 to 4
	paused, err := a.Mutex(name, dlock.TTL(500*time.Millisecond), dlock.NoRenew()).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cur, err := b.Mutex(name, dlock.TTL(2*time.Second)).Lock(ctx) // within the 10 s
	if err != nil {
		t.Fatal(err)
	}
	if stillValid(paused) {
		t.Fatal("B obtained the lock while the paused holder's lease was believed valid")
	}
	if !writeFenced(ctx, register, cur.Fence(), "new holder") {
		t.Fatal("the new holder's fenced write was refused")
	}
	if !writeFenced(ctx, register, paused.Fence(), "paused holder") {
		t.Fatalf("limit not reproduced: the paused holder's fence %d is below the new holder's %d", paused.Fence(), cur.Fence())
	}
	t.Logf("limit reproduced: the paused holder's fence %d is above the next holder's %d, and its stale write was taken", paused.Fence(), cur.Fence())
	_ = cur.Unlock(ctx)
}

// A master restarts from an older copy of its data (the RDB snapshot that
// Redis's default configuration writes every few minutes, or an AOF missing
// its un-fsynced tail): it lost A's lock but kept the epoch key, so it
// counts as old and votes at once. B must still not obtain the lock while
// A's lease is believed valid (the default restart delay, which is meant to
// keep a master that lost data from voting).
func TestFault8QuorumRestartFromOlderSnapshot(t *testing.T) {
	servers, direct := quorumMasters(t, 5)
	proxies, viaProxies := throughProxies(t, servers)
	ctx := ctxT(t, 20*time.Second)
	const name, ttl = "q8", 2 * time.Second
	servers[2].Do(t, "save") // its snapshot: the epoch key, no lock
	a, b := newQuorum(t, viaProxies), newQuorum(t, direct)
	cutOff(proxies[3:]...)
	la, err := a.Mutex(name, dlock.TTL(ttl)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	servers[2].Restart(t)
	if o := ownersOf(t, servers[2:3], name)[0]; o != "" {
		t.Fatalf("master 2 kept the lock (owner %q): the test does not lose it", o)
	}
	lctx, cancel := context.WithTimeout(ctx, ttl/2)
	lb, err := b.Mutex(name, dlock.TTL(ttl)).Lock(lctx)
	cancel()
	if err == nil && stillValid(la) {
		t.Fatalf("B obtained the lock on masters %v while A's lease is believed valid", heldOn(t, servers, name, lb.Token()))
	}
}

// An Unlock returns as soon as the masters' answers decide it: it does not
// wait for masters that do not answer once a majority released, nor return
// "released" while the masters still to answer could make a majority that
// says the lock was no longer this lease's.
func TestQuorumUnlockDecidedByMajority(t *testing.T) {
	servers, _ := quorumMasters(t, 5)
	ctx := ctxT(t, 60*time.Second)
	const name = "qu"
	// Far above the test's waits: the held masters answer only when let.
	slow := dlock.WithNodeTimeout(20 * time.Second)

	t.Run("two masters do not answer", func(t *testing.T) {
		// Their calls end only at the per-master timeout, not at the
		// connection's read timeout first.
		proxies, rdbs := throughProxies(t, servers, func(o *redis.Options) { o.ReadTimeout = 30 * time.Second })
		c := newQuorum(t, rdbs, slow)
		warmUp(t, ctx, c, name)
		releasedOnAll(t, servers, name, "after warming up")
		l, err := c.Mutex(name, dlock.TTL(10*time.Second)).TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// TryLock returned once three granted; a release that reached a
		// master before its acquire would find nothing there.
		grantedOnAll(t, ctx, servers, name, l)
		for _, p := range proxies[3:] {
			p.Hold(faultproxy.Downstream)
		}
		unlocked := make(chan error, 1)
		go func() { unlocked <- l.Unlock(ctx) }()
		select {
		case err := <-unlocked:
			if err != nil {
				t.Fatalf("Unlock with three masters released: %v", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("Unlock still waits for the two masters whose replies are held, though three released")
		}
		freeOnAll(t, servers[:3], name, "when Unlock returned")
		for _, p := range proxies[3:] {
			p.Release(faultproxy.Downstream)
		}
		releasedOnAll(t, servers, name, "once the held replies came")
	})

	t.Run("the undecided wait for the rest", func(t *testing.T) {
		proxies, c := warmQuorum(t, ctx, servers, name, slow)
		l, err := c.Mutex(name, dlock.TTL(10*time.Second)).TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		grantedOnAll(t, ctx, servers, name, l)
		// The lease is lost on masters 2, 3 and 4 (another owner there);
		// 3 and 4 answer only when let: two "released" and one "not the
		// owner" decide nothing yet.
		for _, s := range servers[2:] {
			s.Do(t, "hset", wire.HashKey(wire.DefaultPrefix, name), "o", "another")
		}
		for _, p := range proxies[3:] {
			p.Hold(faultproxy.Downstream)
		}
		unlocked := make(chan error, 1)
		go func() { unlocked <- l.Unlock(ctx) }()
		waitFor(t, ctx, "the release on masters 0 and 1", func() bool {
			os := ownersOf(t, servers, name)
			return os[0] == "" && os[1] == ""
		})
		select {
		case err := <-unlocked:
			t.Fatalf("Unlock returned %v with 2 released, 1 not the owner, 2 still to answer", err)
		case <-time.After(200 * time.Millisecond):
		}
		for _, p := range proxies[3:] {
			p.Release(faultproxy.Downstream)
		}
		if err := <-unlocked; !errors.Is(err, dlock.ErrLockLost) {
			t.Fatalf("Unlock of a lease a majority no longer holds: %v, want ErrLockLost", err)
		}
		for _, s := range servers[2:] {
			s.Do(t, "del", wire.HashKey(wire.DefaultPrefix, name))
		}
	})
}

// Fault 14 on Q: three of the five masters (a majority) stopped (SIGSTOP)
// past the TTL while a lease is held and four Clients wait. The holder is
// told it lost the lock (its renewals find no majority); once the masters
// run again, exactly one waiter wins, with a higher fence.
func TestFault14QuorumMajorityPausedPastTTL(t *testing.T) {
	servers, rdbs := quorumMasters(t, 5)
	ctx := ctxT(t, 60*time.Second)
	const name, ttl = "q14", 500 * time.Millisecond
	fast := dlock.WithNodeTimeout(100 * time.Millisecond)
	holder, err := newQuorum(t, rdbs, fast).Mutex(name, dlock.TTL(ttl)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	grantedOnAll(t, ctx, servers, name, holder)
	var clients []*dlock.Client
	for range 4 {
		clients = append(clients, newQuorum(t, rdbs, fast))
	}
	w := startWaiters(ctx, clients, name)
	defer w.stop(ctx)
	for _, s := range servers[:3] {
		s.Pause()
		defer s.Resume()
	}
	select {
	case <-holder.Context().Done():
		if !errors.Is(context.Cause(holder.Context()), dlock.ErrLockLost) {
			t.Fatalf("holder's lease ended with %v, want ErrLockLost", context.Cause(holder.Context()))
		}
	case <-time.After(3 * time.Second):
		t.Fatal("holder not told it lost the lock while a majority of the masters was stopped")
	}
	// Not ordering: the lease's keys expire on the stopped masters too.
	time.Sleep(ttl)
	if n := w.got.Load(); n != 0 {
		t.Fatalf("%d waiters got the lock from the two masters that ran", n)
	}
	for _, s := range servers[:3] {
		s.Resume()
	}
	w.oneWins(t, ctx, holder, 10*time.Second)
}

// Fault 15 on Q: SCRIPT FLUSH on every master while a lease is held, and
// again between calls: each call loads its scripts again (EVAL on
// NOSCRIPT), and none reports an error as success.
func TestFault15QuorumScriptFlush(t *testing.T) {
	servers, rdbs := quorumMasters(t, 5)
	ctx := ctxT(t, 30*time.Second)
	c := patientQuorum(t, rdbs)
	flush := func() {
		t.Helper()
		for _, s := range servers {
			s.Do(t, "script", "flush")
		}
	}
	l, err := c.Mutex("q15", dlock.TTL(300*time.Millisecond)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	flush()
	// Not ordering: past the TTL, which only the watchdog's renewals
	// (one pipeline per master) can have kept.
	time.Sleep(600 * time.Millisecond)
	if !stillValid(l) {
		t.Fatalf("the lease ended after SCRIPT FLUSH: %v", context.Cause(l.Context()))
	}
	flush()
	if err := l.Extend(ctx, 10*time.Second); err != nil {
		t.Fatalf("Extend after SCRIPT FLUSH: %v", err)
	}
	flush()
	if d, err := l.TTL(ctx); err != nil || d < 5*time.Second {
		t.Fatalf("TTL after SCRIPT FLUSH: %v, %v", d, err)
	}
	flush()
	if _, err := c.Mutex("q15").TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("another TryLock while held, after SCRIPT FLUSH: %v, want ErrNotObtained", err)
	}
	flush()
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("Unlock after SCRIPT FLUSH: %v", err)
	}
	releasedOnAll(t, servers, "q15", "after Unlock")
	flush()
	next, err := c.Mutex("q15").TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock after SCRIPT FLUSH: %v", err)
	}
	if next.Fence() <= l.Fence() {
		t.Fatalf("fence %d after %d", next.Fence(), l.Fence())
	}
	flush()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	freeOnAll(t, servers, "q15", "after Close, the scripts flushed")
}
