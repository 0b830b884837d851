package dlock

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/exemplar"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// BenchmarkObserveHooks measures what observing one uncontended lock and
// unlock costs on its own (no Redis): the hooks a Lock and an Unlock run,
// with no providers, with metrics (a ManualReader nobody collects), with
// spans (default sampler, no exporter) and with both.
func BenchmarkObserveHooks(b *testing.B) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer rdb.Close()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	tp := sdktrace.NewTracerProvider()
	// Exemplars link measurements to the sampled span in their ctx: the
	// SDK's default (trace-based) filter records one per traced call.
	noEx := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()), sdkmetric.WithExemplarFilter(exemplar.AlwaysOffFilter))
	for _, bc := range []struct {
		name string
		opts []Option
	}{
		{"off", nil},
		{"metrics", []Option{WithMeterProvider(mp)}},
		{"traces", []Option{WithTracerProvider(tp)}},
		{"both", []Option{WithMeterProvider(mp), WithTracerProvider(tp)}},
		{"both-no-exemplars", []Option{WithMeterProvider(noEx), WithTracerProvider(tp)}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c := New(rdb, bc.opts...)
			defer c.Close()
			m := c.Mutex("bench")
			b.ReportAllocs()
			for b.Loop() {
				observeCycle(c, &m.lk)
			}
		})
	}
	// The SDK's own floor for the same spans: two spans, with the
	// attributes an uncontended Lock's and Unlock's spans carry, and
	// nothing of dlock's.
	b.Run("sdk-spans", func(b *testing.B) {
		tr := tp.Tracer("floor")
		out := relSpan[modeDefault][errNone]
		b.ReportAllocs()
		for b.Loop() {
			_, s := tr.Start(context.Background(), "dlock.Mutex.Lock")
			s.SetAttributes(acqSpan[modeDefault][errNone][0], keyFence.Int64(1<<50), viaAttrs[viaLook])
			s.End()
			_, s = tr.Start(context.Background(), "dlock.Lease.Unlock")
			s.SetAttributes(out...)
			s.End()
		}
	})
}

// observeCycle runs the hooks of one uncontended Lock and Unlock, in the
// order the engine runs them, on a holding of their own.
func observeCycle(c *Client, lk *lock) {
	h := &holding{c: c, lk: lk, token: "t", st: held}
	h.first.h = h
	observeHooks(c, lk, h)
}

// observeHooks is observeCycle on h, held.
func observeHooks(c *Client, lk *lock, h *holding) {
	ctx := context.Background()
	var l *Lease
	var err error
	p := c.obs.acquire(&ctx, lk, callLock)
	c.obs.held(h)
	l = &h.first
	p.end(&l, &err)
	r := c.obs.release(context.Background(), l)
	c.obs.record(c.obs.ended(h, held, ending, context.Canceled))
	r.end(&err)
}
