package dlock_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// BenchmarkElectionProclaim measures a leader's Proclaim: one script call
// (the publish that also ends a Campaign), beside a PING round trip.
//
//	go test -run '^$' -bench ElectionProclaim -benchtime 2000x -count 3 .
func BenchmarkElectionProclaim(b *testing.B) {
	s := redistest.Start(b)
	rtt := pingMedian(b, s)
	c, _ := newClient(b, s)
	ctx := context.Background()
	e := c.Election("bench-proclaim", dlock.TTL(time.Minute))
	if _, err := e.Campaign(ctx, "v"); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if err := e.Proclaim(ctx, "v"); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(rtt.Microseconds()), "ping-µs")
	_ = e.Resign(ctx)
}

// BenchmarkElectionResign measures a hand-over of leadership: from the
// leader's Resign call until the candidate waiting in line (another
// Client) has its Campaign return, elected with its value published; and,
// beside it, the same hand-over of a Fair mutex (Unlock until the waiter's
// Lock returns), which an election adds its publish to. It reports the
// median and 99th percentile of one hand-over, the median of the Resign
// (Unlock) call alone, and a PING round trip on the same server. docs/BENCHMARKS.md (Leader election) has the numbers:
//
//	go test -run '^$' -bench ElectionResign -benchtime 300x -count 3 .
func BenchmarkElectionResign(b *testing.B) {
	s := redistest.Start(b)
	rtt := pingMedian(b, s)
	for _, kind := range []string{"election", "fair-mutex"} {
		b.Run(kind, func(b *testing.B) {
			ctx := context.Background()
			name := "bench-" + kind
			var take [2]func(context.Context) (*dlock.Lease, error)
			var give [2]func(context.Context, *dlock.Lease) error
			for i := range 2 {
				c, _ := newClient(b, s)
				if kind == "election" {
					e := c.Election(name, dlock.TTL(time.Minute))
					take[i] = func(ctx context.Context) (*dlock.Lease, error) { return e.Campaign(ctx, "candidate") }
					give[i] = func(ctx context.Context, _ *dlock.Lease) error { return e.Resign(ctx) }
				} else {
					m := c.Mutex(name, dlock.TTL(time.Minute), dlock.Fair())
					take[i] = m.Lock
					give[i] = func(ctx context.Context, l *dlock.Lease) error { return l.Unlock(ctx) }
				}
			}
			rdb := s.Client(b)
			line := "dlock:{" + name + "}:q"
			held, err := take[0](ctx)
			if err != nil {
				b.Fatal(err)
			}
			type result struct {
				l   *dlock.Lease
				err error
			}
			took := make([]time.Duration, 0, b.N)
			gave := make([]time.Duration, 0, b.N) // the Resign (Unlock) call alone
			b.ResetTimer()
			b.StopTimer()
			for i := range b.N {
				next := make(chan result, 1)
				go func() { l, err := take[(i+1)%2](ctx); next <- result{l, err} }()
				for rdb.LLen(ctx, line).Val() != 1 { // in line, not yet timed
					time.Sleep(100 * time.Microsecond)
				}
				b.StartTimer()
				start := time.Now()
				if err := give[i%2](ctx, held); err != nil {
					b.Fatal(err)
				}
				gave = append(gave, time.Since(start))
				r := <-next
				took = append(took, time.Since(start))
				b.StopTimer()
				if r.err != nil {
					b.Fatal(r.err)
				}
				held = r.l
			}
			_ = give[b.N%2](ctx, held)
			slices.Sort(took)
			slices.Sort(gave)
			b.ReportMetric(float64(gave[len(gave)/2].Microseconds()), "resign-p50-µs")
			b.ReportMetric(float64(took[len(took)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(took[len(took)*99/100].Microseconds()), "p99-µs")
			b.ReportMetric(float64(rtt.Microseconds()), "ping-µs")
		})
	}
}

// pingMedian is the median of 200 PING round trips to s.
func pingMedian(b *testing.B, s *redistest.Server) time.Duration {
	rdb := s.Client(b)
	ctx := context.Background()
	var ds []time.Duration
	for range 200 {
		start := time.Now()
		if err := rdb.Ping(ctx).Err(); err != nil {
			b.Fatal(err)
		}
		ds = append(ds, time.Since(start))
	}
	slices.Sort(ds)
	return ds[len(ds)/2]
}
