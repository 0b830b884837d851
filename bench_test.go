package dlock_test

import (
	"context"
	"strconv"
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

// BenchmarkLockUnlockSerial measures one goroutine's cycle: latency and the
// allocations of one uncontended lock+unlock.
func BenchmarkLockUnlockSerial(b *testing.B) {
	s := redistest.Start(b)
	rdb := s.Client(b)
	c := dlock.New(rdb)
	defer c.Close()
	ctx := context.Background()
	m := c.Mutex("serial")
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
