package dlock_test

import (
	"context"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// The raw floor: what any Redis lock must at least send.
var rawRelease = redis.NewScript(`if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end`)

// BenchmarkUncontended: lock+unlock cycles of 64 goroutines on distinct
// keys, dlock beside the raw commands on the same client.
func BenchmarkUncontended(b *testing.B) {
	s := redistest.Start(b)
	rdb := s.Client(b, func(o *redis.Options) { o.PoolSize = 64 })
	ctx := context.Background()
	var seq atomic.Int64
	b.Run("impl=raw", func(b *testing.B) {
		b.ReportAllocs()
		b.SetParallelism(32)
		b.RunParallel(func(pb *testing.PB) {
			key := "raw-" + strconv.FormatInt(seq.Add(1), 10)
			for pb.Next() {
				tok := strconv.FormatInt(seq.Add(1), 36) + "-0123456789abcdef"
				ok, err := rdb.SetNX(ctx, key, tok, 10*time.Second).Result()
				if err != nil || !ok {
					b.Fatal("raw lock", ok, err)
				}
				if err := rawRelease.Run(ctx, rdb, []string{key}, tok).Err(); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
	b.Run("impl=dlock", func(b *testing.B) {
		c := dlock.New(rdb)
		defer c.Close()
		b.ReportAllocs()
		b.SetParallelism(32)
		b.RunParallel(func(pb *testing.PB) {
			m := c.Mutex("dl-" + strconv.FormatInt(seq.Add(1), 10))
			for pb.Next() {
				l, err := m.Lock(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if err := l.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}

// BenchmarkLockUnlockTypical is the serial cycle as code usually writes it:
// a Mutex made per call, and a cancelable ctx.
func BenchmarkLockUnlockTypical(b *testing.B) {
	s := redistest.Start(b)
	rdb := s.Client(b)
	c := dlock.New(rdb)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()
	b.ReportAllocs()
	for b.Loop() {
		l, err := c.Mutex("order:17").Lock(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkLockUnlockSerial measures one goroutine's cycle: latency and the
// allocations of one uncontended lock+unlock.
func BenchmarkLockUnlockSerial(b *testing.B) {
	s := redistest.Start(b)
	rdb := s.Client(b)
	c := dlock.New(rdb)
	defer c.Close()
	serialCycles(b, c.Mutex("serial"))
}

// BenchmarkHotKey: one lock, W waiters spread over 4 Clients, a 1ms
// critical section. Reports hand-offs per second and efficiency =
// hand-offs/s × (hold + RTT), where 1.0 means no time is lost between holders.
func BenchmarkHotKey(b *testing.B) {
	for _, mode := range []string{"default", "fair"} {
		for _, waiters := range []int{16, 64} {
			b.Run("mode="+mode+"/waiters="+strconv.Itoa(waiters), func(b *testing.B) { hotKey(b, mode == "fair", waiters) })
		}
	}
}

func hotKey(b *testing.B, fair bool, waiters int) {
	var opts []dlock.LockOption
	if fair {
		opts = append(opts, dlock.Fair())
	}
	{
		{
			s := redistest.Start(b)
			var clients []*dlock.Client
			for i := 0; i < 4; i++ {
				c := dlock.New(s.Client(b, func(o *redis.Options) { o.PoolSize = 32 }), dlock.WithAutoPipeline(os.Getenv("NOAP") == ""))
				defer c.Close()
				clients = append(clients, c)
			}
			rdb := s.Client(b)
			ctx := context.Background()
			start := time.Now()
			for i := 0; i < 200; i++ {
				rdb.Ping(ctx)
			}
			rtt := time.Since(start) / 200
			var n atomic.Int64
			var held atomic.Int64
			var lastUnlock atomic.Int64 // ns since start of the last Unlock call
			var gapMu sync.Mutex
			var gaps []time.Duration
			b.ResetTimer()
			start = time.Now()
			done := make(chan struct{})
			for w := 0; w < waiters; w++ {
				go func(c *dlock.Client) {
					for n.Load() < int64(b.N) {
						l, err := c.Mutex("hot", opts...).Lock(ctx)
						if err != nil {
							b.Error(err)
							break
						}
						t0 := time.Now()
						if lu := lastUnlock.Load(); lu > 0 {
							gapMu.Lock()
							gaps = append(gaps, t0.Sub(start)-time.Duration(lu))
							gapMu.Unlock()
						}
						time.Sleep(time.Millisecond)
						held.Add(int64(time.Since(t0)))
						n.Add(1)
						lastUnlock.Store(int64(time.Since(start)))
						_ = l.Unlock(ctx)
					}
					done <- struct{}{}
				}(clients[w%4])
			}
			for w := 0; w < waiters; w++ {
				<-done
			}
			el := time.Since(start)
			hold := time.Duration(held.Load() / n.Load())
			rate := float64(n.Load()) / el.Seconds()
			b.ReportMetric(rate, "handoffs/s")
			b.ReportMetric(rate*(hold+rtt).Seconds(), "efficiency")
			b.ReportMetric(float64(hold.Microseconds()), "hold-µs")
			b.ReportMetric(float64(rtt.Microseconds()), "rtt-µs")
			slices.Sort(gaps)
			if len(gaps) > 0 {
				b.ReportMetric(float64(gaps[len(gaps)/2].Microseconds()), "gap-p50-µs")
				b.ReportMetric(float64(gaps[len(gaps)*99/100].Microseconds()), "gap-p99-µs")
			}
		}
	}
}
