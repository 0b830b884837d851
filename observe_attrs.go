package dlock

import (
	"context"
	"errors"
	"net"
	"sync/atomic"

	"github.com/dlock-go/dlock/internal/wire"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// This file is what observe.go measures with: the classes of a lock and of
// an error, the instruments, and every attribute set and list, built once.

// The classes of a lock, each an attribute value: its primitive and mode.
const (
	primMutex = iota
	primRead
	primWrite
	primSemaphore
	nPrim
)

var primNames = [nPrim]string{"mutex", "rwmutex.read", "rwmutex.write", "semaphore"}

const (
	modeDefault = iota
	modeFair
	modeQuorum
	nMode
)

var modeNames = [nMode]string{"default", "fair", "quorum"}

// class returns lk's primitive and mode.
func (lk *lock) class() (prim, mode int) {
	switch {
	case lk.kind == wire.KindSemaphore:
		prim = primSemaphore
	case lk.kind == wire.KindRWMutex && lk.readSide:
		prim = primRead
	case lk.kind == wire.KindRWMutex:
		prim = primWrite
	}
	switch {
	case lk.c.q != nil:
		mode = modeQuorum
	case lk.fair:
		mode = modeFair
	}
	return prim, mode
}

// callKind is what an acquiring call is: Lock (waits) or TryLock (one look).
type callKind uint8

const (
	callLock callKind = iota
	callTry
	nCall
)

var callNames = [nCall]string{"lock", "try"}

// spanNames are the span names of the acquiring calls, by primitive and
// call: the type and method called, so that a span says what it is
// without an attribute (every attribute costs the span's recording).
var spanNames = [nPrim][nCall]string{
	{"dlock.Mutex.Lock", "dlock.Mutex.TryLock"},
	{"dlock.RWMutex.RLock", "dlock.RWMutex.TryRLock"},
	{"dlock.RWMutex.Lock", "dlock.RWMutex.TryLock"},
	{"dlock.Semaphore.Acquire", "dlock.Semaphore.TryAcquire"},
}

// errKind classifies a call's error for the error.type attribute; errNone
// is success.
type errKind uint8

const (
	errNone errKind = iota
	errNotObtained
	errCanceled
	errDeadline
	errClosed
	errLost
	errInvalid
	errForeign
	errNotReplicated
	errRedis
	errNet
	errOther
	nErr
)

// errTypes are the error.type values, by errKind.
var errTypes = [nErr]string{"", "dlock.ErrNotObtained", "context.Canceled", "context.DeadlineExceeded",
	"dlock.ErrClosed", "dlock.ErrLockLost", "dlock.ErrInvalidArgument", "dlock.ErrForeignKey",
	"dlock.ErrNotReplicated", "redis.Error", "net.Error", "_OTHER"}

func classify(err error) errKind {
	if err == nil {
		return errNone
	}
	return classifyErr(err)
}

// classifyErr is classify of an error (its errors.As targets escape: a
// call for nil must not make them).
func classifyErr(err error) errKind {
	var reply redis.Error
	var ne net.Error
	switch {
	case errors.Is(err, ErrClosed):
		return errClosed
	case errors.Is(err, context.Canceled):
		return errCanceled
	case errors.Is(err, context.DeadlineExceeded):
		return errDeadline
	case errors.Is(err, ErrNotObtained):
		return errNotObtained
	case errors.Is(err, ErrLockLost):
		return errLost
	case errors.Is(err, ErrInvalidArgument):
		return errInvalid
	case errors.Is(err, ErrForeignKey):
		return errForeign
	case errors.Is(err, ErrNotReplicated):
		return errNotReplicated
	case errors.As(err, &reply):
		return errRedis
	case errors.As(err, &ne):
		return errNet
	}
	return errOther
}

// acquireOutcome is the dlock.outcome of an acquiring call that ended with k.
func acquireOutcome(k errKind) string {
	switch k {
	case errNone:
		return "acquired"
	case errNotObtained:
		return "not_obtained"
	case errCanceled, errDeadline:
		return "canceled"
	}
	return "error"
}

// releaseOutcome is the dlock.outcome of an Unlock that ended with k.
func releaseOutcome(k errKind) string {
	switch k {
	case errNone:
		return "released"
	case errLost:
		return "lost"
	case errCanceled, errDeadline:
		return "canceled"
	}
	return "error"
}

// failed reports whether an outcome sets the span's status to Error.
func failed(outcome string) bool { return outcome == "error" || outcome == "canceled" }

// How a holding ended, for dlock.hold.duration.
const (
	endUnlocked = iota
	endLost
	endClosed
	nEnd
)

var endNames = [nEnd]string{"unlocked", "lost", "closed"}

// Renewal outcomes, for dlock.renewals.
const (
	renewOK = iota
	renewLost
	renewError
	nRenew
)

var renewNames = [nRenew]string{"renewed", "lost", "error"}

// Attribute keys.
const (
	keyPrimitive = attribute.Key("dlock.primitive")
	keyMode      = attribute.Key("dlock.mode")
	keyOperation = attribute.Key("dlock.operation")
	keyOutcome   = attribute.Key("dlock.outcome")
	keyErrorType = attribute.Key("error.type")
	keyName      = attribute.Key("dlock.lock.name")
	keyFence     = attribute.Key("dlock.fence")
	keyVia       = attribute.Key("dlock.via")
)

// attrs is one precomputed combination of attributes: the list (to add the
// lock name to) and the options that carry its set.
type attrs struct {
	kv  []attribute.KeyValue
	rec []metric.RecordOption
	add []metric.AddOption
	obs []metric.ObserveOption
}

func newAttrs(kv ...attribute.KeyValue) attrs {
	s := attribute.NewSet(kv...)
	o := metric.WithAttributeSet(s)
	return attrs{kv: kv, rec: []metric.RecordOption{o}, add: []metric.AddOption{o}, obs: []metric.ObserveOption{o}}
}

// withName is a with the lock name added (WithNameAttribute): built anew.
func (a attrs) withName(name string) attrs {
	kv := make([]attribute.KeyValue, 0, len(a.kv)+1)
	kv = append(append(kv, a.kv...), keyName.String(name))
	return newAttrs(kv...)
}

// meters are the Client's instruments, with every attribute set they use.
type meters struct {
	acquire, release, hold                         metric.Float64Histogram
	held, waiters                                  metric.Int64UpDownCounter // held: with WithNameAttribute only
	contentions, renewals, lost, handovers, passes metric.Int64Counter

	// Without names, dlock.leases.held is observed from counts kept here
	// (an atomic add per grant and end, not two measurements per cycle).
	heldN    [nPrim][nMode]atomic.Int64
	heldSeen [nPrim][nMode]atomic.Bool // report 0 once a class has been held, not nothing

	class   [nPrim][nMode]attrs
	acqAt   [nPrim][nMode][nCall][nErr]attrs
	relAt   [nPrim][nMode][nErr]attrs
	holdAt  [nPrim][nMode][nEnd]attrs
	renewAt [nPrim][nMode][nRenew]attrs
}

// Bucket boundaries, in seconds: acquisitions take from a fraction of a
// millisecond (one round trip on a LAN) to as long as callers wait;
// holdings last from milliseconds to hours.
var (
	acquireBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}
	holdBuckets    = []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 600, 1800, 3600}
)

func newMeters(m metric.Meter, names bool) *meters {
	ms := &meters{}
	// The API's instruments never fail in a way a caller can act on: an
	// SDK that rejects one returns a working no-op instrument with the
	// error (and reports it to the global error handler itself).
	ms.acquire, _ = m.Float64Histogram("dlock.acquire.duration", metric.WithUnit("s"),
		metric.WithDescription("Time an acquiring call (Lock, TryLock, RLock, TryRLock, Acquire, TryAcquire) took, from call to return, by outcome."),
		metric.WithExplicitBucketBoundaries(acquireBuckets...))
	ms.release, _ = m.Float64Histogram("dlock.release.duration", metric.WithUnit("s"),
		metric.WithDescription("Time a Lease.Unlock call took, from call to return, by outcome."),
		metric.WithExplicitBucketBoundaries(acquireBuckets...))
	ms.hold, _ = m.Float64Histogram("dlock.hold.duration", metric.WithUnit("s"),
		metric.WithDescription("Time a lease was held: from the grant (or pass) to its end by Unlock, loss or Close."),
		metric.WithExplicitBucketBoundaries(holdBuckets...))
	const heldDesc = "Leases this Client holds now (reentrant leases on one holding count once)."
	if names {
		ms.held, _ = m.Int64UpDownCounter("dlock.leases.held", metric.WithUnit("{lease}"), metric.WithDescription(heldDesc))
	} else {
		_, _ = m.Int64ObservableUpDownCounter("dlock.leases.held", metric.WithUnit("{lease}"), metric.WithDescription(heldDesc),
			metric.WithInt64Callback(ms.observeHeld))
	}
	ms.waiters, _ = m.Int64UpDownCounter("dlock.waiters", metric.WithUnit("{call}"),
		metric.WithDescription("Acquiring calls of this Client waiting now for a lock held by someone else."))
	ms.contentions, _ = m.Int64Counter("dlock.contentions", metric.WithUnit("{call}"),
		metric.WithDescription("Acquiring calls that found the lock held (a Lock that had to wait, a TryLock that was refused), once per call."))
	ms.renewals, _ = m.Int64Counter("dlock.renewals", metric.WithUnit("{renewal}"),
		metric.WithDescription("Watchdog renewals of a lease, by outcome."))
	ms.lost, _ = m.Int64Counter("dlock.leases.lost", metric.WithUnit("{lease}"),
		metric.WithDescription("Leases that ended lost: someone else may have held the lock since."))
	ms.handovers, _ = m.Int64Counter("dlock.handovers", metric.WithUnit("{lease}"),
		metric.WithDescription("Waiting calls that the releasing holder's script handed the lock to at Redis."))
	ms.passes, _ = m.Int64Counter("dlock.passes", metric.WithUnit("{lease}"),
		metric.WithDescription("Waiting calls that a holder of this Client passed the lock to, without a round trip (default mode)."))
	for p := range nPrim {
		for md := range nMode {
			base := []attribute.KeyValue{keyPrimitive.String(primNames[p]), keyMode.String(modeNames[md])}
			ms.class[p][md] = newAttrs(base...)
			for k := range nErr {
				ms.relAt[p][md][k] = newAttrs(outcomeAttrs(base, releaseOutcome(k), k)...)
				for c := range nCall {
					kv := append(append([]attribute.KeyValue{}, base...), keyOperation.String(callNames[c]))
					ms.acqAt[p][md][c][k] = newAttrs(outcomeAttrs(kv, acquireOutcome(k), k)...)
				}
			}
			for e := range nEnd {
				ms.holdAt[p][md][e] = newAttrs(append(append([]attribute.KeyValue{}, base...), keyOutcome.String(endNames[e]))...)
			}
			for r := range nRenew {
				ms.renewAt[p][md][r] = newAttrs(append(append([]attribute.KeyValue{}, base...), keyOutcome.String(renewNames[r]))...)
			}
		}
	}
	return ms
}

// observeHeld reports dlock.leases.held from the counts.
func (ms *meters) observeHeld(_ context.Context, o metric.Int64Observer) error {
	for p := range nPrim {
		for md := range nMode {
			if ms.heldSeen[p][md].Load() {
				o.Observe(ms.heldN[p][md].Load(), ms.class[p][md].obs...)
			}
		}
	}
	return nil
}

// heldAdd adds d to the leases held of lk's class.
func (o *observer) heldAdd(lk *lock, prim, mode int, d int64) {
	if o.name {
		o.m.held.Add(context.Background(), d, o.at(o.m.class[prim][mode], lk).add...)
		return
	}
	o.m.heldSeen[prim][mode].Store(true)
	o.m.heldN[prim][mode].Add(d)
}

// outcomeAttrs is kv with dlock.outcome, and error.type when it failed.
func outcomeAttrs(kv []attribute.KeyValue, outcome string, k errKind) []attribute.KeyValue {
	out := append(append([]attribute.KeyValue{}, kv...), keyOutcome.String(outcome))
	if failed(outcome) {
		out = append(out, keyErrorType.String(errTypes[k]))
	}
	return out
}

// at returns a, with lk's name if the Client adds names.
func (o *observer) at(a attrs, lk *lock) attrs {
	if o.name {
		return a.withName(lk.name)
	}
	return a
}

// Span attributes. The SDK copies and grows a span's attribute list at
// each call and start option, and each attribute costs its recording
// (BenchmarkObserveHooks): so a span starts bare and gets its few
// attributes in one call as it ends, from precomputed lists where they do
// not depend on the call. A span carries dlock.outcome (and error.type
// when it failed), dlock.fence and dlock.via on an acquisition, and
// dlock.mode only when it is not the default.
var (
	acqSpan  [nMode][nErr][]attribute.KeyValue // an acquiring call's that obtained nothing
	relSpan  [nMode][nErr][]attribute.KeyValue // an Unlock's
	viaAttrs = [...]attribute.KeyValue{keyVia.String("look"), keyVia.String("handover"), keyVia.String("pass"), keyVia.String("reentry")}
	modeAttr [nMode]attribute.KeyValue
)

func init() {
	for md := range nMode {
		modeAttr[md] = keyMode.String(modeNames[md])
		var base []attribute.KeyValue
		if md != modeDefault {
			base = []attribute.KeyValue{modeAttr[md]}
		}
		for k := range nErr {
			acqSpan[md][k] = outcomeAttrs(base, acquireOutcome(k), k)
			relSpan[md][k] = outcomeAttrs(base, releaseOutcome(k), k)
		}
	}
}

// spanAttrs is pre with the lock's name if the Client adds names; pre
// itself without (no allocation).
func (o *observer) spanAttrs(pre []attribute.KeyValue, lk *lock) []attribute.KeyValue {
	if !o.name {
		return pre
	}
	return append(append(make([]attribute.KeyValue, 0, len(pre)+1), pre...), keyName.String(lk.name))
}

// leaseAttrs are the attributes of an acquiring call's span that obtained
// a lease with fence, via via, appended to kv (whose room they fill, but
// for the name).
func (o *observer) leaseAttrs(kv []attribute.KeyValue, lk *lock, mode int, fence uint64, via int) []attribute.KeyValue {
	kv = append(kv, acqSpan[modeDefault][errNone][0], keyFence.Int64(int64(fence)), viaAttrs[via])
	if mode != modeDefault {
		kv = append(kv, modeAttr[mode])
	}
	if o.name {
		kv = append(kv, keyName.String(lk.name))
	}
	return kv
}
