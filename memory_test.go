package dlock_test

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func usedMemory(t *testing.T, ctx context.Context, rdb *redis.Client) int64 {
	t.Helper()
	info := rdb.Info(ctx, "memory").Val()
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	t.Fatal("no used_memory in INFO")
	return 0
}

// forEach runs f(i) for i in [0,n) on 32 goroutines.
func forEach(n int, f func(i int)) {
	var wg sync.WaitGroup
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := w; i < n; i += 32 {
				f(i)
			}
		}(w)
	}
	wg.Wait()
}

// TestMemoryPerLock measures what a held lock and an idle name cost Redis
// (INFO used_memory, 10,000 names like "order:1000017").
func TestMemoryPerLock(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s, dlock.WithIdleExpiry(time.Hour))
	ctx := ctxT(t, 60*time.Second)
	const n = 10000
	// Warm up first, as concurrently as the measurement: scripts loaded and
	// every pooled connection open (each costs Redis buffers), so the
	// baseline holds everything but the locks themselves.
	forEach(64, func(i int) {
		if l, err := c.Mutex("warm-up:" + strconv.Itoa(i)).Lock(ctx); err == nil {
			_ = l.Unlock(ctx)
		}
	})
	rdb.FlushAll(ctx)
	base := usedMemory(t, ctx, rdb)
	leases := make([]*dlock.Lease, n)
	forEach(n, func(i int) {
		l, err := c.Mutex("order:"+strconv.Itoa(1_000_000+i), dlock.TTL(time.Minute)).Lock(ctx)
		if err != nil {
			t.Error(err)
			return
		}
		leases[i] = l
	})
	if t.Failed() {
		return
	}
	held := float64(usedMemory(t, ctx, rdb)-base) / n
	forEach(n, func(i int) {
		if err := leases[i].Unlock(ctx); err != nil {
			t.Error(err)
		}
	})
	idle := float64(usedMemory(t, ctx, rdb)-base) / n
	if k := rdb.DBSize(ctx).Val(); k != n {
		t.Fatalf("%d keys for %d idle names", k, n)
	}
	t.Logf("Redis memory: %.0f bytes per held lock, %.0f bytes per idle name", held, idle)
	if held > 200 {
		t.Errorf("%.0f bytes per held lock, target ≤ 200", held)
	}
	if idle > held {
		t.Errorf("idle name (%.0f B) costs more than a held lock (%.0f B)", idle, held)
	}
}

// TestIdleNamesReclaimed: an idle name's key goes after the idle period, so
// locking millions of unique names leaves nothing behind.
func TestIdleNamesReclaimed(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s, dlock.WithIdleExpiry(time.Second))
	ctx := ctxT(t, 30*time.Second)
	forEach(200, func(i int) {
		if err := c.Mutex("unique:"+strconv.Itoa(i)).Do(ctx, func(context.Context) error { return nil }); err != nil {
			t.Error(err)
		}
	})
	if k := rdb.DBSize(ctx).Val(); k != 200 {
		t.Fatalf("%d keys right after 200 unlocks, want 200 (the fences)", k)
	}
	deadline := time.Now().Add(10 * time.Second)
	for rdb.DBSize(ctx).Val() > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d keys left 10s after a 1s idle period", rdb.DBSize(ctx).Val())
		}
		time.Sleep(200 * time.Millisecond) // poll; the idle expiry is what is tested
	}
}

// TestFenceIncreasesAcrossReclaim: after the idle key is gone, the next fence
// is still above every earlier one (reseeded from the server clock).
func TestFenceIncreasesAcrossReclaim(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 30*time.Second)
	m := c.Mutex("reclaimed")
	var last uint64
	for i := 0; i < 50; i++ { // many grants in quick succession
		last = lockAbove(t, ctx, m, last, "between grants")
	}
	rdb.Del(ctx, "dlock:{reclaimed}") // as if the idle period had passed
	lockAbove(t, ctx, m, last, "after the key was reclaimed")
}
