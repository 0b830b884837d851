package dlock_test

import (
	"context"
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

// lockedAt locks m in the background and sends the time it got the lock
// (then unlocks); the channel is closed without a value if Lock failed.
func lockedAt(t *testing.T, ctx context.Context, m *dlock.Mutex) <-chan time.Time {
	got := make(chan time.Time, 1)
	go func() {
		l, err := m.Lock(ctx)
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
// It fails the test on a lost update or on two holders inside at once.
func contend(t *testing.T, ctx context.Context, rdb *redis.Client, workers, each int, mutexFor func(g int) *dlock.Mutex) {
	t.Helper()
	counter := "counter:" + t.Name()
	var inside, maxInside atomic.Int32
	var wg sync.WaitGroup
	for g := 0; g < workers; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			for i := 0; i < each; i++ {
				err := mutexFor(g).Do(ctx, func(ctx context.Context) error {
					n := inside.Add(1)
					defer inside.Add(-1)
					for m := maxInside.Load(); n > m && !maxInside.CompareAndSwap(m, n); m = maxInside.Load() {
					}
					v, _ := rdb.Get(ctx, counter).Int()
					return rdb.Set(ctx, counter, v+1, 0).Err()
				})
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
}

// waitLine waits until the line of the lock key has n waiters.
func waitLine(t *testing.T, ctx context.Context, rdb *redis.Client, key string, n int64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for rdb.LLen(ctx, key+":q").Val() != n {
		if time.Now().After(deadline) {
			t.Fatalf("line of %s: %d waiters, want %d", key, rdb.LLen(ctx, key+":q").Val(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
