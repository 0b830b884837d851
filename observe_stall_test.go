package dlock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
)

// gate holds back the measurements it is armed for (by instrument name,
// value and attributes) until it is opened: an instrument that blocks, as
// one whose exporter or lock is slow would.
type gate struct {
	mu      sync.Mutex
	match   func(inst string, v float64, set attribute.Set) bool // nil: let all through
	open    chan struct{}
	blocked atomic.Int32 // measurements held back so far
}

func newGate() *gate { return &gate{open: make(chan struct{})} }

func (g *gate) arm(match func(inst string, v float64, set attribute.Set) bool) {
	g.mu.Lock()
	g.match = match
	g.mu.Unlock()
}

// release lets every held-back measurement through, and all later ones.
func (g *gate) release() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.match = nil
	select {
	case <-g.open:
	default:
		close(g.open)
	}
}

func (g *gate) pass(inst string, v float64, set attribute.Set) {
	g.mu.Lock()
	m, open := g.match, g.open
	g.mu.Unlock()
	if m != nil && m(inst, v, set) {
		g.blocked.Add(1)
		<-open
	}
}

// A MeterProvider whose counters, up-down counters and histograms pass
// each measurement through a gate before the SDK's.
type gatedProvider struct {
	metric.MeterProvider
	g *gate
}

func (p gatedProvider) Meter(name string, opts ...metric.MeterOption) metric.Meter {
	return gatedMeter{p.MeterProvider.Meter(name, opts...), p.g}
}

type gatedMeter struct {
	metric.Meter
	g *gate
}

func (m gatedMeter) Int64Counter(name string, opts ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	i, err := m.Meter.Int64Counter(name, opts...)
	return gatedCounter{i, m.g, name}, err
}

func (m gatedMeter) Int64UpDownCounter(name string, opts ...metric.Int64UpDownCounterOption) (metric.Int64UpDownCounter, error) {
	i, err := m.Meter.Int64UpDownCounter(name, opts...)
	return gatedUpDown{i, m.g, name}, err
}

func (m gatedMeter) Float64Histogram(name string, opts ...metric.Float64HistogramOption) (metric.Float64Histogram, error) {
	i, err := m.Meter.Float64Histogram(name, opts...)
	return gatedHistogram{i, m.g, name}, err
}

type gatedCounter struct {
	metric.Int64Counter
	g    *gate
	name string
}

func (c gatedCounter) Add(ctx context.Context, v int64, opts ...metric.AddOption) {
	c.g.pass(c.name, float64(v), metric.NewAddConfig(opts).Attributes())
	c.Int64Counter.Add(ctx, v, opts...)
}

type gatedUpDown struct {
	metric.Int64UpDownCounter
	g    *gate
	name string
}

func (c gatedUpDown) Add(ctx context.Context, v int64, opts ...metric.AddOption) {
	c.g.pass(c.name, float64(v), metric.NewAddConfig(opts).Attributes())
	c.Int64UpDownCounter.Add(ctx, v, opts...)
}

type gatedHistogram struct {
	metric.Float64Histogram
	g    *gate
	name string
}

func (h gatedHistogram) Record(ctx context.Context, v float64, opts ...metric.RecordOption) {
	h.g.pass(h.name, v, metric.NewRecordConfig(opts).Attributes())
	h.Float64Histogram.Record(ctx, v, opts...)
}

// named reports whether set names lock name.
func named(set attribute.Set, name string) bool {
	v, ok := set.Value("dlock.lock.name")
	return ok && v.AsString() == name
}

// TestObserveSlowInstrumentDoesNotStallOtherLocks: with WithNameAttribute,
// a measurement of one lock that blocks in the user's instrument holds up
// only the call (or background step) that makes it, never the engine's
// locks: another lock of the same Client is locked, unlocked and renewed
// meanwhile. The instrument is armed only once the setup is done, and lets
// everything through at the end.
func TestObserveSlowInstrumentDoesNotStallOtherLocks(t *testing.T) {
	const slow = "obs/slow"
	setup := func(t *testing.T) (*dlock.Client, *observed, *gate, *redistest.Server) {
		s := redistest.Start(t)
		g := newGate()
		reader := sdkmetric.NewManualReader()
		mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
		t.Cleanup(func() { _ = mp.Shutdown(context.Background()) })
		c, _ := newClient(t, s, dlock.WithMeterProvider(gatedProvider{mp, g}), dlock.WithNameAttribute())
		t.Cleanup(g.release) // before the Client closes (cleanups run last first): nothing stays held back
		return c, &observed{t: t, reader: reader}, g, s
	}
	// lockOther locks and unlocks another name of c within a bound (on a
	// goroutine: a call stuck on an engine mutex does not see its ctx).
	lockOther := func(t *testing.T, ctx context.Context, c *dlock.Client, g *gate) {
		t.Helper()
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		done := make(chan error, 1)
		go func() {
			l, err := c.Mutex("obs/other-lock").Lock(octx)
			if err == nil {
				err = l.Unlock(octx)
			}
			done <- err
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("Lock and Unlock of another name while one lock's instrument blocks: %v", err)
			}
		case <-time.After(5 * time.Second):
			g.release() // let it go, so that the test ends
			<-done
			t.Fatal("Lock and Unlock of another name stalled (5s) behind one lock's blocking instrument")
		}
	}

	// A pass to the Client's next waiter counts one more lease held: the
	// passer must not make that measurement under the Client's lock.
	t.Run("pass", func(t *testing.T) {
		c, _, g, s := setup(t)
		other, rdb := newClient(t, s)
		ctx := ctxT(t, 30*time.Second)
		a, leases := inTurn(t, ctx, []*dlock.Client{other, c}, rdb, slow)
		g.arm(func(inst string, v float64, set attribute.Set) bool {
			return inst == "dlock.leases.held" && v > 0 && named(set, slow)
		})
		unlocked := make(chan error, 1)
		go func() { unlocked <- a.Unlock(ctx) }()
		waitFor(t, ctx, "the pass's measurement held back", func() bool { return g.blocked.Load() > 0 })
		lockOther(t, ctx, c, g)
		g.release()
		if err := <-unlocked; err != nil {
			t.Fatal(err)
		}
		b := <-leases
		if b == nil {
			t.FailNow()
		}
		if err := b.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})

	// The end of a hold is measured as its lease ends: not under the
	// holding's lock, which the watchdog takes for every lease due.
	t.Run("hold-end", func(t *testing.T) {
		c, o, g, _ := setup(t)
		ctx := ctxT(t, 30*time.Second)
		a, err := c.Mutex(slow, dlock.TTL(300*time.Millisecond)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		const renewed = "obs/other-renewed"
		kept, err := c.Mutex(renewed, dlock.TTL(300*time.Millisecond)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		g.arm(func(inst string, _ float64, set attribute.Set) bool {
			return inst == "dlock.hold.duration" && named(set, slow)
		})
		unlocked := make(chan error, 1)
		go func() { unlocked <- a.Unlock(ctx) }()
		waitFor(t, ctx, "the hold's measurement held back", func() bool { return g.blocked.Load() > 0 })
		// The watchdog goes on renewing the other lease (every 100ms):
		// five more renewals, and the lease still held.
		name := attribute.String("dlock.lock.name", renewed)
		n := o.value("dlock.renewals", name)
		waitWithin(t, ctx, 5*time.Second, "five more renewals of another lease", func() bool {
			return o.value("dlock.renewals", name, aRenewed) >= n+5
		})
		if err := kept.Context().Err(); err != nil {
			t.Fatalf("another lease ended while one lock's instrument blocked: %v", context.Cause(kept.Context()))
		}
		lockOther(t, ctx, c, g)
		g.release()
		// The blocked Unlock itself was held up past its lease's TTL:
		// its release may find the lock expired, which it reports.
		if err := <-unlocked; err != nil && !errors.Is(err, dlock.ErrLockLost) {
			t.Fatal(err)
		}
		if err := kept.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
