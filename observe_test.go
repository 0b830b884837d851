package dlock_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faults"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

// observed is one set of in-memory OpenTelemetry providers: what the
// Clients made with its options record is read back exactly.
type observed struct {
	t      *testing.T
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider
	opts   []dlock.Option
}

func newObserved(t *testing.T, extra ...dlock.Option) *observed {
	o := &observed{t: t, reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(o.reader))
	o.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(o.spans))
	t.Cleanup(func() { _ = mp.Shutdown(context.Background()); _ = o.tp.Shutdown(context.Background()) })
	o.opts = append([]dlock.Option{dlock.WithMeterProvider(mp), dlock.WithTracerProvider(o.tp)}, extra...)
	return o
}

// value is the metric's value summed over the data points whose attributes
// include every one of kv: a sum's value, a histogram's count. A metric
// never recorded is 0.
func (o *observed) value(name string, kv ...attribute.KeyValue) int64 {
	o.t.Helper()
	var n int64
	o.points(name, func(attrs attribute.Set, v int64) {
		if hasAll(attrs, kv) {
			n += v
		}
	})
	return n
}

// points calls f with each data point of the metric: its attributes and
// its value (a histogram's count).
func (o *observed) points(name string, f func(attribute.Set, int64)) {
	o.t.Helper()
	var rm metricdata.ResourceMetrics
	if err := o.reader.Collect(context.Background(), &rm); err != nil {
		o.t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != name {
				continue
			}
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					f(p.Attributes, p.Value)
				}
			case metricdata.Histogram[float64]:
				for _, p := range d.DataPoints {
					f(p.Attributes, int64(p.Count))
				}
			default:
				o.t.Fatalf("metric %s has data of type %T", name, m.Data)
			}
		}
	}
}

func hasAll(set attribute.Set, kv []attribute.KeyValue) bool {
	for _, want := range kv {
		if got, ok := set.Value(want.Key); !ok || got != want.Value {
			return false
		}
	}
	return true
}

// want checks the metric's value.
func (o *observed) want(name string, want int64, kv ...attribute.KeyValue) {
	o.t.Helper()
	if got := o.value(name, kv...); got != want {
		o.t.Errorf("%s%v = %d, want %d", name, kv, got, want)
	}
}

// waitValue waits until the metric has the value (a gauge that follows
// goroutines of the test).
func (o *observed) waitValue(ctx context.Context, name string, want int64, kv ...attribute.KeyValue) {
	o.t.Helper()
	waitFor(o.t, ctx, name+" = "+itoa(want), func() bool { return o.value(name, kv...) == want })
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// ended returns the ended spans called name.
func (o *observed) ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range o.spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func spanAttr(s sdktrace.ReadOnlySpan, k attribute.Key) attribute.Value {
	for _, kv := range s.Attributes() {
		if kv.Key == k {
			return kv.Value
		}
	}
	return attribute.Value{}
}

func hasAttr(s sdktrace.ReadOnlySpan, k attribute.Key) bool {
	for _, kv := range s.Attributes() {
		if kv.Key == k {
			return true
		}
	}
	return false
}

// childrenOf returns the ended spans whose parent is s.
func (o *observed) childrenOf(s sdktrace.ReadOnlySpan) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, c := range o.spans.Ended() {
		if c.Parent().SpanID() == s.SpanContext().SpanID() {
			out = append(out, c)
		}
	}
	return out
}

var (
	aMutex     = attribute.String("dlock.primitive", "mutex")
	aDefault   = attribute.String("dlock.mode", "default")
	aFair      = attribute.String("dlock.mode", "fair")
	aLock      = attribute.String("dlock.operation", "lock")
	aTry       = attribute.String("dlock.operation", "try")
	aAcquired  = attribute.String("dlock.outcome", "acquired")
	aNotObt    = attribute.String("dlock.outcome", "not_obtained")
	aCanceled  = attribute.String("dlock.outcome", "canceled")
	aError     = attribute.String("dlock.outcome", "error")
	aReleased  = attribute.String("dlock.outcome", "released")
	aLostOut   = attribute.String("dlock.outcome", "lost")
	aUnlocked  = attribute.String("dlock.outcome", "unlocked")
	aClosedOut = attribute.String("dlock.outcome", "closed")
	aRenewed   = attribute.String("dlock.outcome", "renewed")
)

// TestObserveUncontended: one Lock and Unlock of a free mutex records one
// acquisition (outcome acquired), a lease held while it is held and not
// after, one hold and one release; no contention, no wait. Its spans are
// dlock.Mutex.Lock and dlock.Lease.Unlock under the caller's span, with status unset,
// and the lease context carries the caller's span, not dlock's.
func TestObserveUncontended(t *testing.T) {
	s := redistest.Start(t)
	o := newObserved(t)
	c, _ := newClient(t, s, o.opts...)
	ctx := ctxT(t, 10*time.Second)
	pctx, parent := o.tp.Tracer("test").Start(ctx, "caller")
	l, err := c.Mutex("obs/free").Lock(pctx)
	if err != nil {
		t.Fatal(err)
	}
	o.want("dlock.acquire.duration", 1)
	o.want("dlock.acquire.duration", 1, aMutex, aDefault, aLock, aAcquired)
	o.want("dlock.leases.held", 1, aMutex, aDefault)
	if got := trace.SpanFromContext(l.Context()).SpanContext().SpanID(); got != parent.SpanContext().SpanID() {
		t.Errorf("the lease context carries span %v, want the caller's %v", got, parent.SpanContext().SpanID())
	}
	if err := l.Unlock(pctx); err != nil {
		t.Fatal(err)
	}
	parent.End()
	o.want("dlock.leases.held", 0)
	o.want("dlock.hold.duration", 1, aMutex, aDefault, aUnlocked)
	o.want("dlock.release.duration", 1, aMutex, aDefault, aReleased)
	o.want("dlock.contentions", 0)
	o.want("dlock.waiters", 0)
	o.want("dlock.handovers", 0)
	o.want("dlock.passes", 0)
	o.want("dlock.leases.lost", 0)
	o.points("dlock.acquire.duration", func(attrs attribute.Set, _ int64) {
		if _, ok := attrs.Value("dlock.lock.name"); ok {
			t.Errorf("a data point carries the lock name without WithNameAttribute: %v", attrs)
		}
	})

	locks, unlocks := o.ended("dlock.Mutex.Lock"), o.ended("dlock.Lease.Unlock")
	if len(locks) != 1 || len(unlocks) != 1 {
		t.Fatalf("%d dlock.Mutex.Lock and %d dlock.Lease.Unlock spans, want 1 each", len(locks), len(unlocks))
	}
	for _, sp := range []sdktrace.ReadOnlySpan{locks[0], unlocks[0]} {
		if sp.Parent().SpanID() != parent.SpanContext().SpanID() {
			t.Errorf("span %s: parent %v, want the caller's %v", sp.Name(), sp.Parent().SpanID(), parent.SpanContext().SpanID())
		}
		if sp.Status().Code != codes.Unset {
			t.Errorf("span %s: status %v, want unset", sp.Name(), sp.Status())
		}
		if hasAttr(sp, "dlock.mode") {
			t.Errorf("span %s: attributes %v, want no dlock.mode in the default mode", sp.Name(), sp.Attributes())
		}
	}
	if f := spanAttr(locks[0], "dlock.fence").AsInt64(); f != int64(l.Fence()) {
		t.Errorf("dlock.Lock: dlock.fence %d, want %d", f, l.Fence())
	}
	if v := spanAttr(unlocks[0], "dlock.outcome").AsString(); v != "released" {
		t.Errorf("dlock.Unlock outcome %q, want released", v)
	}
	if v := spanAttr(locks[0], "dlock.outcome").AsString(); v != "acquired" {
		t.Errorf("dlock.Lock outcome %q, want acquired", v)
	}
	if v := spanAttr(locks[0], "dlock.via").AsString(); v != "look" {
		t.Errorf("dlock.Lock via %q, want look", v)
	}
	if n := len(o.ended("dlock.wait")); n != 0 {
		t.Errorf("%d dlock.wait spans for a lock that was free", n)
	}
}

// TestObserveContended: a Lock that finds the mutex held records exactly
// one contention, counts as a waiter while it waits and not after, and its
// dlock.Lock span has one dlock.wait child. A TryLock on the held lock
// records outcome not_obtained, and a contention too; a Lock whose ctx ends
// while it waits records outcome canceled, error.type, and an error status.
func TestObserveContended(t *testing.T) {
	s := redistest.Start(t)
	o := newObserved(t)
	c, _ := newClient(t, s, o.opts...)
	other, _ := newClient(t, s) // the holder, not observed
	ctx := ctxT(t, 20*time.Second)
	holder, err := other.Mutex("obs/held").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}

	if _, err := c.Mutex("obs/held").TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock on a held lock: %v", err)
	}
	o.want("dlock.acquire.duration", 1, aTry, aNotObt)
	o.want("dlock.contentions", 1)
	tries := o.ended("dlock.Mutex.TryLock")
	if len(tries) != 1 || spanAttr(tries[0], "dlock.outcome").AsString() != "not_obtained" || tries[0].Status().Code != codes.Unset {
		t.Fatalf("TryLock spans %v: want one, outcome not_obtained, status unset", tries)
	}

	got := lockThenUnlock(ctx, c.Mutex("obs/held"))
	o.waitValue(ctx, "dlock.waiters", 1, aMutex, aDefault)
	o.want("dlock.contentions", 2)
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	o.want("dlock.contentions", 2) // the wait counts once, however it ended
	o.want("dlock.waiters", 0)
	o.want("dlock.acquire.duration", 1, aLock, aAcquired)
	o.want("dlock.leases.held", 0)
	locks := o.ended("dlock.Mutex.Lock")
	if len(locks) != 1 {
		t.Fatalf("%d dlock.Lock spans, want 1", len(locks))
	}
	kids := o.childrenOf(locks[0])
	if len(kids) != 1 || kids[0].Name() != "dlock.wait" {
		t.Fatalf("children of dlock.Lock: %v, want one dlock.wait", kids)
	}
	if w := kids[0]; w.StartTime().Before(locks[0].StartTime()) || w.EndTime().After(locks[0].EndTime()) {
		t.Errorf("dlock.wait [%v, %v] not inside dlock.Lock [%v, %v]", w.StartTime(), w.EndTime(), locks[0].StartTime(), locks[0].EndTime())
	}

	// A wait that its ctx ends.
	holder, err = other.Mutex("obs/held").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	if _, err := c.Mutex("obs/held").Lock(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Lock past its deadline: %v", err)
	}
	o.want("dlock.acquire.duration", 1, aLock, aCanceled, attribute.String("error.type", "context.DeadlineExceeded"))
	o.want("dlock.contentions", 3)
	o.want("dlock.waiters", 0)
	var canceled []sdktrace.ReadOnlySpan
	for _, sp := range o.ended("dlock.Mutex.Lock") {
		if spanAttr(sp, "dlock.outcome").AsString() == "canceled" {
			canceled = append(canceled, sp)
		}
	}
	if len(canceled) != 1 || canceled[0].Status().Code != codes.Error {
		t.Fatalf("canceled dlock.Lock spans %v: want one with status Error", canceled)
	}
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestObserveHandOverAndPass: in default mode, a waiter of the observed
// Client is handed the lock by another Client's release at Redis (one
// hand-over), and passes it to the Client's next waiter (one pass); their
// spans say how each obtained it.
func TestObserveHandOverAndPass(t *testing.T) {
	s := redistest.Start(t)
	o := newObserved(t)
	holder, rdb := newClient(t, s)
	c, _ := newClient(t, s, o.opts...)
	ctx := ctxT(t, 20*time.Second)
	a, leases := inTurn(t, ctx, []*dlock.Client{holder, c}, rdb, "obs/turn")
	o.want("dlock.handovers", 1, aMutex, aDefault)
	o.want("dlock.passes", 0)
	if err := a.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	b := <-leases
	if b == nil {
		t.FailNow()
	}
	o.want("dlock.passes", 1, aMutex, aDefault)
	o.want("dlock.handovers", 1)
	o.want("dlock.contentions", 2)
	o.want("dlock.leases.held", 1)
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	o.want("dlock.leases.held", 0)
	o.want("dlock.hold.duration", 2, aUnlocked)
	vias := map[string]int{}
	for _, sp := range o.ended("dlock.Mutex.Lock") {
		vias[spanAttr(sp, "dlock.via").AsString()]++
		if kids := o.childrenOf(sp); len(kids) != 1 || kids[0].Name() != "dlock.wait" {
			t.Errorf("a waiter's dlock.Lock has children %v, want one dlock.wait", kids)
		}
	}
	if vias["handover"] != 1 || vias["pass"] != 1 || len(vias) != 2 {
		t.Errorf("dlock.via of the waiters' spans: %v, want one handover and one pass", vias)
	}
}

// TestObserveFairHandOvers: Fair waiters of two observed Clients are handed
// the lock by each release in turn: hand-overs, never passes.
func TestObserveFairHandOvers(t *testing.T) {
	s := redistest.Start(t)
	o := newObserved(t)
	a, rdb := newClient(t, s, o.opts...)
	b, _ := newClient(t, s, o.opts...)
	ctx := ctxT(t, 20*time.Second)
	first, err := a.Mutex("obs/fair", dlock.Fair()).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *dlock.Lease, 2)
	for i, c := range []*dlock.Client{b, a} {
		go func() {
			l, err := c.Mutex("obs/fair", dlock.Fair()).Lock(ctx)
			if err != nil {
				t.Error(err)
			}
			got <- l
		}()
		waitLine(t, ctx, rdb, "dlock:{obs/fair}", int64(i+1))
	}
	o.want("dlock.waiters", 2, aMutex, aFair)
	prev := first
	for range 2 {
		if err := prev.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if prev = <-got; prev == nil {
			t.FailNow()
		}
	}
	if err := prev.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	o.want("dlock.handovers", 2, aMutex, aFair)
	o.want("dlock.passes", 0)
	o.want("dlock.contentions", 2)
	o.want("dlock.waiters", 0)
	o.want("dlock.leases.held", 0)
	o.want("dlock.acquire.duration", 3, aFair, aAcquired)
	spans := o.ended("dlock.Mutex.Lock")
	if len(spans) != 3 {
		t.Fatalf("%d dlock.Mutex.Lock spans, want 3", len(spans))
	}
	for _, sp := range spans {
		if spanAttr(sp, "dlock.mode").AsString() != "fair" {
			t.Errorf("a Fair Lock's span: attributes %v, want dlock.mode fair", sp.Attributes())
		}
	}
}

// TestObserveLeaseLost: a lease whose key is deleted behind its back is
// lost once its renewal finds it gone: one renewal with outcome lost, one
// lease lost, a hold that ended lost, no lease held. Its Unlock then
// records outcome lost, and the loss is not counted again.
func TestObserveLeaseLost(t *testing.T) {
	s := redistest.Start(t)
	o := newObserved(t)
	c, rdb := newClient(t, s, o.opts...)
	ctx := ctxT(t, 20*time.Second)
	l, err := c.Mutex("obs/lost", dlock.TTL(300*time.Millisecond)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	o.want("dlock.leases.lost", 0)
	if err := rdb.Del(ctx, "dlock:{obs/lost}").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Context().Done():
	case <-ctx.Done():
		t.Fatal("the lease of a deleted key did not end")
	}
	// The metrics of its end follow the lease context's end: the renewal
	// that found it gone records them next, under no lock of the engine.
	o.waitValue(ctx, "dlock.leases.lost", 1, aMutex, aDefault)
	o.waitValue(ctx, "dlock.renewals", 1, aLostOut)
	o.waitValue(ctx, "dlock.hold.duration", 1, aLostOut)
	o.want("dlock.leases.held", 0)
	if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Unlock of a lost lease: %v", err)
	}
	o.want("dlock.release.duration", 1, aLostOut)
	o.want("dlock.leases.lost", 1)
	un := o.ended("dlock.Lease.Unlock")
	if len(un) != 1 || un[0].Status().Code != codes.Unset || spanAttr(un[0], "dlock.outcome").AsString() != "lost" {
		t.Fatalf("dlock.Unlock spans %v: want one, outcome lost", un)
	}
}

// TestObserveLostAtUnlock: a lease without renewal whose key was deleted
// is found lost by its Unlock: one lease lost, outcome lost.
func TestObserveLostAtUnlock(t *testing.T) {
	s := redistest.Start(t)
	o := newObserved(t)
	c, rdb := newClient(t, s, o.opts...)
	ctx := ctxT(t, 10*time.Second)
	l, err := c.Mutex("obs/unlock-lost", dlock.NoRenew()).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.Del(ctx, "dlock:{obs/unlock-lost}").Err(); err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Unlock of a deleted lock: %v", err)
	}
	o.want("dlock.leases.lost", 1, aMutex, aDefault)
	o.want("dlock.release.duration", 1, aLostOut)
	o.want("dlock.hold.duration", 1, aUnlocked) // it was given up before the loss was known
	o.want("dlock.leases.held", 0)
}

// TestObserveRenewalErrors: renewals that cannot reach a paused server
// count as errors, and the lease is lost at its deadline.
func TestObserveRenewalErrors(t *testing.T) {
	s := redistest.Start(t)
	o := newObserved(t)
	// ContextTimeoutEnabled: the renewal in flight fails at the lease's
	// deadline, not at go-redis's read timeout.
	c := newDlock(t, s.Client(t, func(ro *redis.Options) { ro.ContextTimeoutEnabled = true }), o.opts...)
	t.Cleanup(func() { _ = c.Close() })
	ctx := ctxT(t, 20*time.Second)
	l, err := c.Mutex("obs/paused", dlock.TTL(300*time.Millisecond)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.Pause()
	select {
	case <-l.Context().Done():
	case <-ctx.Done():
		s.Resume()
		t.Fatal("the lease did not end at its deadline")
	}
	// The renewal in flight fails at the lease's deadline, as the lease ends.
	waitFor(t, ctx, "a renewal error", func() bool { return o.value("dlock.renewals", attribute.String("dlock.outcome", "error")) >= 1 })
	s.Resume()
	o.waitValue(ctx, "dlock.leases.lost", 1) // recorded just after the lease context ended
	o.waitValue(ctx, "dlock.hold.duration", 1, aLostOut)
}

// TestObserveRenewals: a held lease renewed by the watchdog counts each
// renewal as renewed.
func TestObserveRenewals(t *testing.T) {
	s := redistest.Start(t)
	o := newObserved(t)
	c, _ := newClient(t, s, o.opts...)
	ctx := ctxT(t, 20*time.Second)
	l, err := c.Mutex("obs/renew", dlock.TTL(150*time.Millisecond)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	o.waitValue(ctx, "dlock.renewals", 2, aRenewed)
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	n := o.value("dlock.renewals")
	o.want("dlock.renewals", n, aRenewed)
	o.want("dlock.leases.lost", 0)
}

// TestObserveCloseZeroes: Close with leases held and calls waiting brings
// both gauges back to zero: the leases end closed, the waiting calls
// return ErrClosed (outcome error, error.type dlock.ErrClosed).
func TestObserveCloseZeroes(t *testing.T) {
	s := redistest.Start(t)
	o := newObserved(t)
	c, _ := newClient(t, s, o.opts...)
	other, _ := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	for _, name := range []string{"obs/c1", "obs/c2"} {
		if _, err := c.Mutex(name).Lock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.Semaphore("obs/sem", 2).Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Mutex("obs/c3").Lock(ctx); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, lock := range []func() error{
		func() error { _, err := c.Mutex("obs/c1").Lock(context.Background()); return err }, // queued behind its own Client's holder
		func() error { _, err := c.Mutex("obs/c3").Lock(context.Background()); return err },
		func() error { _, err := c.Semaphore("obs/sem", 2).Acquire(context.Background(), 2); return err },
	} {
		wg.Go(func() {
			if err := lock(); !errors.Is(err, dlock.ErrClosed) {
				t.Errorf("a Lock waiting as its Client closed: %v, want ErrClosed", err)
			}
		})
	}
	o.waitValue(ctx, "dlock.waiters", 3)
	o.want("dlock.leases.held", 3)
	o.want("dlock.leases.held", 1, attribute.String("dlock.primitive", "semaphore"), aFair)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	o.want("dlock.leases.held", 0)
	wg.Wait()
	// Every hold ended closed: the three held, and any waiter that Close's
	// releases handed the lock to (its call released it and returned
	// ErrClosed; nobody called Unlock).
	if n := o.value("dlock.hold.duration"); n < 3 {
		t.Errorf("%d holds ended, want at least the 3 held", n)
	}
	o.want("dlock.hold.duration", o.value("dlock.hold.duration"), aClosedOut)
	o.want("dlock.release.duration", 0)
	o.want("dlock.waiters", 0)
	o.want("dlock.acquire.duration", 3, aError, attribute.String("error.type", "dlock.ErrClosed"))
	o.want("dlock.leases.lost", 0)
}

// TestObserveCloseRacingAGrant: a Lock whose grant comes back as Close
// runs (its acquire's reply held back) returns ErrClosed, and the lock is
// released by dlock. That is no Unlock of the user's: no release is
// recorded and no dlock.Lease.Unlock span made; a hold it had ends closed.
func TestObserveCloseRacingAGrant(t *testing.T) {
	s := redistest.Start(t)
	o := newObserved(t)
	c, in := reviewClient(t, s, 5*time.Second, o.opts,
		faults.Rule{Script: "acquire", Via: faults.Single, Kind: faults.DelayReply, Calls: []int{1}, Min: 300 * time.Millisecond, Max: 300 * time.Millisecond})
	rdb := s.Client(t)
	ctx := ctxT(t, 20*time.Second)
	const name = "obs/close-race"
	got := async(t, ctx, c.Mutex(name, dlock.TTL(time.Minute)).Lock)
	if !in.WaitInFlight(5*time.Second, func(k faults.Call) bool { return k.Script == "acquire" }) {
		t.Fatal("no acquire in flight")
	}
	waitFor(t, ctx, "the grant at Redis", func() bool { return owner(ctx, rdb, name) != "" })
	_ = c.Close()
	if l, err := got(); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("Lock granted as Close ran: %v, %v; want ErrClosed", l, err)
	}
	if o := owner(ctx, rdb, name); o != "" {
		t.Fatalf("owner %q left at Redis after Close and the Lock returned (TTL a minute)", o)
	}
	o.want("dlock.acquire.duration", 1, aError, attribute.String("error.type", "dlock.ErrClosed"))
	// Over go-redis the call gets the grant and releases it; over rueidis
	// its batched acquire returns at Close and the grant, late, is given
	// back: never held.
	holds := int64(1)
	if onRueidis() {
		holds = 0
	}
	o.want("dlock.hold.duration", holds, aClosedOut)
	o.want("dlock.hold.duration", holds)
	o.want("dlock.leases.held", 0)
	o.want("dlock.release.duration", 0)
	if n := len(o.ended("dlock.Lease.Unlock")); n != 0 {
		t.Errorf("%d dlock.Lease.Unlock spans, want none: nobody called Unlock", n)
	}
}

// TestObservePrimitives: RWMutex and Semaphore calls are recorded under
// their own primitive (mode fair: they always wait in line), with span
// names of their own.
func TestObservePrimitives(t *testing.T) {
	s := redistest.Start(t)
	o := newObserved(t)
	c, _ := newClient(t, s, o.opts...)
	ctx := ctxT(t, 10*time.Second)
	rw := c.RWMutex("obs/rw")
	r, err := rw.RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rw.TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock under a reader: %v", err)
	}
	r2, err := rw.TryRLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []*dlock.Lease{r, r2} {
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	w, err := rw.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	sem := c.Semaphore("obs/sem", 3)
	p, err := sem.Acquire(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sem.TryAcquire(ctx, 2); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryAcquire of too many: %v", err)
	}
	if err := p.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sem.Acquire(ctx, 4); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Fatalf("Acquire of more than the size: %v", err)
	}
	o.want("dlock.acquire.duration", 1, attribute.String("dlock.primitive", "rwmutex.read"), aFair, aLock, aAcquired)
	o.want("dlock.acquire.duration", 1, attribute.String("dlock.primitive", "rwmutex.read"), aFair, aTry, aAcquired)
	o.want("dlock.acquire.duration", 1, attribute.String("dlock.primitive", "rwmutex.write"), aFair, aTry, aNotObt)
	o.want("dlock.acquire.duration", 1, attribute.String("dlock.primitive", "rwmutex.write"), aFair, aLock, aAcquired)
	o.want("dlock.acquire.duration", 1, attribute.String("dlock.primitive", "semaphore"), aFair, aLock, aAcquired)
	o.want("dlock.acquire.duration", 1, attribute.String("dlock.primitive", "semaphore"), aTry, aNotObt)
	o.want("dlock.acquire.duration", 1, attribute.String("dlock.primitive", "semaphore"), aError, attribute.String("error.type", "dlock.ErrInvalidArgument"))
	o.want("dlock.contentions", 2)
	for name, n := range map[string]int{"dlock.RWMutex.RLock": 1, "dlock.RWMutex.TryRLock": 1, "dlock.RWMutex.Lock": 1, "dlock.RWMutex.TryLock": 1, "dlock.Semaphore.Acquire": 2, "dlock.Semaphore.TryAcquire": 1, "dlock.Lease.Unlock": 4} {
		if got := len(o.ended(name)); got != n {
			t.Errorf("%d %s spans, want %d", got, name, n)
		}
	}
}

// TestObserveReentry: a reentrant Lock is an acquisition (via reentry on
// its span) but not another lease held.
func TestObserveReentry(t *testing.T) {
	s := redistest.Start(t)
	o := newObserved(t)
	c, _ := newClient(t, s, o.opts...)
	ctx := ctxT(t, 10*time.Second)
	m := c.Mutex("obs/re")
	outer, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inner, err := m.Lock(outer.Context())
	if err != nil {
		t.Fatal(err)
	}
	o.want("dlock.acquire.duration", 2, aAcquired)
	o.want("dlock.leases.held", 1)
	for _, l := range []*dlock.Lease{inner, outer} {
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	o.want("dlock.leases.held", 0)
	o.want("dlock.hold.duration", 1)
	vias := map[string]int{}
	for _, sp := range o.ended("dlock.Mutex.Lock") {
		vias[spanAttr(sp, "dlock.via").AsString()]++
	}
	if vias["look"] != 1 || vias["reentry"] != 1 {
		t.Errorf("dlock.via: %v, want one look and one reentry", vias)
	}
}

// TestObserveNameAttribute: WithNameAttribute puts the lock name on every
// data point and span.
func TestObserveNameAttribute(t *testing.T) {
	s := redistest.Start(t)
	o := newObserved(t, dlock.WithNameAttribute())
	c, _ := newClient(t, s, o.opts...)
	ctx := ctxT(t, 10*time.Second)
	l, err := c.Mutex("obs/named").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	named := attribute.String("dlock.lock.name", "obs/named")
	o.want("dlock.leases.held", 1, named)
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for _, m := range []string{"dlock.acquire.duration", "dlock.release.duration", "dlock.hold.duration"} {
		o.want(m, 1, named)
	}
	o.want("dlock.leases.held", 0, named)
	for _, sp := range o.spans.Ended() {
		if spanAttr(sp, "dlock.lock.name").AsString() != "obs/named" {
			t.Errorf("span %s lacks the lock name: %v", sp.Name(), sp.Attributes())
		}
	}
}

// TestObserveQuorum: quorum-mode calls are recorded with mode quorum.
func TestObserveQuorum(t *testing.T) {
	_, rdbs := quorumMasters(t, 3)
	o := newObserved(t)
	a, b := newQuorum(t, rdbs, o.opts...), newQuorum(t, rdbs)
	ctx := ctxT(t, 20*time.Second)
	held, err := b.Mutex("obs/q").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Mutex("obs/q").TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("quorum TryLock on a held lock: %v", err)
	}
	got := lockThenUnlock(ctx, a.Mutex("obs/q"))
	q := attribute.String("dlock.mode", "quorum")
	o.waitValue(ctx, "dlock.waiters", 1, q)
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	o.want("dlock.acquire.duration", 1, q, aTry, aNotObt)
	o.want("dlock.acquire.duration", 1, q, aLock, aAcquired)
	o.want("dlock.contentions", 2, q)
	o.want("dlock.waiters", 0)
	o.want("dlock.leases.held", 0)
	o.want("dlock.release.duration", 1, q, aReleased)
}

// TestObserveDebugLog: with a Debug logger, every acquisition, wait and
// Unlock is a debug line, and no line carries the owner token.
func TestObserveDebugLog(t *testing.T) {
	s := redistest.Start(t)
	var rec logRecorder
	c, rdb := newClient(t, s, dlock.WithLogger(slog.New(&rec)))
	other, _ := newClient(t, s)
	ctx := ctxT(t, 10*time.Second)
	h, err := other.Mutex("obs/log").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan *dlock.Lease, 1)
	go func() {
		l, err := c.Mutex("obs/log").Lock(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- l
	}()
	waitLine(t, ctx, rdb, "dlock:{obs/log}", 1)
	if n := rec.count("dlock: waiting"); n != 1 {
		t.Fatalf("%d waiting lines, want 1: %q", n, rec.all())
	}
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l := <-got
	if l == nil {
		t.FailNow()
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if rec.count("dlock: acquire") != 1 || rec.count("dlock: unlock") != 1 {
		t.Fatalf("debug lines: %q", rec.all())
	}
	for _, line := range rec.all() {
		if strings.Contains(line, l.Token()) || strings.Contains(line, h.Token()) {
			t.Fatalf("a debug line carries an owner token: %s", line)
		}
	}
	acq := rec.find("dlock: acquire")
	for _, want := range []string{"lock=obs/log", "outcome=acquired", "via=handover", "waited="} {
		if !strings.Contains(acq, want) {
			t.Errorf("acquire line %q lacks %q", acq, want)
		}
	}
}

// logRecorder is a slog.Handler that keeps every record as a line.
type logRecorder struct {
	mu    sync.Mutex
	msgs  []string
	lines []string
}

func (r *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *logRecorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *logRecorder) WithGroup(string) slog.Handler            { return r }
func (r *logRecorder) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Message)
	rec.Attrs(func(a slog.Attr) bool {
		b.WriteString(" " + a.String())
		return true
	})
	r.mu.Lock()
	r.msgs = append(r.msgs, rec.Message)
	r.lines = append(r.lines, b.String())
	r.mu.Unlock()
	return nil
}

func (r *logRecorder) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.lines...)
}

func (r *logRecorder) count(msg string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, m := range r.msgs {
		if m == msg {
			n++
		}
	}
	return n
}

func (r *logRecorder) find(msg string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, m := range r.msgs {
		if m == msg {
			return r.lines[i]
		}
	}
	return ""
}

// TestObserveHandOverFoundByLook: a hand-over whose message the waiter's
// Client did not hear (its subscription connection was killed just before
// the release) is found by the waiter's own next look, and counts as a
// hand-over all the same. Up to 5 attempts, until one is found by a look.
func TestObserveHandOverFoundByLook(t *testing.T) {
	s := redistest.Start(t)
	o := newObserved(t)
	holder, rdb := newClient(t, s)
	c, _ := newClient(t, s, o.opts...)
	ctx := ctxT(t, 30*time.Second)
	for attempt := 1; ; attempt++ {
		name := "obs/look" + strconv.Itoa(attempt)
		h, err := holder.Mutex(name, dlock.Fair()).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan *dlock.Lease, 1)
		go func() {
			l, err := c.Mutex(name, dlock.Fair()).Lock(ctx)
			if err != nil {
				t.Error(err)
			}
			got <- l
		}()
		waitLine(t, ctx, rdb, "dlock:{"+name+"}", 1)
		heard, before := dlock.HandOversHeard(c), o.value("dlock.handovers")
		if err := rdb.ClientKillByFilter(ctx, "TYPE", "pubsub").Err(); err != nil {
			t.Fatal(err)
		}
		if err := h.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		l := <-got
		if l == nil {
			t.FailNow()
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if n := o.value("dlock.handovers"); n != before+1 {
			t.Fatalf("attempt %d: dlock.handovers went from %d to %d, want one more", attempt, before, n)
		}
		if dlock.HandOversHeard(c) == heard {
			return // found by its look
		}
		if attempt == 5 {
			t.Skip("every hand-over's message was heard: the look path was not reached")
		}
	}
}

// lockThenUnlock Locks m on a goroutine and Unlocks once it holds; the
// channel gets the first error, or nil.
func lockThenUnlock(ctx context.Context, m *dlock.Mutex) <-chan error {
	got := make(chan error, 1)
	go func() {
		l, err := m.Lock(ctx)
		if err == nil {
			err = l.Unlock(ctx)
		}
		got <- err
	}()
	return got
}
