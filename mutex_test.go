package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func newClient(t testing.TB, s *redistest.Server, opts ...dlock.Option) (*dlock.Client, *redis.Client) {
	t.Helper()
	rdb := s.Client(t)
	c := newDlock(t, rdb, opts...)
	t.Cleanup(func() { _ = c.Close() })
	return c, rdb
}

// lockAbove locks m, checks that its fence is above prev (what names the
// event in between), unlocks, and returns the fence.
func lockAbove(t *testing.T, ctx context.Context, m *dlock.Mutex, prev uint64, what string) uint64 {
	t.Helper()
	l, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l.Fence() <= prev {
		t.Fatalf("fence went back %s: %d then %d", what, prev, l.Fence())
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	return l.Fence()
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestLockUnlock(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 10*time.Second)
	m := c.Mutex("orders/17")
	l, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l.Name() != "orders/17" || len(l.Token()) != 22 || l.Fence() == 0 {
		t.Fatalf("lease name=%q token=%q fence=%d", l.Name(), l.Token(), l.Fence())
	}
	if _, err := c.Mutex("orders/17").TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock on a held lock: %v, want ErrNotObtained", err)
	}
	ttl, err := l.TTL(ctx)
	if err != nil || ttl <= 9*time.Second || ttl > 10*time.Second {
		t.Fatalf("TTL = %v, %v; want about 10s", ttl, err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("second Unlock: %v, want nil", err)
	}
	if l.Context().Err() == nil {
		t.Fatal("lease context still live after Unlock")
	}
	l2, err := m.TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l2.Fence() <= l.Fence() {
		t.Fatalf("fence did not increase: %d then %d", l.Fence(), l2.Fence())
	}
	if l2.Token() == l.Token() {
		t.Fatal("token reused")
	}
	if err := l2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// After unlock only the fence counter remains, with the idle expiry.
	if o, _ := rdb.HGet(ctx, "dlock:{orders/17}", "o").Result(); o != "" {
		t.Fatalf("owner field left behind: %q", o)
	}
	pttl := rdb.PTTL(ctx, "dlock:{orders/17}").Val()
	if pttl <= 9*time.Minute || pttl > 10*time.Minute {
		t.Fatalf("idle key PTTL = %v, want about 10m", pttl)
	}
}

func TestLockWaitsForRelease(t *testing.T) {
	s := redistest.Start(t)
	c1, rdb := newClient(t, s)
	c2, _ := newClient(t, s)
	ctx := ctxT(t, 10*time.Second)
	l1, err := c1.Mutex("w").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := lockedAt(t, ctx, c2.Mutex("w").Lock)
	waitLine(t, ctx, rdb, "dlock:{w}", 1) // the waiter waits in line
	released := time.Now()
	if err := l1.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	at, ok := <-got
	if !ok {
		t.Fatal("waiter failed")
	}
	// Notified, not polled and not waiting for the 10s TTL: a release wakes
	// the waiter within a fraction of a second even on a loaded machine.
	if d := at.Sub(released); d > 2*time.Second {
		t.Fatalf("waiter took %v after release", d)
	}
}

func TestWaitBoundedByHolderTTL(t *testing.T) {
	// A holder that vanishes without unlocking (no renewal, no release
	// message) costs a waiter its remaining TTL, not more.
	s := redistest.Start(t)
	c1, _ := newClient(t, s)
	c2, _ := newClient(t, s)
	ctx := ctxT(t, 10*time.Second)
	if _, err := c1.Mutex("crash", dlock.TTL(300*time.Millisecond), dlock.NoRenew()).Lock(ctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	l, err := c2.Mutex("crash").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("waited %v for a 300ms TTL", d)
	}
	_ = l.Unlock(ctx)
}

func TestContextEndsWait(t *testing.T) {
	s := redistest.Start(t)
	c, _ := newClient(t, s)
	ctx := ctxT(t, 10*time.Second)
	l, err := c.Mutex("busy").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(ctx)

	dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	_, err = c.Mutex("busy").Lock(dctx)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock after deadline: %v, want DeadlineExceeded", err)
	}
	cctx, cancel2 := context.WithCancel(ctx)
	defer cancel2()
	get := async(t, cctx, c.Mutex("busy").Lock)
	waitFor(t, ctx, "the second Lock asleep in line", func() bool {
		n, asleep := dlock.QueuedLocally(c, "busy")
		return n == 1 && asleep
	})
	cancel2()
	_, err = get()
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Lock after cancel: %v, want Canceled", err)
	}
	if !strings.Contains(err.Error(), `"busy"`) {
		t.Fatalf("error does not name the lock: %v", err)
	}
}

func TestUnreachableServer(t *testing.T) {
	s := redistest.Start(t)
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1})
	defer rdb.Close()
	c := newDlock(t, rdb)
	defer c.Close()
	s.Kill()
	ctx := ctxT(t, 10*time.Second)
	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Mutex("x").Lock(dctx)
	if err == nil {
		t.Fatal("Lock succeeded with the server down")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock with server down: %v, want DeadlineExceeded", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Lock took %v past a 300ms ctx", d)
	}
	_, err = c.Mutex("x").TryLock(ctx)
	if err == nil || errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock with server down: %v, want a connection error", err)
	}
}

func TestPausedServerWithinCtx(t *testing.T) {
	s := redistest.Start(t)
	c, _ := newClient(t, s)
	ctx := ctxT(t, 10*time.Second)
	if _, err := c.Mutex("p").TryLock(ctx); err != nil { // warm the connection
		t.Fatal(err)
	}
	s.Pause()
	defer s.Resume()
	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := c.Mutex("q").TryLock(dctx)
	if err == nil {
		t.Fatal("TryLock succeeded against a paused server")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("TryLock took %v past a 300ms ctx", d)
	}
}

func TestBadInput(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 10*time.Second)
	cases := []struct {
		name string
		m    *dlock.Mutex
		want string
	}{
		{"empty name", c.Mutex(""), "empty"},
		{"oversized name", c.Mutex(strings.Repeat("n", dlock.MaxNameLen+1)), "longer than MaxNameLen"},
		{"zero TTL", c.Mutex("a", dlock.TTL(0)), "below 1ms"},
		{"negative TTL", c.Mutex("a", dlock.TTL(-time.Second)), "below 1ms"},
		{"sub-ms TTL", c.Mutex("a", dlock.TTL(500*time.Microsecond)), "below 1ms"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, call := range []func() error{
				func() error { _, err := tc.m.Lock(ctx); return err },
				func() error { _, err := tc.m.TryLock(ctx); return err },
				func() error { return tc.m.Do(ctx, func(context.Context) error { return nil }) },
			} {
				err := call()
				if !errors.Is(err, dlock.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("got %v, want ErrInvalidArgument mentioning %q", err, tc.want)
				}
			}
		})
	}
	// Names that collide with keys that are not locks are refused and left alone.
	rdb.Set(ctx, "dlock:{str}", "precious", 0)
	rdb.HSet(ctx, "dlock:{hash}", "field", "precious")
	rdb.HSet(ctx, "dlock:{other}", "k", "semaphore")
	for _, name := range []string{"str", "hash", "other"} {
		_, err := c.Mutex(name).TryLock(ctx)
		if !errors.Is(err, dlock.ErrForeignKey) || !strings.Contains(err.Error(), "dlock:{"+name+"}") {
			t.Fatalf("lock on foreign key %s: %v, want ErrForeignKey naming the key", name, err)
		}
	}
	if v := rdb.Get(ctx, "dlock:{str}").Val(); v != "precious" {
		t.Fatalf("foreign string changed to %q", v)
	}
	if v := rdb.HGetAll(ctx, "dlock:{hash}").Val(); len(v) != 1 || v["field"] != "precious" {
		t.Fatalf("foreign hash changed to %v", v)
	}
	// Use after Close.
	l, err := c.Mutex("held").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lctx := l.Context()
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Mutex("x").Lock(ctx); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("Lock after Close: %v, want ErrClosed", err)
	}
	if !errors.Is(context.Cause(lctx), dlock.ErrClosed) {
		t.Fatalf("lease context cause after Close: %v", context.Cause(lctx))
	}
	if o := rdb.HGet(ctx, "dlock:{held}", "o").Val(); o != "" {
		t.Fatal("Close left its lease locked at Redis")
	}
	if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("Unlock after Close: %v, want ErrClosed", err)
	}
}

func TestLeaseLostWhenKeyDeletedOrOverwritten(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 10*time.Second)
	for _, tamper := range []struct {
		name string
		do   func(key string)
	}{
		{"deleted", func(key string) { rdb.Del(ctx, key) }},
		{"overwritten", func(key string) { rdb.Set(ctx, key, "someone else", 0) }},
		{"taken", func(key string) { rdb.HSet(ctx, key, "o", "another-token") }},
	} {
		t.Run(tamper.name, func(t *testing.T) {
			name := "tamper-" + tamper.name
			l, err := c.Mutex(name, dlock.TTL(300*time.Millisecond)).Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			tamper.do("dlock:{" + name + "}")
			lostWithin(t, ctx, l, 3*time.Second, "the key was tampered with")
		})
	}
	if v := rdb.Get(ctx, "dlock:{tamper-overwritten}").Val(); v != "someone else" {
		t.Fatalf("the foreign value was touched: %q", v)
	}
	if v := rdb.HGet(ctx, "dlock:{tamper-taken}", "o").Val(); v != "another-token" {
		t.Fatalf("the other owner was touched: %q", v)
	}
}

// lostWithin checks that l's context ends within d (after what happened)
// with cause ErrLockLost, and that its Extend and Unlock then say so.
func lostWithin(t *testing.T, ctx context.Context, l *dlock.Lease, d time.Duration, after string) {
	t.Helper()
	select {
	case <-l.Context().Done():
	case <-time.After(d):
		t.Fatalf("lease context still live %v after %s", d, after)
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, dlock.ErrLockLost) {
		t.Fatalf("cause %v, want ErrLockLost", cause)
	}
	if err := l.Extend(ctx, time.Second); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Extend of a lost lease: %v, want ErrLockLost", err)
	}
	if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Unlock of a lost lease: %v, want ErrLockLost", err)
	}
}

func TestWatchdogRenews(t *testing.T) {
	s := redistest.Start(t)
	c, _ := newClient(t, s)
	ctx := ctxT(t, 10*time.Second)
	l, err := c.Mutex("renewed", dlock.TTL(600*time.Millisecond)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Second) // over three TTLs
	if err := l.Context().Err(); err != nil {
		t.Fatalf("renewed lease ended: %v", context.Cause(l.Context()))
	}
	if _, err := c.Mutex("renewed").TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("renewed lock was obtainable: %v", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}

	// NoRenew: the lease ends at its TTL, and the context says so.
	l, err = c.Mutex("unrenewed", dlock.TTL(200*time.Millisecond), dlock.NoRenew()).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Context().Done():
	case <-time.After(2 * time.Second):
		t.Fatal("NoRenew lease context outlived its TTL by 1.8s")
	}
	if !errors.Is(context.Cause(l.Context()), dlock.ErrLockLost) {
		t.Fatalf("cause %v", context.Cause(l.Context()))
	}
	if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Unlock after expiry: %v, want ErrLockLost", err)
	}
}

func TestExtend(t *testing.T) {
	s := redistest.Start(t)
	c, _ := newClient(t, s)
	ctx := ctxT(t, 10*time.Second)
	l, err := c.Mutex("ext", dlock.TTL(time.Second), dlock.NoRenew()).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Extend(ctx, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	ttl, err := l.TTL(ctx)
	if err != nil || ttl < 4*time.Second {
		t.Fatalf("TTL after Extend(5s) = %v, %v", ttl, err)
	}
	if err := l.Extend(ctx, 0); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Fatalf("Extend(0): %v", err)
	}
	// An expired lease is never revived by Extend.
	l2, err := c.Mutex("ext2", dlock.TTL(50*time.Millisecond), dlock.NoRenew()).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(150 * time.Millisecond) // past its 50ms TTL: an expired lease is what is tested
	if err := l2.Extend(ctx, time.Minute); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Extend after expiry: %v, want ErrLockLost", err)
	}
	if l3, err := c.Mutex("ext2").TryLock(ctx); err != nil {
		t.Fatalf("lock not free after its lease expired and Extend failed: %v", err)
	} else {
		_ = l3.Unlock(ctx)
	}
	_ = l.Unlock(ctx)
}

func TestReentrant(t *testing.T) {
	s := redistest.Start(t)
	c, _ := newClient(t, s)
	ctx := ctxT(t, 10*time.Second)
	m := c.Mutex("re")
	outer, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// A different lock in between does not hide the outer one.
	other, err := c.Mutex("other").Lock(outer.Context())
	if err != nil {
		t.Fatal(err)
	}
	inner, err := c.Mutex("re").Lock(other.Context())
	if err != nil {
		t.Fatalf("reentrant Lock: %v", err)
	}
	if inner.Fence() != outer.Fence() || inner.Token() != outer.Token() {
		t.Fatal("reentrant lease is not the same holding")
	}
	if _, err := m.TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("unrelated ctx re-entered: %v", err)
	}
	if err := inner.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := m.TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("inner Unlock released the lock: %v", err)
	}
	if err := outer.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := m.TryLock(ctx)
	if err != nil {
		t.Fatalf("outer Unlock did not release: %v", err)
	}
	_ = l.Unlock(ctx)
	_ = other.Unlock(ctx)
	// A context of another Client does not re-enter this one's locks.
	c2, _ := newClient(t, s)
	l, err = m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c2.Mutex("re").TryLock(l.Context()); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("another Client re-entered: %v", err)
	}
	_ = l.Unlock(ctx)
}

func TestDo(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 10*time.Second)
	boom := errors.New("boom")
	err := c.Mutex("do").Do(ctx, func(ctx context.Context) error {
		if _, err := c.Mutex("do").TryLock(context.Background()); !errors.Is(err, dlock.ErrNotObtained) {
			t.Errorf("lock not held inside Do: %v", err)
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Do returned %v, want fn's error", err)
	}
	// Lost inside fn: fn's ctx ends and Do reports ErrLockLost.
	err = c.Mutex("do", dlock.TTL(200*time.Millisecond)).Do(ctx, func(fctx context.Context) error {
		rdb.Del(ctx, "dlock:{do}")
		select {
		case <-fctx.Done():
			return nil
		case <-time.After(3 * time.Second):
			return errors.New("fn ctx not ended")
		}
	})
	if !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Do with lost lease: %v, want ErrLockLost", err)
	}
}

func TestScriptFlushAndRestart(t *testing.T) {
	s := redistest.Start(t, redistest.Options{AOF: true, AppendFsync: "always"})
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	m := c.Mutex("sf")
	var last uint64
	for i := 0; i < 3; i++ {
		rdb.ScriptFlush(ctx)
		l, err := m.Lock(ctx)
		if err != nil {
			t.Fatalf("Lock after SCRIPT FLUSH: %v", err)
		}
		if l.Fence() <= last {
			t.Fatalf("fence went from %d to %d", last, l.Fence())
		}
		last = l.Fence()
		rdb.ScriptFlush(ctx)
		if err := l.Unlock(ctx); err != nil {
			t.Fatalf("Unlock after SCRIPT FLUSH: %v", err)
		}
	}
	l, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.Restart(t)
	// The key survived (AOF always); scripts are gone. Extend and Unlock must
	// reload and report the truth.
	if err := l.Extend(ctx, 5*time.Second); err != nil {
		t.Fatalf("Extend after restart: %v", err)
	}
	if _, err := c.Mutex("sf").TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock after restart: %v, want ErrNotObtained", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("Unlock after restart: %v", err)
	}
	lockAbove(t, ctx, m, l.Fence(), "across a restart")
}

func TestLocalQueueFIFO(t *testing.T) {
	// Waiters of one Client are served in arrival order.
	s := redistest.Start(t)
	c, _ := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	holder, err := c.Mutex("fifo").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const n = 8
	var order []int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			l, err := c.Mutex("fifo").Lock(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			time.Sleep(5 * time.Millisecond) // hold time
			_ = l.Unlock(ctx)
		}(i)
		// Arrive in order: the next one starts once this one has queued.
		waitFor(t, ctx, fmt.Sprintf("waiter %d queued", i), func() bool {
			n, _ := dlock.QueuedLocally(c, "fifo")
			return n == i+1
		})
	}
	_ = holder.Unlock(ctx)
	wg.Wait()
	for i, v := range order {
		if v != i {
			t.Fatalf("service order %v, want arrival order", order)
		}
	}
}

func TestGoroutineContention(t *testing.T) {
	// Many goroutines on two Clients increment a Redis counter with
	// read-modify-write under the lock: no update is lost.
	s := redistest.Start(t)
	cs, rdb := newClients(t, s, 2)
	contend(t, ctxT(t, 60*time.Second), rdb, 32, 20, func(g int) *dlock.Mutex { return cs[g%2].Mutex("counter") })
}

// TestOnlyHeadContends: waiters of one Client queue locally and only the
// head asks Redis when the lock is released, so a hot lock does not
// stampede: n queued waiters cost O(n) script calls to drain, not O(n²).
// (Each arrival still makes one attempt of its own before it queues.)
func TestOnlyHeadContends(t *testing.T) {
	s := redistest.Start(t)
	c1, rdb := newClient(t, s)
	c2, _ := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	holder, err := c1.Mutex("herd").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const n = 16
	var done []<-chan time.Time
	for i := 0; i < n; i++ {
		done = append(done, lockedAt(t, ctx, c2.Mutex("herd").Lock))
	}
	// All queued, the head asleep in line; the holder still holds.
	waitFor(t, ctx, fmt.Sprintf("%d waiters queued, the head asleep in line", n), func() bool {
		q, asleep := dlock.QueuedLocally(c2, "herd")
		return q == n && asleep
	})
	rdb.ConfigResetStat(ctx)
	_ = holder.Unlock(ctx)
	for _, ch := range done {
		if _, ok := <-ch; !ok {
			t.FailNow()
		}
	}
	// One release and n acquire+release pairs, plus a few failed attempts
	// of each new head; a stampede would be about n²/2 attempts.
	if calls := evalshaCalls(t, ctx, rdb); calls > 4*n {
		t.Fatalf("%d script calls to drain %d local waiters: they stampede", calls, n)
	}
}

func evalshaCalls(t *testing.T, ctx context.Context, rdb *redis.Client) int {
	t.Helper()
	return commandCalls(t, ctx, rdb, "evalsha")
}

// commandCalls is how many times the server ran cmd (as INFO commandstats
// names it: "evalsha", "config|get").
func commandCalls(t *testing.T, ctx context.Context, rdb *redis.Client, cmd string) int {
	t.Helper()
	for _, line := range strings.Split(rdb.Info(ctx, "commandstats").Val(), "\r\n") {
		if v, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":calls="); ok {
			n, _ := strconv.Atoi(v[:strings.IndexByte(v, ',')])
			return n
		}
	}
	return 0
}

// TestDefaultHeadHandOver: in default mode the head of each Client's queue
// (and only the head) takes a place in the lock's line at Redis, and a
// release hands the lock straight to it. The line goes round the Clients in
// turns: a Client that gets the lock through Redis passes it to the waiters
// it had queued by then (see pass.go), not to later ones, and then the lock
// goes on to the next Client in line.
func TestDefaultHeadHandOver(t *testing.T) {
	s := redistest.Start(t)
	cs, rdb := newClients(t, s, 3)
	ctx := ctxT(t, 20*time.Second)
	holder, err := cs[0].Mutex("hand").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Two waiters on each of the other Clients, Client 1's first.
	type got struct {
		client int
		l      *dlock.Lease
	}
	gots := make(chan got, 5)
	start := func(i int) {
		go func() {
			l, err := cs[i].Mutex("hand").Lock(ctx)
			if err != nil {
				t.Error(err)
			}
			gots <- got{i, l}
		}()
	}
	for _, i := range []int{1, 1, 2, 2} {
		start(i)
		if i == 1 {
			waitLine(t, ctx, rdb, "dlock:{hand}", 1)
		}
	}
	waitLine(t, ctx, rdb, "dlock:{hand}", 2)
	waitFor(t, ctx, "the second waiters queued locally", func() bool {
		n1, _ := dlock.QueuedLocally(cs[1], "hand")
		n2, _ := dlock.QueuedLocally(cs[2], "hand")
		return n1 == 2 && n2 == 2
	})
	// Not ordering: time for a wrong place in line (a queued waiter that is
	// not its Client's head) to show, since the check below is that none does.
	time.Sleep(100 * time.Millisecond)
	if n := rdb.LLen(ctx, "dlock:{hand}:q").Val(); n != 2 {
		t.Fatalf("%d places in line, want one per waiting Client", n)
	}
	last := holder.Fence()
	_ = holder.Unlock(ctx)
	// After each grant, how many waiters its Client still has queued: the
	// next head among them must be asleep in line before the holder unlocks,
	// or nothing could be passed to it (nor wrongly, to a waiter that arrived
	// during the turn).
	queuedAfter := []int{2, 1, 1, 0, 0}
	var order []int
	for k := range 5 {
		g := <-gots
		if g.l == nil {
			t.FailNow()
		}
		if g.l.Fence() <= last {
			t.Fatalf("fence %d after %d", g.l.Fence(), last)
		}
		last = g.l.Fence()
		order = append(order, g.client)
		if want := []int{1, 1, 2, 2, 1}; g.client != want[k] {
			t.Fatalf("Clients served in order %v so far, want 1 1 2 2 1 (turns round the line)", order)
		}
		if k == 0 {
			start(1) // arrives during Client 1's turn: waits for the next one
		}
		waitFor(t, ctx, fmt.Sprintf("grant %d: the next head of Client %d asleep in line", k, g.client), func() bool {
			n, asleep := dlock.QueuedLocally(cs[g.client], "hand")
			return n == queuedAfter[k] && asleep == (n > 0)
		})
		// Redis knows the holder, whether it came through Redis or was passed.
		if _, err := g.l.TTL(ctx); err != nil {
			t.Fatal(err)
		}
		if o := rdb.HGet(ctx, "dlock:{hand}", "o").Val(); o != g.l.Token() {
			t.Fatalf("owner at Redis %q, want the holder's token %q", o, g.l.Token())
		}
		if f := rdb.HGet(ctx, "dlock:{hand}", "f").Val(); f != strconv.FormatUint(g.l.Fence(), 10) {
			t.Fatalf("fence at Redis %s, want the holder's %d", f, g.l.Fence())
		}
		if err := g.l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if !slices.Equal(order, []int{1, 1, 2, 2, 1}) {
		t.Fatalf("Clients served in order %v, want 1 1 2 2 1 (turns round the line)", order)
	}
	if n := rdb.Exists(ctx, "dlock:{hand}:q", "dlock:{hand}:w").Val(); n != 0 {
		t.Fatalf("line keys left behind: %d", n)
	}
}

// TestDefaultWaiterLeavesLine: a default-mode head that gives up leaves the
// line at once, and a head that died in line is skipped within its liveness.
func TestDefaultWaiterLeavesLine(t *testing.T) { leaveAndSkipGhost(t) }
