package rueidisdlock_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/rueidisdlock"
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

func cycle(b *testing.B, ctx context.Context, m *dlock.Mutex) {
	l, err := m.Lock(ctx)
	if err != nil {
		b.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		b.Fatal(err)
	}
}
