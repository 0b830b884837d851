package dlock_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// newClients makes n Clients on s (as n processes would have) and returns
// them with a plain go-redis client for checks.
func newClients(t *testing.T, s *redistest.Server, n int) ([]*dlock.Client, *redis.Client) {
	t.Helper()
	var cs []*dlock.Client
	var rdb *redis.Client
	for i := 0; i < n; i++ {
		c, r := newClient(t, s)
		cs = append(cs, c)
		rdb = r
	}
	return cs, rdb
}

// lockedAt locks in the background with lock (a Mutex's Lock, or any
// primitive's) and sends the time it got the lock (then unlocks); the
// channel is closed without a value if lock failed.
func lockedAt(t *testing.T, ctx context.Context, lock func(context.Context) (*dlock.Lease, error)) <-chan time.Time {
	got := make(chan time.Time, 1)
	go func() {
		l, err := lock(ctx)
		if err != nil {
			t.Error(err)
			close(got)
			return
		}
		got <- time.Now()
		_ = l.Unlock(ctx)
	}()
	return got
}

// contend runs workers goroutines that each take the lock mutexFor(g) gives
// them each times and increment a Redis counter read-modify-write inside it.
// It fails the test on a lost update, on two holders inside at once, or on
// a fence not above the one before it in grant order (the order of the
// counter values read inside).
func contend(t *testing.T, ctx context.Context, rdb redis.Cmdable, workers, each int, mutexFor func(g int) *dlock.Mutex) {
	t.Helper()
	counter := "counter:" + t.Name()
	var inside, maxInside atomic.Int32
	var mu sync.Mutex
	fences := make([]uint64, workers*each) // by the counter value read inside
	var wg sync.WaitGroup
	for g := 0; g < workers; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				l, err := mutexFor(g).Lock(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				n := inside.Add(1)
				for m := maxInside.Load(); n > m && !maxInside.CompareAndSwap(m, n); m = maxInside.Load() {
				}
				v, _ := rdb.Get(l.Context(), counter).Int()
				err = rdb.Set(l.Context(), counter, v+1, 0).Err()
				inside.Add(-1)
				if err == nil && v < len(fences) {
					mu.Lock()
					fences[v] = l.Fence()
					mu.Unlock()
				}
				if uerr := l.Unlock(ctx); err == nil {
					err = uerr
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	if v, _ := rdb.Get(ctx, counter).Int(); v != workers*each {
		t.Fatalf("counter = %d, want %d (lost updates)", v, workers*each)
	}
	if n := maxInside.Load(); n != 1 {
		t.Fatalf("%d holders inside at once", n)
	}
	for v := 1; v < len(fences); v++ {
		if fences[v] <= fences[v-1] {
			t.Fatalf("fences in grant order: %d then %d (grants %d and %d)", fences[v-1], fences[v], v-1, v)
		}
	}
}

// readOnly makes a go-redis client send READONLY on each connection, so
// that a cluster replica answers reads of the slots its master serves.
func readOnly(o *redis.Options) {
	o.OnConnect = func(ctx context.Context, cn *redis.Conn) error { return cn.ReadOnly(ctx).Err() }
}

// waitLine waits until the line of the lock key has n waiters.
func waitLine(t *testing.T, ctx context.Context, rdb redis.Cmdable, key string, n int64) {
	t.Helper()
	waitFor(t, ctx, fmt.Sprintf("%d in the line of %s", n, key), func() bool { return rdb.LLen(ctx, key+":q").Val() == n })
}

// waitFor polls cond until it holds, failing the test after 10s (or when
// ctx ends): tests wait for what they can observe, not for a while.
func waitFor(t testing.TB, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	waitWithin(t, ctx, 10*time.Second, what, cond)
}

// waitWithin is waitFor with a bound of d.
func waitWithin(t testing.TB, ctx context.Context, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			t.Fatalf("waited in vain for: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// runChildren starts one child process of role per argument (see
// startChild), drains their output and fails the test if any fails.
func runChildren(t *testing.T, role, addr string, args []string) {
	t.Helper()
	var waits []func() error
	for _, arg := range args {
		cmd, _, out := startChild(t, role, addr, arg)
		waits = append(waits, cmd.Wait)
		go func() {
			for out.Scan() {
			}
		}()
	}
	for _, wait := range waits {
		if err := wait(); err != nil {
			t.Fatalf("child %s: %v", role, err)
		}
	}
}

// inGoroutines runs each(g) for g in [0, n) concurrently (a child
// process's workers) and returns the first error.
func inGoroutines(n int, each func(g int) error) error {
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for g := 0; g < n; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := each(g); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// holdUntilEOF is how a holding child ends: it prints "held" once it has
// the lease, then waits (holding it, renewed) until stdin closes or it is
// killed.
func holdUntilEOF(_ *dlock.Lease, err error) error {
	if err != nil {
		return err
	}
	fmt.Println("held")
	_, _ = os.Stdin.Read(make([]byte, 1))
	return nil
}

// handOffs has 4 goroutines on clients lock 20 times each with lock, hold
// 2ms and unlock. It fails the test on two holders at once or a fence that
// does not exceed every earlier one (*last, updated), and returns how long
// the 80 hand-offs took.
func handOffs(t *testing.T, ctx context.Context, clients []*dlock.Client, last *uint64, lock func(*dlock.Client) (*dlock.Lease, error)) time.Duration {
	t.Helper()
	start := time.Now()
	var mu sync.Mutex
	var inside, most int
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				l, err := lock(clients[g%len(clients)])
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				inside++
				most = max(most, inside)
				if l.Fence() <= *last {
					t.Errorf("%s: fence %d after %d", l.Name(), l.Fence(), *last)
				}
				*last = l.Fence()
				mu.Unlock()
				time.Sleep(2 * time.Millisecond)
				mu.Lock()
				inside--
				mu.Unlock()
				if err := l.Unlock(ctx); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if most != 1 {
		t.Fatalf("%d holders at once", most)
	}
	return time.Since(start)
}

// async runs lock in the background and returns a func that waits for its
// result. When the test ends the call is cancelled and waited for, so a
// failing test leaves nothing behind.
func async(t testing.TB, ctx context.Context, lock func(context.Context) (*dlock.Lease, error)) func() (*dlock.Lease, error) {
	ctx, cancel := context.WithCancel(ctx)
	type result struct {
		l   *dlock.Lease
		err error
	}
	ch := make(chan result, 1)
	go func() {
		l, err := lock(ctx)
		ch <- result{l, err}
	}()
	var once sync.Once
	var r result
	get := func() (*dlock.Lease, error) {
		once.Do(func() { r = <-ch })
		return r.l, r.err
	}
	t.Cleanup(func() { cancel(); _, _ = get() })
	return get
}

// envRounds is the positive number in the environment variable name, or
// def when it is not set.
func envRounds(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive number", name, v)
	}
	return n
}

// envSeed is the seed DLOCK_SEED asks a seeded test to replay, if set.
func envSeed(t *testing.T) (seed uint64, replay bool) {
	t.Helper()
	v := os.Getenv("DLOCK_SEED")
	if v == "" {
		return 0, false
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		t.Fatalf("DLOCK_SEED=%q: want a number", v)
	}
	return n, true
}

// serialCycles is a benchmark loop of one goroutine's lock+unlock of m.
func serialCycles(b *testing.B, m *dlock.Mutex) {
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		l, err := m.Lock(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
