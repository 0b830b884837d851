//go:build !nodlock

// The dlock adapters live in this file alone, so that `-tags nodlock` builds
// the bench (raw floor and peers) while the root package does not compile.

package main

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

func init() {
	register(&impl{
		name:  "dlock",
		order: 10,
		settings: func(e *env) string {
			return fmt.Sprintf("dlock.New(shared go-redis client); Client.Mutex(key, dlock.TTL(%v)) per lock, defaults otherwise (watchdog renewal every TTL/3, local FIFO queue whose head waits in the line at Redis and is handed the lock by the release; a holder passes the lock to its own Client's waiters queued when its turn began, recorded at Redis a round trip later); Lock(ctx) waits until ctx ends", e.ttl)
		},
		open:   func(e *env) (locker, error) { return openDlock(e) },
		quorum: dlockQuorum,
	})
	register(&impl{
		name:  "dlock-norenew",
		order: 11,
		settings: func(e *env) string {
			return fmt.Sprintf("as dlock, with dlock.NoRenew() (no watchdog): Client.Mutex(key, dlock.TTL(%v), dlock.NoRenew())", e.ttl)
		},
		open: func(e *env) (locker, error) { return openDlock(e, dlock.NoRenew()) },
	})
	register(&impl{
		name:  "dlock-otel",
		order: 15,
		settings: func(e *env) string {
			return fmt.Sprintf("as dlock, observed: dlock.New(shared go-redis client, dlock.WithMeterProvider(OTel SDK MeterProvider with a ManualReader nobody collects), dlock.WithTracerProvider(OTel SDK TracerProvider, default sampler, no exporter)); Client.Mutex(key, dlock.TTL(%v))", e.ttl)
		},
		open: func(e *env) (locker, error) {
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
			tp := sdktrace.NewTracerProvider()
			return openDlockOn(e, dlock.New(e.rdb, dlock.WithMeterProvider(mp), dlock.WithTracerProvider(tp)))
		},
	})
	register(&impl{
		name:  "dlock-otel-metrics",
		order: 16,
		settings: func(e *env) string {
			return fmt.Sprintf("as dlock-otel with metrics only: dlock.New(shared go-redis client, dlock.WithMeterProvider(OTel SDK MeterProvider with a ManualReader nobody collects)); Client.Mutex(key, dlock.TTL(%v))", e.ttl)
		},
		open: func(e *env) (locker, error) {
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
			return openDlockOn(e, dlock.New(e.rdb, dlock.WithMeterProvider(mp)))
		},
	})
	register(&impl{
		name:  "dlock-otel-traces",
		order: 18,
		settings: func(e *env) string {
			return fmt.Sprintf("as dlock-otel with traces only: dlock.New(shared go-redis client, dlock.WithTracerProvider(OTel SDK TracerProvider, default sampler, no exporter)); Client.Mutex(key, dlock.TTL(%v))", e.ttl)
		},
		open: func(e *env) (locker, error) {
			return openDlockOn(e, dlock.New(e.rdb, dlock.WithTracerProvider(sdktrace.NewTracerProvider())))
		},
	})
	for _, r := range []struct {
		name           string
		order          int
		spans, metrics bool
		what           string
	}{
		{"dlock-app-spans", 19, true, false, "in a span of an OTel SDK TracerProvider (default sampler, no exporter) with the attributes dlock's own spans of an uncontended cycle carry (dlock.outcome, dlock.fence and dlock.via on the Lock's, dlock.outcome on the Unlock's)"},
		{"dlock-app-metrics", 20, false, true, "with the three histograms dlock records in an uncontended cycle (acquire, hold and release duration, in seconds, with dlock's buckets and attribute sets) on an OTel SDK MeterProvider with a ManualReader nobody collects"},
		{"dlock-app-both", 21, true, true, "in both of the above, the histograms recorded with the span's ctx (so the SDK's default filter records exemplars, as with dlock's)"},
	} {
		register(&impl{
			name:  r.name,
			order: r.order,
			settings: func(e *env) string {
				return fmt.Sprintf("the SDK's own cost of what dlock's observing records, with nothing of dlock's: dlock as in dlock (no providers), each Lock and Unlock wrapped by the bench %s; Client.Mutex(key, dlock.TTL(%v))", r.what, e.ttl)
			},
			open: func(e *env) (locker, error) {
				l, err := openDlock(e)
				if err != nil {
					return nil, err
				}
				return newAppObs(l, r.spans, r.metrics), nil
			},
		})
	}
	register(&impl{
		name:  "dlock-otel-sampled",
		order: 17,
		settings: func(e *env) string {
			return fmt.Sprintf("as dlock-otel with a 1%% sampler: sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.01))); Client.Mutex(key, dlock.TTL(%v))", e.ttl)
		},
		open: func(e *env) (locker, error) {
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
			tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(0.01))))
			return openDlockOn(e, dlock.New(e.rdb, dlock.WithMeterProvider(mp), dlock.WithTracerProvider(tp)))
		},
	})
	register(&impl{
		name:  "dlock-fair",
		order: 12,
		settings: func(e *env) string {
			return fmt.Sprintf("as dlock, with dlock.Fair() (a FIFO line at Redis, the release hands the lock to the first live waiter): Client.Mutex(key, dlock.TTL(%v), dlock.Fair())", e.ttl)
		},
		open: func(e *env) (locker, error) { return openDlock(e, dlock.Fair()) },
	})
	register(&impl{
		name:  "dlock-rw",
		order: 13,
		settings: func(e *env) string {
			return fmt.Sprintf("dlock's RWMutex, write side: Client.RWMutex(key, dlock.TTL(%v)).Lock(ctx) (a FIFO line at Redis, hand-over by the release script)", e.ttl)
		},
		open: func(e *env) (locker, error) { return openDlock(e, rwSide{}) },
	})
	register(&impl{
		name:  "dlock-sem",
		order: 14,
		settings: func(e *env) string {
			return fmt.Sprintf("dlock's Semaphore of size 1: Client.Semaphore(key, 1, dlock.TTL(%v)).Acquire(ctx, 1) (a FIFO line at Redis, hand-over by the release script)", e.ttl)
		},
		open: func(e *env) (locker, error) { return openDlock(e, semSide{}) },
	})
}

// rwSide and semSide select the primitive an adapter locks with: they are
// not lock options of dlock, only markers in this adapter's option list.
type (
	rwSide  struct{}
	semSide struct{}
)

// dlockQuorum runs dlock on several masters: dlock.New on one,
// dlock.NewQuorum with WithNodeTimeout on more, go-redis default options.
var dlockQuorum = &quorumImpl{
	settings: func(e *env, node time.Duration) string {
		return fmt.Sprintf("dlock.New(master) on one master, dlock.NewQuorum(masters, dlock.WithNodeTimeout(%v)) on more, each master a go-redis client with default options; Client.Mutex(key, dlock.TTL(%v)) per lock, Lock/TryLock, Unlock", node, e.ttl)
	},
	open: func(e *env, rdbs []*redis.Client, node time.Duration) (tryLocker, error) {
		if len(rdbs) == 1 {
			return openDlockOn(e, dlock.New(rdbs[0]))
		}
		us := make([]redis.UniversalClient, len(rdbs))
		for i, r := range rdbs {
			us[i] = r
		}
		c, err := dlock.NewQuorum(us, dlock.WithNodeTimeout(node))
		if err != nil {
			return nil, err
		}
		return openDlockOn(e, c)
	},
	// The bench's masters are new: a quorum master votes only once its
	// data is older than the restart delay (its epoch key says when the
	// data began). Set it to long ago, as a master up for a while has it.
	prepare: func(ctx context.Context, rdb *redis.Client) error {
		info, err := rdb.Info(ctx, "server").Result()
		if err != nil {
			return err
		}
		_, run, _ := strings.Cut(info, "run_id:")
		run, _, _ = strings.Cut(run, "\r\n")
		return rdb.Set(ctx, "dlock:epoch", "0 "+run, 0).Err() // "START RUN_ID"
	},
	held: func(ctx context.Context, rdb *redis.Client, key string) (bool, error) {
		n, err := rdb.HExists(ctx, "dlock:{"+key+"}", "o").Result()
		return n, err
	},
}

type dlockLocker struct {
	c    *dlock.Client
	opts []dlock.LockOption
	kind any // nil: Mutex; rwSide{}: RWMutex.Lock; semSide{}: Semaphore(1).Acquire(1)
}

func openDlock(e *env, extra ...any) (*dlockLocker, error) {
	return openDlockOn(e, dlock.New(e.rdb), extra...)
}

// openDlockOn is openDlock with a Client of its own.
func openDlockOn(e *env, c *dlock.Client, extra ...any) (*dlockLocker, error) {
	l := &dlockLocker{c: c, opts: []dlock.LockOption{dlock.TTL(e.ttl)}}
	for _, x := range extra {
		if o, ok := x.(dlock.LockOption); ok {
			l.opts = append(l.opts, o)
		} else {
			l.kind = x
		}
	}
	return l, nil
}

func (l *dlockLocker) Close() error { return l.c.Close() }

type dlockHeld struct{ l *dlock.Lease }

func (l *dlockLocker) Lock(ctx context.Context, key string) (held, error) {
	var lease *dlock.Lease
	var err error
	switch l.kind.(type) {
	case rwSide:
		lease, err = l.c.RWMutex(key, l.opts...).Lock(ctx)
	case semSide:
		lease, err = l.c.Semaphore(key, 1, l.opts...).Acquire(ctx, 1)
	default:
		lease, err = l.c.Mutex(key, l.opts...).Lock(ctx)
	}
	if err != nil {
		return nil, err
	}
	return dlockHeld{lease}, nil
}

func (h dlockHeld) Unlock(ctx context.Context) error { return h.l.Unlock(ctx) }

// TryLock tries the Mutex once (the quorum scenario).
func (l *dlockLocker) TryLock(ctx context.Context, key string) (held, error) {
	lease, err := l.c.Mutex(key, l.opts...).TryLock(ctx)
	if err != nil {
		return nil, err
	}
	return dlockHeld{lease}, nil
}

// appObs is the rows dlock-app-*: what an application pays the SDK that
// records, around an unobserved dlock, the spans and histograms dlock's
// observing records (dlock-otel-traces, -metrics and dlock-otel), with the
// same names, attributes and buckets: the floor under dlock's own.
type appObs struct {
	l                    *dlockLocker
	tr                   trace.Tracer            // nil: no spans
	acq, hold, rel       metric.Float64Histogram // nil: no metrics
	acqAt, holdAt, relAt []metric.RecordOption
}

var (
	appAcquired = attribute.String("dlock.outcome", "acquired")
	appLook     = attribute.String("dlock.via", "look")
	appReleased = []attribute.KeyValue{attribute.String("dlock.outcome", "released")}
)

func newAppObs(l *dlockLocker, spans, metrics bool) *appObs {
	a := &appObs{l: l}
	if spans {
		a.tr = sdktrace.NewTracerProvider().Tracer("bench")
	}
	if metrics {
		m := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader())).Meter("bench")
		acqB := metric.WithExplicitBucketBoundaries(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
		a.acq, _ = m.Float64Histogram("dlock.acquire.duration", metric.WithUnit("s"), acqB)
		a.rel, _ = m.Float64Histogram("dlock.release.duration", metric.WithUnit("s"), acqB)
		a.hold, _ = m.Float64Histogram("dlock.hold.duration", metric.WithUnit("s"),
			metric.WithExplicitBucketBoundaries(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 600, 1800, 3600))
		set := func(kv ...attribute.KeyValue) []metric.RecordOption {
			return []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(kv...))}
		}
		prim, mode := attribute.String("dlock.primitive", "mutex"), attribute.String("dlock.mode", "default")
		a.acqAt = set(prim, mode, attribute.String("dlock.operation", "lock"), appAcquired)
		a.holdAt = set(prim, mode, attribute.String("dlock.outcome", "unlocked"))
		a.relAt = set(prim, mode, appReleased[0])
	}
	return a
}

func (a *appObs) Close() error { return a.l.Close() }

func (a *appObs) Lock(ctx context.Context, key string) (held, error) {
	start := time.Now()
	var s trace.Span
	if a.tr != nil {
		ctx, s = a.tr.Start(ctx, "dlock.Mutex.Lock")
	}
	h, err := a.l.Lock(ctx, key)
	if err != nil {
		if s != nil {
			s.SetAttributes(attribute.String("dlock.outcome", "error"))
			s.End()
		}
		return nil, err
	}
	lease := h.(dlockHeld).l
	now := time.Now()
	if a.acq != nil {
		a.acq.Record(ctx, now.Sub(start).Seconds(), a.acqAt...)
	}
	if s != nil {
		s.SetAttributes(appAcquired, attribute.Int64("dlock.fence", int64(lease.Fence())), appLook)
		s.End()
	}
	return &appHeld{a: a, l: lease, at: now}, nil
}

type appHeld struct {
	a  *appObs
	l  *dlock.Lease
	at time.Time
}

func (h *appHeld) Unlock(ctx context.Context) error {
	a := h.a
	start := time.Now()
	var s trace.Span
	if a.tr != nil {
		ctx, s = a.tr.Start(ctx, "dlock.Lease.Unlock")
	}
	err := h.l.Unlock(ctx)
	if a.acq != nil {
		a.hold.Record(context.Background(), start.Sub(h.at).Seconds(), a.holdAt...)
		a.rel.Record(ctx, time.Since(start).Seconds(), a.relAt...)
	}
	if s != nil {
		s.SetAttributes(appReleased...)
		s.End()
	}
	return err
}
