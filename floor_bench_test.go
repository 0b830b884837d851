package dlock_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/redistest"
)

// BenchmarkHandoffFloor measures the least a notified hand-off can cost on
// this machine, with no lock at all: a script that SPUBLISHes, sent by one
// connection, until a goroutine that waits on a channel fed by another
// connection's subscription wakes up (dlock's Fair hand-over path without
// the lock). Like a holder in BenchmarkHotKey, the sender sleeps 1ms
// between sends, so every hop pays the wake-ups an idle process pays.
// Compare its floor-p50-µs with BenchmarkHotKey's gap-p50-µs and rtt-µs.
func BenchmarkHandoffFloor(b *testing.B) {
	s := redistest.Start(b)
	ctx := context.Background()
	pub, sub := s.Client(b), s.Client(b)
	ps := sub.SSubscribe(ctx, "{floor}")
	defer ps.Close()
	if _, err := ps.Receive(ctx); err != nil {
		b.Fatal(err)
	}
	got := make(chan time.Time, 1)
	go func() {
		for {
			if _, err := ps.Receive(ctx); err != nil {
				return
			}
			got <- time.Now()
		}
	}()
	woke := make(chan time.Time)
	go func() {
		for t := range got {
			_ = t
			woke <- time.Now()
		}
	}()
	var lat, rtt []time.Duration
	for b.Loop() {
		time.Sleep(time.Millisecond)
		t0 := time.Now()
		if err := pub.Eval(ctx, "redis.call('SPUBLISH', KEYS[1], 'g'); return 1", []string{"{floor}"}).Err(); err != nil {
			b.Fatal(err)
		}
		rtt = append(rtt, time.Since(t0))
		lat = append(lat, (<-woke).Sub(t0))
	}
	close(got)
	slices.Sort(lat)
	slices.Sort(rtt)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "floor-p50-µs")
	b.ReportMetric(float64(rtt[len(rtt)/2].Microseconds()), "eval-rtt-p50-µs")
}
