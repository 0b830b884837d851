package rueidisdlock_test

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/rueidisdlock"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// BenchmarkDrivers runs one cycle of Lock and Unlock over each driver on
// one server: serial (one goroutine, a cancelable ctx, as code usually
// writes it) and parallel (64 goroutines on distinct keys). Compare the
// drivers within one run (ratios), not across machines.
func BenchmarkDrivers(b *testing.B) {
	s := redistest.Start(b)
	for _, drv := range []string{"go-redis", "rueidis"} {
		var c *dlock.Client
		if drv == "go-redis" {
			c = dlock.New(s.Client(b))
		} else {
			rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.Addr()}, DisableCache: true})
			if err != nil {
				b.Fatal(err)
			}
			if c, err = rueidisdlock.New(rc); err != nil {
				b.Fatal(err)
			}
			defer rc.Close()
		}
		defer c.Close()
		b.Run("driver="+drv+"/serial", func(b *testing.B) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
			defer cancel()
			b.ReportAllocs()
			for b.Loop() {
				cycle(b, ctx, c.Mutex("serial"))
			}
		})
		var seq atomic.Int64
		b.Run("driver="+drv+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(32)
			b.RunParallel(func(pb *testing.PB) {
				ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
				defer cancel()
				m := c.Mutex(drv + "-" + strconv.FormatInt(seq.Add(1), 10))
				for pb.Next() {
					cycle(b, ctx, m)
				}
			})
		})
	}
}

// BenchmarkDriverAllocs counts the allocations of an uncontended cycle over
// each driver in one run, the way bench/ -scenario uncontended calls it: a
// Mutex made per cycle, a ctx that cannot end, on one goroutine and on 64
// (each on its own key; there the calls are batched, by go-redis's
// autopipeliner and rueidisdlock's batcher). allocs/cycle is the Mallocs
// delta over the loop / cycles, with a decimal, which allocs/op rounds off.
//
//	go test -run XXX -bench DriverAllocs -benchmem -count=5 -benchtime=2000x ./rueidisdlock/
func BenchmarkDriverAllocs(b *testing.B) {
	s := redistest.Start(b)
	ctx := context.Background()
	for _, drv := range []string{"go-redis", "rueidis"} {
		var c *dlock.Client
		if drv == "go-redis" {
			c = dlock.New(s.Client(b, func(o *redis.Options) { o.PoolSize = 64 }))
		} else {
			rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.Addr()}})
			if err != nil {
				b.Fatal(err)
			}
			if c, err = rueidisdlock.New(rc); err != nil {
				b.Fatal(err)
			}
			defer rc.Close()
		}
		defer c.Close()
		var seq atomic.Int64
		for _, g := range []int{1, 64} {
			b.Run("driver="+drv+"/g="+strconv.Itoa(g), func(b *testing.B) {
				b.ReportAllocs()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				if g == 1 {
					key := drv + "-alloc-serial"
					for b.Loop() {
						cycle(b, ctx, c.Mutex(key, dlock.TTL(10*time.Second)))
					}
				} else {
					b.SetParallelism(g / runtime.GOMAXPROCS(0))
					b.RunParallel(func(pb *testing.PB) {
						key := drv + "-alloc-" + strconv.FormatInt(seq.Add(1), 10)
						for pb.Next() {
							cycle(b, ctx, c.Mutex(key, dlock.TTL(10*time.Second)))
						}
					})
				}
				runtime.ReadMemStats(&after)
				b.ReportMetric(float64(after.Mallocs-before.Mallocs)/float64(b.N), "allocs/cycle")
			})
		}
	}
}

func cycle(b *testing.B, ctx context.Context, m *dlock.Mutex) {
	l, err := m.Lock(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		b.Fatal(err)
	}
}
