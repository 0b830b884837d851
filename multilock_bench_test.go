package dlock_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// BenchmarkMultiLock: lock+unlock cycles of three names as one MultiLock
// beside the same three names taken one by one as Mutexes (in sorted
// order, released in reverse: what a caller must do by hand to avoid
// deadlocks), on one server:
//
//   - serial: one goroutine, its own names (the latency of a cycle);
//   - parallel: 16 goroutines, each on names of its own (throughput);
//   - contended: 16 goroutines locking random sets of 3 of 8 shared names.
func BenchmarkMultiLock(b *testing.B) {
	s := redistest.Start(b)
	rdb := s.Client(b, func(o *redis.Options) { o.PoolSize = 64 })
	c := newDlock(b, rdb)
	b.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	var seq atomic.Int64
	own := func() []string {
		n := strconv.FormatInt(seq.Add(1), 10)
		return []string{"bm-" + n + "-a", "bm-" + n + "-b", "bm-" + n + "-c"}
	}
	shared := []string{"bs-0", "bs-1", "bs-2", "bs-3", "bs-4", "bs-5", "bs-6", "bs-7"}
	impls := []struct {
		name  string
		cycle func(names []string) error
	}{
		{"multilock", func(names []string) error {
			l, err := c.MultiLock(names).Lock(ctx)
			if err != nil {
				return err
			}
			return l.Unlock(ctx)
		}},
		{"one-by-one", func(names []string) error {
			names = slices.Sorted(slices.Values(names))
			ls := make([]*dlock.Lease, 0, len(names))
			for _, n := range names {
				l, err := c.Mutex(n).Lock(ctx)
				if err != nil {
					return err
				}
				ls = append(ls, l)
			}
			for i := len(ls) - 1; i >= 0; i-- {
				if err := ls[i].Unlock(ctx); err != nil {
					return err
				}
			}
			return nil
		}},
	}
	for _, impl := range impls {
		b.Run("load=serial/impl="+impl.name, func(b *testing.B) {
			names := own()
			b.ReportAllocs()
			for b.Loop() {
				if err := impl.cycle(names); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("load=parallel/impl="+impl.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(8) // 16 goroutines on 2 cores
			b.RunParallel(func(pb *testing.PB) {
				names := own()
				for pb.Next() {
					if err := impl.cycle(names); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
		b.Run("load=contended/impl="+impl.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				r := rand.New(rand.NewPCG(uint64(seq.Add(1)), 0))
				set := slices.Clone(shared)
				for pb.Next() {
					r.Shuffle(len(set), func(i, j int) { set[i], set[j] = set[j], set[i] })
					if err := impl.cycle(set[:3]); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}
