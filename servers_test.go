package dlock_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/wire"
	"github.com/redis/go-redis/v9"
)

// backend is one kind of server dlock must work on.
type backend struct {
	// plain: the server has no SPUBLISH, so dlock must publish and
	// subscribe with PUBLISH and SUBSCRIBE.
	plain bool
	// client returns a new go-redis client of the server, closed when the
	// test ends.
	client func(t *testing.T) *redis.Client
	// drop drops every pub/sub connection of the server at once; nil if
	// the server cannot.
	drop func(t *testing.T)
}

// backends are the servers of TestBasicsOnEveryServer: redis-server as it
// is, redis-server with sharded pub/sub renamed away (as Redis before 7.0
// answers: unknown command), and miniredis, which never had it.
var backends = []struct {
	name  string
	start func(t *testing.T) backend
}{
	{"redis", func(t *testing.T) backend { return redisBackend(t, redistest.Start(t), false) }},
	{"redis-without-spublish", func(t *testing.T) backend {
		return redisBackend(t, redistest.Start(t, redistest.Options{NoShardedPubSub: true}), true)
	}},
	{"miniredis", func(t *testing.T) backend {
		mr := miniredis.RunT(t)
		return backend{plain: true, client: func(t *testing.T) *redis.Client {
			rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
			t.Cleanup(func() { _ = rdb.Close() })
			return rdb
		}}
	}},
}

func redisBackend(t *testing.T, s *redistest.Server, plain bool) backend {
	return backend{
		plain:  plain,
		client: func(t *testing.T) *redis.Client { return s.Client(t) },
		drop:   func(t *testing.T) { s.Do(t, "CLIENT", "KILL", "TYPE", "pubsub") },
	}
}

// TestBasicsOnEveryServer runs every primitive's basic suite on every
// backend: a Mutex (default and Fair), an RWMutex and a Semaphore are
// locked, refused to a TryLock, asked their TTL, extended, re-entered (or,
// a Semaphore, not), unlocked twice and locked again with a larger fence;
// a contended Lock is woken by the release's message, not by its own look,
// with the waiter's channels subscribed with the kind the server has; a
// waiter whose pub/sub connections are all dropped (on a real server) is
// subscribed again and woken by message on the new subscriptions; and a
// lease whose key is deleted is lost.
func TestBasicsOnEveryServer(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			be := b.start(t)
			for _, p := range exclusives {
				t.Run(p.kind, func(t *testing.T) { basics(t, be, p) })
			}
		})
	}
}

func basics(t *testing.T, be backend, p exclusive) {
	ctx := ctxT(t, time.Minute)
	rdb := be.client(t)
	c1, c2 := newDlock(t, be.client(t)), newDlock(t, be.client(t))
	t.Cleanup(func() { _ = c1.Close(); _ = c2.Close() })
	name := "basics-" + p.kind

	l1, err := p.hold(c1, name)(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l1.Name() != name || len(l1.Token()) != 22 || l1.Fence() == 0 {
		t.Fatalf("lease name=%q token=%q fence=%d", l1.Name(), l1.Token(), l1.Fence())
	}
	if _, err := p.tryWait(c2, name)(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock of a held lock: %v, want ErrNotObtained", err)
	}
	if ttl, err := l1.TTL(ctx); err != nil || ttl <= 0 || ttl > dlock.DefaultTTL {
		t.Fatalf("TTL = %v, %v; want in (0, %v]", ttl, err, dlock.DefaultTTL)
	}
	if err := l1.Extend(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if ttl, err := l1.TTL(ctx); err != nil || ttl <= 20*time.Second {
		t.Fatalf("TTL after Extend(30s) = %v, %v", ttl, err)
	}
	if p.kind == "semaphore" {
		// Permits are counted, not re-entered: the one permit is taken.
		if _, err := p.tryWait(c1, name)(l1.Context()); !errors.Is(err, dlock.ErrNotObtained) {
			t.Fatalf("TryAcquire under the holder's lease: %v, want ErrNotObtained", err)
		}
	} else {
		inner, err := p.hold(c1, name)(l1.Context())
		if err != nil {
			t.Fatalf("re-entering: %v", err)
		}
		if inner.Token() != l1.Token() || inner.Fence() != l1.Fence() {
			t.Fatal("the re-entered lease is not the same holding")
		}
		if err := inner.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := p.tryWait(c2, name)(ctx); !errors.Is(err, dlock.ErrNotObtained) {
			t.Fatalf("the inner Unlock released the lock: TryLock got %v", err)
		}
	}
	for i := range 2 { // Unlock is idempotent
		if err := l1.Unlock(ctx); err != nil {
			t.Fatalf("Unlock %d: %v", i+1, err)
		}
	}
	l2, err := p.tryWait(c2, name)(ctx)
	if err != nil {
		t.Fatalf("TryLock after Unlock: %v", err)
	}
	if l2.Fence() <= l1.Fence() {
		t.Fatalf("fence did not increase: %d then %d", l1.Fence(), l2.Fence())
	}
	if err := l2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	wokenByMessage(t, ctx, be, rdb, p, c1, c2, name, nil)
	if be.drop != nil {
		wokenByMessage(t, ctx, be, rdb, p, c2, c1, name, dropped(t, ctx, be))
	}

	lostWhenDeleted(t, ctx, rdb, p, c1, name+"-deleted")
}

// wokenByMessage has a hold the lock and b wait for it in line, then a
// unlock, until one hand-over reaches b by message rather than by b's own
// look (which may rarely find it first): a waiter that is never told waits
// for its refresh every time. While b waits, fault (if not nil) is done to
// it; either way b must wait subscribed with the server's kind of pub/sub.
func wokenByMessage(t *testing.T, ctx context.Context, be backend, rdb *redis.Client, p exclusive, a, b *dlock.Client, name string, fault func(b *dlock.Client)) {
	t.Helper()
	for round := 1; ; round++ {
		held, err := p.hold(a, name)(ctx)
		if err != nil {
			t.Fatal(err)
		}
		waiting := async(t, ctx, p.wait(b, name))
		waitLine(t, ctx, rdb, wire.HashKey(wire.DefaultPrefix, name), 1)
		if fault != nil {
			fault(b)
		}
		if mine, other := subscribed(ctx, rdb, name, be.plain); mine == 0 || other != 0 {
			t.Fatalf("the waiter's channels: %d subscribed with the server's kind of pub/sub (plain: %v), %d with the other", mine, be.plain, other)
		}
		before := dlock.HandOversHeard(b)
		if err := held.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		l, err := waiting()
		if err != nil {
			t.Fatal(err)
		}
		if l.Fence() <= held.Fence() {
			t.Fatalf("fence did not increase: %d then %d", held.Fence(), l.Fence())
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if dlock.HandOversHeard(b) > before {
			return
		}
		t.Logf("hand-over %d was found by the waiter's look, not by message", round)
		if round == 5 {
			t.Fatal("no hand-over reached the waiter by message in 5 rounds")
		}
	}
}

// dropped is a fault for wokenByMessage: every pub/sub connection of the
// server is dropped, and the waiter's two subscriptions are established
// again (the hub says so) before the release.
func dropped(t *testing.T, ctx context.Context, be backend) func(b *dlock.Client) {
	return func(b *dlock.Client) {
		repaired := dlock.SubscriptionsRepaired(b)
		be.drop(t)
		waitFor(t, ctx, "the waiter's two channels subscribed again", func() bool {
			return dlock.SubscriptionsRepaired(b) >= repaired+2
		})
	}
}

// subscribed counts the channels of the lock name subscribed at the server
// with the kind of pub/sub a plain (or sharded) server has, and with the
// other kind.
func subscribed(ctx context.Context, rdb *redis.Client, name string, plain bool) (mine, other int) {
	pattern := wire.HashKey(wire.DefaultPrefix, name) + "*"
	p := len(rdb.PubSubChannels(ctx, pattern).Val())
	s := len(rdb.PubSubShardChannels(ctx, pattern).Val()) // an error (miniredis) counts as none
	if plain {
		return p, s
	}
	return s, p
}

// lostWhenDeleted: a lease whose key is deleted ends with ErrLockLost at
// the next renewal, and its Unlock and Extend say so.
func lostWhenDeleted(t *testing.T, ctx context.Context, rdb *redis.Client, p exclusive, c *dlock.Client, name string) {
	t.Helper()
	l, err := p.hold(c, name, dlock.TTL(300*time.Millisecond))(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.Del(ctx, wire.HashKey(wire.DefaultPrefix, name)).Err(); err != nil {
		t.Fatal(err)
	}
	lostWithin(t, ctx, l, 3*time.Second, "its key was deleted")
}

// On a server with sharded pub/sub a Client asks which kind it has once,
// with its first lock call, and never again: no lock call pays a round trip
// for it.
func TestPubSubAskedOncePerClient(t *testing.T) {
	s := redistest.Start(t)
	rdb := s.Client(t)
	ctx := ctxT(t, 30*time.Second)
	probes := rdb.SSubscribe(ctx, wire.ProbeChannel(wire.DefaultPrefix))
	defer probes.Close()
	if _, err := probes.Receive(ctx); err != nil { // the confirmation
		t.Fatal(err)
	}
	for _, c := range []*dlock.Client{newDlock(t, s.Client(t)), newDlock(t, s.Client(t))} {
		for range 20 {
			for _, p := range exclusives {
				l, err := p.hold(c, "asked-once-"+p.kind)(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if err := l.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
		_ = c.Close()
	}
	heard := 0
	for {
		rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err := probes.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			break
		}
		heard++
	}
	if heard != 2 {
		t.Fatalf("%d probes published by 2 Clients making 160 lock calls, want 2", heard)
	}
}

// The scripts that publish refuse a publish command other than SPUBLISH
// and PUBLISH, before they change anything; without one they use SPUBLISH
// (the protocol before plain pub/sub was added, which cmd/dlock's unlock
// --force still speaks).
func TestScriptsPublishCommand(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 10*time.Second)
	m, err := c.Mutex("pubcmd").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sem, err := c.Semaphore("pubcmd-sem", 1).Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	mk, sk := wire.KeysOf(wire.DefaultPrefix, "pubcmd"), wire.KeysOf(wire.DefaultPrefix, "pubcmd-sem")
	for _, bad := range []struct {
		s    *wire.Script
		keys []string
		args []any
	}{
		{wire.Release, []string{mk.Hash, mk.Line, mk.Waiters}, []any{m.Token(), m.Fence(), 1000, mk.Hash, "XPUBLISH"}},
		{wire.ForceUnlock, []string{mk.Hash}, []any{1000, mk.Hash, "", "publish"}},
		{wire.Sem, []string{sk.Hash, sk.Holders, sk.Line, sk.Waiters}, []any{wire.SemRelease, sem.Token(), 1000, "EVAL"}},
	} {
		err := rdb.Eval(ctx, bad.s.Src, bad.keys, bad.args...).Err()
		if err == nil || !strings.HasPrefix(err.Error(), wire.ErrArg) {
			t.Errorf("%s with a bad publish command: %v, want %s...", bad.s.Name, err, wire.ErrArg)
		}
	}
	if _, err := c.Mutex("pubcmd").TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("the mutex changed hands after refused scripts: %v", err)
	}
	if _, err := c.Semaphore("pubcmd-sem", 1).TryAcquire(ctx, 1); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("the permit came back after a refused script: %v", err)
	}
	// Without a publish command: SPUBLISH, heard by a sharded subscriber.
	wake := rdb.SSubscribe(ctx, mk.Hash)
	defer wake.Close()
	if _, err := wake.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	if v, err := rdb.Eval(ctx, wire.ForceUnlock.Src, []string{mk.Hash}, 1000, mk.Hash, "").Result(); err != nil {
		t.Fatalf("force_unlock without a publish command: %v, %v", v, err)
	}
	if msg, err := wake.ReceiveMessage(ctx); err != nil || msg.Payload != strconv.FormatUint(m.Fence(), 10) {
		t.Fatalf("wake-up: %v, %v; want the fence %d by SPUBLISH", msg, err, m.Fence())
	}
	if err := m.Unlock(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Unlock after force_unlock: %v, want ErrLockLost", err)
	}
	_ = sem.Unlock(ctx)
}

// What miniredis shows of time (as the README says): a key's TTL runs out
// only when the test calls FastForward, so a Mutex lease that nobody renews
// stays held there however long the test waits; the holdings of a
// Semaphore or RWMutex run out by the server clock that scripts read
// (TIME), which FastForward does not move and SetTime does.
func TestMiniredisTime(t *testing.T) {
	// The README's lines for a unit test, as they are there.
	mr := miniredis.RunT(t) // an in-process server, closed when the test ends
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	locks := dlock.New(rdb)
	t.Cleanup(func() { locks.Close(); rdb.Close() })

	c := locks
	ctx := ctxT(t, 10*time.Second)

	if _, err := c.Mutex("m", dlock.TTL(50*time.Millisecond), dlock.NoRenew()).Lock(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond) // past the TTL in real time: what is tested
	if _, err := c.Mutex("m").TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock after the TTL passed in real time: %v, want ErrNotObtained (miniredis keys expire by FastForward only)", err)
	}
	mr.FastForward(50 * time.Millisecond)
	if l, err := c.Mutex("m").TryLock(ctx); err != nil {
		t.Fatalf("TryLock after FastForward past the TTL: %v", err)
	} else {
		_ = l.Unlock(ctx)
	}

	if _, err := c.Semaphore("s", 1, dlock.TTL(time.Minute), dlock.NoRenew()).Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	mr.FastForward(2 * time.Minute)
	if _, err := c.Semaphore("s", 1).TryAcquire(ctx, 1); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryAcquire after FastForward past the TTL: %v, want ErrNotObtained (the holding's deadline is read from TIME)", err)
	}
	mr.SetTime(time.Now().Add(2 * time.Minute))
	if l, err := c.Semaphore("s", 1).TryAcquire(ctx, 1); err != nil {
		t.Fatalf("TryAcquire after SetTime past the TTL: %v", err)
	} else {
		_ = l.Unlock(ctx)
	}
}

// A go-redis ClusterClient whose slot map comes from a ClusterSlots func
// rather than the servers is not always a Redis Cluster: it is what
// redis.NewFailoverClusterClient makes of a Sentinel-managed primary, and
// what servers sharded by hand look like. Its servers may lack SPUBLISH, so
// a Client must ask them, as it asks a single server: on one without
// SPUBLISH every primitive's waiter is woken by message, subscribed with
// SUBSCRIBE. (Before, it was taken for a Cluster: the scripts' SPUBLISH
// failed, and waiters woke only at their next look.)
func TestClusterClientOfPlainServers(t *testing.T) {
	s := redistest.Start(t, redistest.Options{NoShardedPubSub: true})
	be := backend{plain: true, client: func(t *testing.T) *redis.Client { return s.Client(t) }}
	rdb := s.Client(t)
	ctx := ctxT(t, time.Minute)
	newClient := func() *dlock.Client {
		cc := redis.NewClusterClient(&redis.ClusterOptions{
			ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
				return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: []redis.ClusterNode{{Addr: s.Addr()}}}}, nil
			},
		})
		c := newDlock(t, cc)
		t.Cleanup(func() { _ = c.Close(); _ = cc.Close() })
		return c
	}
	a, b := newClient(), newClient()
	for _, p := range exclusives {
		t.Run(p.kind, func(t *testing.T) {
			wokenByMessage(t, ctx, be, rdb, p, a, b, "slots-func-"+p.kind, nil)
		})
	}
}
