package dlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// foreignTake takes key as the other libraries do (SET NX PX with a random
// value of their own) and returns a release that compare-and-deletes it.
func foreignTake(t *testing.T, ctx context.Context, rdb redis.Cmdable, key string, ttl time.Duration) (release func()) {
	t.Helper()
	value := "foreign-" + t.Name()
	ok, err := rdb.SetNX(ctx, key, value, ttl).Result()
	if err != nil || !ok {
		t.Fatalf("SET %s NX PX: %v, %v", key, ok, err)
	}
	return func() {
		del := redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)
		if n, err := del.Run(ctx, rdb, []string{key}, value).Int(); err != nil || n != 1 {
			t.Errorf("compare-and-delete of %s: %d, %v", key, n, err)
		}
	}
}

func TestStringMutexFormat(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 10*time.Second)
	m := c.StringMutex("jobs:nightly", dlock.TTL(5*time.Second))
	l, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The key as given, a string holding the token, with the lease's TTL:
	// what redsync, redis-py and node-redlock write.
	if v, err := rdb.Get(ctx, "jobs:nightly").Result(); err != nil || v != l.Token() {
		t.Fatalf("GET jobs:nightly = %q, %v; want the token %q", v, err, l.Token())
	}
	if ttl := rdb.PTTL(ctx, "jobs:nightly").Val(); ttl <= 4*time.Second || ttl > 5*time.Second {
		t.Fatalf("PTTL = %v, want about 5s", ttl)
	}
	if f, _ := rdb.HGet(ctx, "{jobs:nightly}:dlock-fence", "f").Uint64(); f != l.Fence() || f == 0 {
		t.Fatalf("fence counter holds %d, lease fence %d", f, l.Fence())
	}
	if ttl, err := l.TTL(ctx); err != nil || ttl <= 4*time.Second {
		t.Fatalf("TTL = %v, %v", ttl, err)
	}
	if err := l.Extend(ctx, 8*time.Second); err != nil {
		t.Fatal(err)
	}
	if ttl := rdb.PTTL(ctx, "jobs:nightly").Val(); ttl <= 7*time.Second {
		t.Fatalf("PTTL after Extend(8s) = %v", ttl)
	}
	// Reentrant through the lease context; the key is released with the
	// outermost lease.
	inner, err := m.Lock(l.Context())
	if err != nil || inner.Fence() != l.Fence() {
		t.Fatalf("reentrant Lock: %v (fence %d, outer %d)", err, inner.Fence(), l.Fence())
	}
	if err := inner.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if n := rdb.Exists(ctx, "jobs:nightly").Val(); n != 1 {
		t.Fatal("inner Unlock released the key")
	}
	if _, err := c.StringMutex("jobs:nightly").TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock while held: %v, want ErrNotObtained", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if n := rdb.Exists(ctx, "jobs:nightly").Val(); n != 0 {
		t.Fatal("key left after Unlock")
	}
	// Nothing under dlock's prefix: the other libraries would not see it.
	if keys := rdb.Keys(ctx, "dlock:*").Val(); len(keys) != 0 {
		t.Fatalf("keys under dlock's prefix: %v", keys)
	}
	l2, err := m.TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l2.Fence() <= l.Fence() {
		t.Fatalf("fence went back: %d then %d", l.Fence(), l2.Fence())
	}
	if err := l2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestStringMutexBadInput(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 10*time.Second)
	for _, tc := range []struct {
		key  string
		opts []dlock.LockOption
		want string
	}{
		{"", nil, "empty"},
		{strings.Repeat("k", dlock.MaxNameLen+1), nil, "longer than"},
		{"a}b", nil, "hash tag"},
		{"dlock:{x}", nil, "dlock's own key"},
		{"ok", []dlock.LockOption{dlock.Fair()}, "know no line"},
		{"ok", []dlock.LockOption{dlock.TTL(0)}, "TTL"},
	} {
		_, err := c.StringMutex(tc.key, tc.opts...).TryLock(ctx)
		if !errors.Is(err, dlock.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("StringMutex(%.20q): %v, want ErrInvalidArgument saying %q", tc.key, err, tc.want)
		}
	}
	// A key that holds something else is reported, never overwritten.
	rdb.HSet(ctx, "a-hash", "x", "1")
	rdb.RPush(ctx, "a-list", "x")
	for _, key := range []string{"a-hash", "a-list"} {
		_, err := c.StringMutex(key).TryLock(ctx)
		if !errors.Is(err, dlock.ErrForeignKey) {
			t.Errorf("TryLock on %s: %v, want ErrForeignKey", key, err)
		}
		lctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err = c.StringMutex(key).Lock(lctx)
		cancel()
		if !errors.Is(err, dlock.ErrForeignKey) {
			t.Errorf("Lock on %s: %v, want ErrForeignKey at once", key, err)
		}
	}
	if rdb.Type(ctx, "a-hash").Val() != "hash" || rdb.Type(ctx, "a-list").Val() != "list" {
		t.Fatal("a foreign key was overwritten")
	}
	// A key with a hash tag keeps its counter in its slot by the tag.
	l, err := c.StringMutex("orders:{17}:lock").TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rdb.Exists(ctx, "orders:{17}:lock:dlock-fence").Val() != 1 {
		t.Fatal("the counter of a tagged key is not key + :dlock-fence")
	}
	_ = l.Unlock(ctx)
}

// TestStringMutexLostToOtherLibrary: a key deleted or overwritten under a
// dlock holder (by an operator, or another library whose own lease expired
// as it thought) ends the lease: its context, Extend, Unlock.
func TestStringMutexLostToOtherLibrary(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 10*time.Second)
	for _, how := range []string{"deleted", "overwritten", "made a hash"} {
		m := c.StringMutex("lost:"+how, dlock.TTL(300*time.Millisecond))
		l, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		switch how {
		case "deleted":
			rdb.Del(ctx, "lost:"+how)
		case "overwritten":
			rdb.Set(ctx, "lost:"+how, "redsync-value", time.Minute)
		default:
			rdb.Del(ctx, "lost:"+how)
			rdb.HSet(ctx, "lost:"+how, "x", "1")
		}
		select {
		case <-l.Context().Done():
		case <-time.After(2 * time.Second):
			t.Fatalf("%s: lease context still live", how)
		}
		if cause := context.Cause(l.Context()); !errors.Is(cause, dlock.ErrLockLost) {
			t.Fatalf("%s: cause %v, want ErrLockLost", how, cause)
		}
		if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrLockLost) {
			t.Fatalf("%s: Unlock: %v, want ErrLockLost", how, err)
		}
		if how == "overwritten" && rdb.Get(ctx, "lost:"+how).Val() != "redsync-value" {
			t.Fatal("Unlock of a lost lease touched the new holder's key")
		}
	}
}

// TestStringMutexWaitsForOtherLibrary: a Lock waits while another library
// holds the key, and is woken by that library's compare-and-delete, with
// keyspace notifications on and (polling) off; no more than a few of its
// looks per release either way.
func TestStringMutexWaitsForOtherLibrary(t *testing.T) {
	for _, notify := range []string{"", "Kgx"} { // as README.md tells operators
		t.Run("notify="+notify, func(t *testing.T) {
			s := redistest.Start(t, redistest.Options{Args: []string{"--notify-keyspace-events", notify}})
			c, rdb := newClient(t, s)
			ctx := ctxT(t, 10*time.Second)
			release := foreignTake(t, ctx, rdb, "shared", time.Minute)
			asked := commandCalls(t, ctx, rdb, "config|get")
			get := async(t, ctx, c.StringMutex("shared").Lock)
			// It looks, and waits: it listens for the key's keyspace events
			// (whether or not the server sends them), and asks the server
			// whether it sends them (polling until it knows). Waited for,
			// not slept on: looks counted before it knows are polls.
			waitFor(t, ctx, "a subscriber of the key's keyspace channel", func() bool {
				return rdb.PubSubNumSub(ctx, "__keyspace@0__:shared").Val()["__keyspace@0__:shared"] == 1
			})
			waitFor(t, ctx, "the waiter's question about notify-keyspace-events", func() bool {
				return commandCalls(t, ctx, rdb, "config|get") > asked
			})
			before := evalshaCalls(t, ctx, rdb)
			time.Sleep(700 * time.Millisecond)
			looks := evalshaCalls(t, ctx, rdb) - before
			// Notified, it looks again only at its refresh (a third of a
			// second); polling, every 25-75 ms.
			if notify != "" && looks > 4 || notify == "" && looks < 6 {
				t.Fatalf("%d looks in 700ms while held", looks)
			}
			release()
			start := time.Now()
			l, err := get()
			if err != nil {
				t.Fatal(err)
			}
			if took := time.Since(start); took > time.Second {
				t.Fatalf("woken %v after the release", took)
			}
			_ = l.Unlock(ctx)
		})
	}
}

// TestStringMutexDlockWakesDlock: between dlock Clients the release's own
// wake-up is heard, notifications or not.
func TestStringMutexDlockWakesDlock(t *testing.T) {
	s := redistest.Start(t)
	cs, _ := newClients(t, s, 2)
	ctx := ctxT(t, 10*time.Second)
	l, err := cs[0].StringMutex("k").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := lockedAt(t, ctx, cs[1].StringMutex("k").Lock)
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	at, ok := <-got
	if !ok {
		t.Fatal("Lock failed")
	}
	if at.Sub(start) > time.Second {
		t.Fatalf("woken %v after the release", at.Sub(start))
	}
}

func TestStringMutexContend(t *testing.T) {
	s := redistest.Start(t)
	cs, rdb := newClients(t, s, 3)
	ctx := ctxT(t, 20*time.Second)
	contend(t, ctx, rdb, 6, 20, func(g int) *dlock.Mutex { return cs[g%3].StringMutex("hot") })
}

func TestStringMutexCluster(t *testing.T) {
	nodes := redistest.Cluster(t, 3)
	rdb := redistest.ClusterClient(t, nodes)
	ctx := ctxT(t, 30*time.Second)
	var cs []*dlock.Client
	for i := 0; i < 2; i++ {
		c := newDlock(t, rdb)
		t.Cleanup(func() { _ = c.Close() })
		cs = append(cs, c)
	}
	// Keys with and without a hash tag, on several nodes: each one's
	// counter must share its slot (a script touching both would otherwise
	// be refused with CROSSSLOT).
	for _, key := range []string{"a", "b", "c", "d", "orders:{7}:lock", "{x}y"} {
		t.Run(key, func(t *testing.T) {
			contend(t, ctx, rdb, 4, 5, func(g int) *dlock.Mutex { return cs[g%2].StringMutex(key) })
		})
	}
}

// TestStringMutexClusterNotifyOnSomeNodes: on a Cluster where only some
// masters send keyspace notifications (each node has its own setting, and
// publishes only its own keys' events), a waiter for a key on a master
// without them polls, though a waiter for a key on a master with them
// made its Client learn "on" first.
func TestStringMutexClusterNotifyOnSomeNodes(t *testing.T) {
	nodes := redistest.Cluster(t, 3)
	rdb := redistest.ClusterClient(t, nodes)
	ctx := ctxT(t, 30*time.Second)
	master := func(key string) *redistest.Server {
		n, err := rdb.MasterForKey(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range nodes {
			if s.Addr() == n.Options().Addr {
				return s
			}
		}
		t.Fatalf("no node at %s", n.Options().Addr)
		return nil
	}
	on := master("a")
	on.Do(t, "CONFIG", "SET", "notify-keyspace-events", "Kgx")
	var off string
	for _, k := range []string{"b", "c", "d", "e", "f", "g", "h"} {
		if master(k) != on {
			off = k
			break
		}
	}
	c := newDlock(t, rdb)
	t.Cleanup(func() { _ = c.Close() })
	for _, key := range []string{"a", off} {
		release := foreignTake(t, ctx, rdb, key, time.Minute)
		admin := master(key).Client(t)
		asked := commandCalls(t, ctx, admin, "config|get")
		get := async(t, ctx, c.StringMutex(key).Lock)
		// It looks, learns the node's setting, and waits: waited for, not
		// slept on (looks counted before it knows are polls).
		waitFor(t, ctx, "the waiter's question about notify-keyspace-events on the key's master", func() bool {
			return commandCalls(t, ctx, admin, "config|get") > asked
		})
		before := evalshaCalls(t, ctx, admin)
		time.Sleep(700 * time.Millisecond)
		looks := evalshaCalls(t, ctx, admin) - before
		if key == "a" && looks > 4 || key == off && looks < 6 {
			t.Errorf("key %s (notifications %v on its master): %d looks in 700ms while held", key, key == "a", looks)
		}
		release()
		l, err := get()
		if err != nil {
			t.Fatal(err)
		}
		_ = l.Unlock(ctx)
	}
}
