package dlock

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// TestObserveHooksAllocateNothing: the hooks of a Lock and an Unlock (as
// observeCycle runs them, on a holding made beforehand) allocate nothing
// in a Client made without providers, and nothing either with a meter
// provider and no WithNameAttribute (attribute sets are built once per
// Client). What WithMeterProvider and the package doc promise.
func TestObserveHooksAllocateNothing(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled
	defer rdb.Close()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	for _, tc := range []struct {
		name string
		opts []Option
	}{
		{"no providers", nil},
		{"metrics", []Option{WithMeterProvider(mp)}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := New(rdb, tc.opts...)
			defer c.Close()
			m := c.Mutex("allocs")
			h := &holding{c: c, lk: &m.lk, token: "t"}
			h.first.h = h
			if n := testing.AllocsPerRun(100, func() {
				h.st, h.obsAt = held, time.Time{}
				observeHooks(c, &m.lk, h)
			}); n != 0 {
				t.Errorf("the observe hooks of a Lock and an Unlock allocate %v times, want 0", n)
			}
		})
	}
}
