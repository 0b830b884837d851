package dlock

import (
	"context"
	"hash/fnv"
	"log/slog"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// This file is the Client's observability: OpenTelemetry metrics and
// spans, and slog debug lines, at the events of a lock's life. The engine
// calls one small hook at each event (c.obs.x(...)); every hook is a
// method of a nil-able *observer that returns at once when it is nil, so a
// Client made without providers or a logger pays a nil check and nothing
// else (no allocation, no clock read). Attribute sets are built once per
// Client for every combination of low-cardinality attributes, so a
// measurement allocates nothing of its own either.

// scope names the instrumentation scope of dlock's meter and tracer.
const scope = "github.com/dlock-go/dlock"

// WithMeterProvider makes the Client record OpenTelemetry metrics through
// mp, with instrumentation scope "github.com/dlock-go/dlock". Default:
// none, and no metric is recorded (a nil mp is the default). Durations are
// in seconds. Every metric carries dlock.primitive (mutex, rwmutex.read,
// rwmutex.write, semaphore) and dlock.mode (default, fair, quorum;
// semaphores and RWMutexes are fair), and the lock name only with
// WithNameAttribute:
//
//   - dlock.acquire.duration (histogram, s): one per acquiring call (Lock,
//     TryLock, RLock, TryRLock, Acquire, TryAcquire, including reentrant
//     calls and calls refused at once), from call to return, Lock's wait
//     included; with dlock.operation (lock, try) and dlock.outcome
//     (acquired, not_obtained, canceled: its ctx ended, error), and
//     error.type when canceled or error (context.Canceled,
//     context.DeadlineExceeded, dlock.ErrClosed, dlock.ErrInvalidArgument,
//     dlock.ErrForeignKey, dlock.ErrNotReplicated, dlock.ErrLockLost,
//     redis.Error, net.Error, _OTHER).
//   - dlock.release.duration (histogram, s): one per Lease.Unlock call, with
//     dlock.outcome (released, lost: the lease had been lost, canceled,
//     error) and error.type as above.
//   - dlock.hold.duration (histogram, s): one per holding (reentrant leases
//     share one), from when it became held (granted, handed over, or passed
//     to and taken by its waiter) to when it stopped: its last Unlock was
//     called (dlock.outcome unlocked), it was found lost (lost), or the
//     Client closed (closed). A lock that dlock released itself because
//     its call could not return it ends closed if Close raced with the
//     grant, else unlocked (a hand-over that could not be confirmed, a
//     Campaign that could not publish its value); no
//     dlock.release.duration is recorded for it.
//   - dlock.leases.held (up-down counter, {lease}): holdings of this Client
//     live now, as above.
//   - dlock.waiters (up-down counter, {call}): acquiring calls of this
//     Client waiting now: from when a call found the lock held (or others
//     of this Client queued for it) until it returns.
//   - dlock.contentions (counter, {call}): acquiring calls that found the
//     lock held: a Lock, RLock or Acquire that had to wait (once, however
//     long and however it ended), and a TryLock, TryRLock or TryAcquire
//     refused because it was held.
//   - dlock.renewals (counter, {renewal}): watchdog renewal requests, with
//     dlock.outcome renewed, lost (the lock was found gone) or error (the
//     outcome is unknown: timeout or connection failure; retried).
//   - dlock.leases.lost (counter, {lease}): holdings that ended lost, so
//     that someone else may have held the lock since: renewal, Extend or
//     TTL found the lock gone, its deadline passed without a renewal, a
//     pass found the passer no longer the owner, or Unlock found it no
//     longer its own. Each holding counts once.
//   - dlock.handovers (counter, {lease}): waiting calls of this Client that
//     a releasing holder's script handed the lock to at Redis.
//   - dlock.passes (counter, {lease}): waiting calls of this Client that a
//     holder of the same Client passed the lock to (default mode).
//
// A measurement costs no allocation: attribute sets are built once per
// Client (with WithNameAttribute, one per measurement). Instruments are
// called on the goroutine of the event, never under a lock of the
// Client's: one that blocks holds up that call (or background step) only,
// but see docs/OBSERVABILITY.md before giving dlock one that may.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *clientConfig) { c.obs.mp = mp }
}

// WithTracerProvider makes the Client record an OpenTelemetry span for
// every acquiring call and every Unlock, as a child of the span in the
// call's ctx: "dlock.Mutex.Lock", "dlock.Mutex.TryLock",
// "dlock.RWMutex.RLock", "dlock.RWMutex.TryRLock", "dlock.RWMutex.Lock",
// "dlock.RWMutex.TryLock", "dlock.Semaphore.Acquire",
// "dlock.Semaphore.TryAcquire" and "dlock.Lease.Unlock". A call that had to
// wait has a child span "dlock.wait" for the wait. Spans carry
// dlock.outcome (as the metrics of WithMeterProvider), error.type and
// status Error when the call failed or its ctx ended (not when a TryLock
// found the lock held), dlock.fence and dlock.via (look, handover, pass,
// reentry) when a lease was obtained, dlock.mode when it is not default,
// and the lock name only with WithNameAttribute. The lease context
// (Lease.Context) does not carry dlock's spans: work under it stays the
// child of the caller's span. Default: none, and no span is made (a nil tp
// is the default). A recorded span costs what the SDK makes it cost (see
// docs/OBSERVABILITY.md); a sampler that drops most of them makes tracing
// nearly free.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *clientConfig) { c.obs.tp = tp }
}

// WithNameAttribute adds the lock name, as attribute "dlock.lock.name", to
// every metric and span the Client records. Default: off, since every lock
// name then makes time series of its own (a name per order or per item
// makes unbounded cardinality); with it, each measurement builds its
// attribute set (one allocation) instead of using a precomputed one.
func WithNameAttribute() Option {
	return func(c *clientConfig) { c.obs.name = true }
}

type obsConfig struct {
	mp   metric.MeterProvider
	tp   trace.TracerProvider
	name bool
}

// observer holds what a Client observes with; a nil *observer observes
// nothing.
type observer struct {
	log  *slog.Logger // nil: no debug lines
	tr   trace.Tracer // nil: no spans
	m    *meters      // nil: no metrics
	name bool         // WithNameAttribute
}

// newObserver returns nil unless cfg asks for metrics, spans or logs.
func newObserver(cfg clientConfig) *observer {
	o := &observer{name: cfg.obs.name}
	if cfg.logger != nil && cfg.logger.Handler() != slog.DiscardHandler {
		o.log = cfg.logger
	}
	if cfg.obs.tp != nil {
		o.tr = cfg.obs.tp.Tracer(scope)
	}
	if cfg.obs.mp != nil {
		o.m = newMeters(cfg.obs.mp.Meter(scope), cfg.obs.name)
	}
	if o.log == nil && o.tr == nil && o.m == nil {
		return nil
	}
	return o
}

// debug reports whether debug lines are logged now (a handler's level may
// change while the Client lives).
func (o *observer) debug(ctx context.Context) bool {
	return o.log != nil && o.log.Enabled(ctx, slog.LevelDebug)
}

// How an acquiring call obtained the lock (dlock.via on its span).
const (
	viaLook     = iota // its own acquire found it free (or already its own)
	viaHandOver        // a release at Redis handed it over
	viaPass            // a holder of this Client passed it
	viaReentry         // it re-entered a holding of its ctx
)

// acqMark is an acquiring call being observed; the zero value observes
// nothing. It lives in the call's defer record: only a traced (or debug
// logged) call allocates, its op.
type acqMark struct {
	o     *observer
	lk    *lock
	call  callKind
	start time.Time
	p     *op // nil: neither spans nor debug lines
}

// op is what the hooks inside the engine need of a traced or logged
// acquiring call. It is the call's ctx from the hook on (one allocation
// for both), so that those hooks find it; it carries no span: the lease
// context, made from the call's ctx, must not make the caller's later
// spans children of dlock's.
type op struct {
	context.Context
	lk        *lock
	sctx      context.Context // the call's ctx with its span (parent of the wait span)
	span      trace.Span      // nil: no span (no tracer, or not recording)
	wait      trace.Span      // the wait span, while it waits
	waitStart time.Time
	waited    bool
	via       int
	ended     bool // the call has returned: hooks of a later call must not use it

	// kv holds the span's attributes as the call ends (see leaseAttrs):
	// part of the op's one allocation, where a list of their own would be
	// another (the SDK copies them).
	kv [4]attribute.KeyValue
}

type opKey struct{}

// Value makes an op findable from the call's ctx, and anything else as
// the caller's ctx has it.
func (p *op) Value(key any) any {
	if key == (opKey{}) {
		return p
	}
	return p.Context.Value(key)
}

// opOf is the op of lk's call that ctx belongs to, or nil.
func opOf(ctx context.Context, lk *lock) *op {
	p, _ := ctx.Value(opKey{}).(*op)
	if p == nil || p.lk != lk || p.ended {
		return nil
	}
	return p
}

// acquire starts observing an acquiring call on lk (*ctx becomes its op if
// it has one). The caller defers the mark's end with its results.
func (o *observer) acquire(ctx *context.Context, lk *lock, call callKind) acqMark {
	if o == nil {
		return acqMark{}
	}
	return o.startAcquire(ctx, lk, call)
}

func (o *observer) startAcquire(ctx *context.Context, lk *lock, call callKind) acqMark {
	debug := o.debug(*ctx)
	if o.m == nil && o.tr == nil && !debug {
		return acqMark{}
	}
	m := acqMark{o: o, lk: lk, call: call}
	if o.m != nil || o.log != nil {
		// Spans read the clock themselves; a debug line may be wanted as
		// the call ends though not as it starts (a handler's level may
		// change meanwhile), and says how long the call took.
		m.start = time.Now()
	}
	if o.tr != nil || debug {
		p := &op{Context: *ctx, lk: lk, sctx: *ctx}
		if o.tr != nil {
			prim, _ := lk.class()
			p.sctx, p.span = o.tr.Start(*ctx, spanNames[prim][call])
			if !p.span.IsRecording() { // sampled out: nothing to add to it
				p.span = nil
			}
		}
		m.p = p
		*ctx = p
	}
	return m
}

// end records the call's result.
func (m acqMark) end(l **Lease, err *error) {
	if m.o != nil {
		m.o.endAcquire(m, *l, *err)
	}
}

func (o *observer) endAcquire(m acqMark, l *Lease, err error) {
	var took time.Duration
	if !m.start.IsZero() {
		took = time.Since(m.start)
	}
	k := classify(err)
	prim, mode := m.lk.class()
	p := m.p
	via := viaLook
	if p != nil {
		p.ended = true
		via = p.via
	}
	if l != nil && l != &l.h.first {
		via = viaReentry
	}
	if o.m != nil {
		ctx := context.Background()
		if p != nil {
			ctx = p.sctx // exemplars name the call's span
		}
		o.m.acquire.Record(ctx, took.Seconds(), o.at(o.m.acqAt[prim][mode][m.call][k], m.lk).rec...)
	}
	if p == nil {
		return
	}
	if p.wait != nil { // not ended by the wait (cannot happen): end it with the call
		p.wait.End()
	}
	var fence uint64
	if l != nil {
		fence = l.Fence()
	}
	if p.span != nil {
		if l != nil {
			p.span.SetAttributes(o.leaseAttrs(p.kv[:0], m.lk, mode, fence, via)...)
		} else {
			p.span.SetAttributes(o.spanAttrs(acqSpan[mode][k], m.lk)...)
		}
		if failed(acquireOutcome(k)) {
			p.span.SetStatus(codes.Error, err.Error())
		}
		p.span.End()
	}
	if o.debug(p.Context) {
		attrs := []slog.Attr{slog.String("lock", m.lk.name), slog.String("primitive", primNames[prim]),
			slog.String("mode", modeNames[mode]), slog.String("operation", callNames[m.call]),
			slog.String("outcome", acquireOutcome(k)), slog.Duration("took", took)}
		if p.waited {
			attrs = append(attrs, slog.Duration("waited", time.Since(p.waitStart)))
		}
		if l != nil {
			attrs = append(attrs, slog.Uint64("fence", fence), slog.String("via", viaAttrs[via].Value.AsString()), slog.String("owner", ownerTag(l.h.token)))
		} else if err != nil {
			attrs = append(attrs, slog.String("err", err.Error()))
		}
		o.log.LogAttrs(p.Context, slog.LevelDebug, "dlock: acquire", attrs...)
	}
}

// waitMark is a wait being observed; the zero value observes nothing.
type waitMark struct {
	o  *observer
	lk *lock
	p  *op
	at attrs
}

// waiting starts observing a call that waits for lk (it found the lock
// held): a contention, one more waiter, the wait span. The caller defers
// its done.
func (o *observer) waiting(ctx context.Context, lk *lock) waitMark {
	if o == nil {
		return waitMark{}
	}
	return o.startWait(ctx, lk)
}

func (o *observer) startWait(ctx context.Context, lk *lock) waitMark {
	w := waitMark{o: o, lk: lk, p: opOf(ctx, lk)}
	if o.m != nil {
		prim, mode := lk.class()
		w.at = o.at(o.m.class[prim][mode], lk)
		o.m.contentions.Add(ctx, 1, w.at.add...)
		o.m.waiters.Add(ctx, 1, w.at.add...)
	}
	if p := w.p; p != nil {
		p.waited, p.waitStart = true, time.Now()
		if p.span != nil {
			_, p.wait = o.tr.Start(p.sctx, "dlock.wait")
		}
	}
	if o.debug(ctx) {
		o.log.LogAttrs(ctx, slog.LevelDebug, "dlock: waiting", slog.String("lock", lk.name))
	}
	return w
}

// done ends the wait w observes.
func (w waitMark) done() {
	if w.o != nil {
		w.o.endWait(w)
	}
}

func (o *observer) endWait(w waitMark) {
	if o.m != nil {
		o.m.waiters.Add(context.Background(), -1, w.at.add...)
	}
	if p := w.p; p != nil && p.wait != nil {
		p.wait.End()
		p.wait = nil
	}
}

// refused observes a TryLock that found lk held: a contention.
func (o *observer) refused(ctx context.Context, lk *lock) {
	if o != nil && o.m != nil {
		prim, mode := lk.class()
		o.m.contentions.Add(ctx, 1, o.at(o.m.class[prim][mode], lk).add...)
	}
}

// handedOver observes a waiting call on lk that a release at Redis
// handed the lock to.
func (o *observer) handedOver(ctx context.Context, lk *lock) {
	if o != nil {
		o.obtainedBy(ctx, lk, viaHandOver)
	}
}

// passedTo observes a waiting call on lk that a holder of this Client
// passed the lock to.
func (o *observer) passedTo(ctx context.Context, lk *lock) {
	if o != nil {
		o.obtainedBy(ctx, lk, viaPass)
	}
}

// startedOver observes a waiting call on lk whose grant came too late and
// was given back (see lock.wait): however it obtains the lock next, it was
// not by that hand-over or pass.
func (o *observer) startedOver(ctx context.Context, lk *lock) {
	if o == nil {
		return
	}
	if p := opOf(ctx, lk); p != nil {
		p.via = viaLook
	}
}

func (o *observer) obtainedBy(ctx context.Context, lk *lock, via int) {
	if o.m != nil {
		prim, mode := lk.class()
		c := o.m.handovers
		if via == viaPass {
			c = o.m.passes
		}
		c.Add(ctx, 1, o.at(o.m.class[prim][mode], lk).add...)
	}
	if p := opOf(ctx, lk); p != nil {
		p.via = via
	}
}

// held observes a holding that became live (granted, handed over, or
// passed to and taken by its waiter): one more lease held. It takes h.mu,
// so it is called with no lock of the engine held, like every hook that
// records: see obsNote.
func (o *observer) held(h *holding) {
	if o == nil || (o.m == nil && o.log == nil) {
		return
	}
	h.mu.Lock()
	// Once: and not for a holding that ended before its waiter took the
	// pass (its end recorded nothing).
	now := h.st.live() && h.obsAt.IsZero()
	if now {
		h.obsAt = time.Now()
	}
	h.mu.Unlock()
	if now && o.m != nil {
		prim, mode := h.lk.class()
		o.heldAdd(h.lk, prim, mode, 1)
	}
}

// obsNote is what a hook found under a holding's lock (h.mu), to be
// recorded once it is released (observer.record). A provider's
// instruments are the user's code: one that is slow or blocks must hold up
// only the goroutine that records, never a lock of the engine, which the
// watchdog and other locks' calls take too. The zero note records nothing.
type obsNote struct {
	h     *holding      // nil: nothing to record
	ended bool          // a lease no longer held: its hold ended, after took
	end   int           // how (endUnlocked, endLost, endClosed)
	took  time.Duration //
	lost  bool          // a holding lost: one more lease lost
}

// ended observes, under h.mu, a holding that went from state from to to
// with cause (see holding.end): a lease no longer held, and how long it
// was; a lost one. The caller records the note after h.mu.
func (o *observer) ended(h *holding, from, to state, cause error) obsNote {
	if o == nil || o.m == nil {
		return obsNote{}
	}
	n := obsNote{h: h, lost: to == lost}
	if from.live() && !h.obsAt.IsZero() {
		n.ended, n.took, n.end = true, time.Since(h.obsAt), endUnlocked
		switch {
		case to == lost:
			n.end = endLost
		case to == closed || cause == ErrClosed: // closed, or given up as Close raced with its grant (unlockNow)
			n.end = endClosed
		}
	}
	return n
}

// settled observes, under h.mu, an ending or passing holding made final: a
// lost one (Unlock, or a pass record, found the lock no longer its own).
func (o *observer) settled(h *holding, to state) obsNote {
	if o == nil || o.m == nil || to != lost {
		return obsNote{}
	}
	return obsNote{h: h, lost: true}
}

// record records what n noted; called with no lock of the engine held.
func (o *observer) record(n obsNote) {
	h := n.h
	if h == nil {
		return // o may be nil: notes are made only when it is not
	}
	prim, mode := h.lk.class()
	if n.ended {
		o.heldAdd(h.lk, prim, mode, -1)
		o.m.hold.Record(context.Background(), n.took.Seconds(), o.at(o.m.holdAt[prim][mode][n.end], h.lk).rec...)
	}
	if n.lost {
		o.m.lost.Add(context.Background(), 1, o.at(o.m.class[prim][mode], h.lk).add...)
	}
}

// renewed observes one watchdog renewal of h with outcome r.
func (o *observer) renewed(h *holding, r int) {
	if o == nil {
		return
	}
	ctx := context.Background()
	if o.m != nil {
		prim, mode := h.lk.class()
		o.m.renewals.Add(ctx, 1, o.at(o.m.renewAt[prim][mode][r], h.lk).add...)
	}
	if r == renewOK && o.debug(ctx) {
		o.log.LogAttrs(ctx, slog.LevelDebug, "dlock: renewed", slog.String("lock", h.lk.name), slog.Uint64("fence", h.fence))
	}
}

// relMark is an Unlock being observed; the zero value observes nothing.
type relMark struct {
	o     *observer
	l     *Lease
	ctx   context.Context
	start time.Time
	span  trace.Span
}

// release starts observing l's Unlock; the caller defers its end.
func (o *observer) release(ctx context.Context, l *Lease) relMark {
	if o == nil {
		return relMark{}
	}
	return o.startRelease(ctx, l)
}

func (o *observer) startRelease(ctx context.Context, l *Lease) relMark {
	if o.m == nil && o.tr == nil && !o.debug(ctx) {
		return relMark{}
	}
	r := relMark{o: o, l: l, ctx: ctx}
	if o.m != nil || o.log != nil { // as in startAcquire
		r.start = time.Now()
	}
	if o.tr != nil {
		r.ctx, r.span = o.tr.Start(ctx, "dlock.Lease.Unlock")
		if !r.span.IsRecording() {
			r.span = nil
		}
	}
	return r
}

// end records the Unlock's result.
func (r relMark) end(err *error) {
	if r.o != nil {
		r.o.endRelease(r, *err)
	}
}

func (o *observer) endRelease(r relMark, err error) {
	h := r.l.h
	var took time.Duration
	if !r.start.IsZero() {
		took = time.Since(r.start)
	}
	k := classify(err)
	prim, mode := h.lk.class()
	if o.m != nil {
		o.m.release.Record(r.ctx, took.Seconds(), o.at(o.m.relAt[prim][mode][k], h.lk).rec...)
	}
	if r.span != nil {
		r.span.SetAttributes(o.spanAttrs(relSpan[mode][k], h.lk)...) // its fence is on its Lock's span
		if failed(releaseOutcome(k)) {
			r.span.SetStatus(codes.Error, err.Error())
		}
		r.span.End()
	}
	if o.debug(r.ctx) {
		attrs := []slog.Attr{slog.String("lock", h.lk.name), slog.String("outcome", releaseOutcome(k)),
			slog.Uint64("fence", r.l.Fence()), slog.Duration("took", took), slog.String("owner", ownerTag(h.token))}
		if err != nil {
			attrs = append(attrs, slog.String("err", err.Error()))
		}
		o.log.LogAttrs(r.ctx, slog.LevelDebug, "dlock: unlock", attrs...)
	}
}

// ownerTag is a short hash of an owner token, so that debug lines about
// one holding can be matched without logging the token (which would let
// a reader of the logs release or extend the lock).
func ownerTag(token string) string {
	f := fnv.New32a()
	_, _ = f.Write([]byte(token))
	return strconv.FormatUint(uint64(f.Sum32()), 16)
}
