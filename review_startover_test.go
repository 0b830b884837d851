package dlock_test

import (
	"context"
	"errors"
	"log/slog"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faults"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// delayedAcquires counts the acquire calls of script that the injector
// delayed (every one, with P 1).
func delayedAcquires(in *faults.Injector, script string) int {
	n := 0
	for k, v := range in.Stats() {
		if strings.HasPrefix(k, script+" delay-reply") {
			n += v
		}
	}
	return n
}

// TestReviewStartOverBacksOff: every acquire reply of a waiting Lock comes
// 5ms late, past the validity of its 2ms TTL, so every grant its looks in
// line find (the holder's lease ran out at Redis) is given back and the
// wait starts over with a fresh token. Lock must go on until its ctx ends
// (it does), but not at the pace of the round trip: its looks must back
// off as the first look's retries do (1ms doubling to 500ms), where the
// start-over loop looked again at once, each time with a new token, a
// synchronous give-back and a background one. Once ctx ends it returns
// promptly with the ctx's error, leaving nothing at Redis or in the
// Client's books.
func TestReviewStartOverBacksOff(t *testing.T) {
	for _, end := range []string{"ctx", "close"} {
		for _, k := range []lateKind{lateKinds()[0], lateKinds()[1]} { // mutex (default mode), fair
			testStartOverBacksOff(t, k, end)
		}
	}
}

// testStartOverBacksOff is TestReviewStartOverBacksOff for kind k, the
// Lock ended by its ctx or by Close (end).
func testStartOverBacksOff(t *testing.T, k lateKind, end string) {
	t.Run(k.name+"-"+end, func(t *testing.T) {
		t.Parallel()
		e := newLateEveryGrant(t, k)
		c, in, y, rdb, ctx, opts := e.c, e.in, e.y, e.rdb, e.ctx, e.opts
		name := "startover-rate-" + k.name
		// y holds for 300ms, not renewed: the lock then runs out at
		// Redis, and the waiter's next look is granted (late).
		if _, err := y.Mutex(name, dlock.TTL(300*time.Millisecond), dlock.NoRenew()).Lock(ctx); err != nil {
			t.Fatal(err)
		}
		lctx, cancel := context.WithCancel(ctx)
		defer cancel()
		got := goLock(lctx, c.Mutex(name, opts...).Lock)
		// The first look, the look that put it in line, and one
		// granted late.
		waitFor(t, ctx, "a late grant in line", func() bool { return delayedAcquires(in, k.acq) >= 3 })
		from := delayedAcquires(in, k.acq)
		const window = 2 * time.Second
		select {
		case r := <-got:
			t.Fatalf("Lock returned within the window: %v (every grant is late)", r.err)
		case <-time.After(window):
		}
		n := delayedAcquires(in, k.acq) - from
		closed := make(chan error, 1)
		if end == "ctx" {
			cancel()
		} else {
			go func() { closed <- c.Close() }()
		}
		var r result
		select {
		case r = <-got:
		case <-time.After(2 * time.Second):
			t.Fatalf("Lock did not return within 2s of its end (%s)", end)
		}
		if r.err == nil {
			_ = r.l.Unlock(ctx)
			t.Fatalf("Lock obtained a lease of a 2ms TTL whose every reply is 5ms late (%s)", dlock.Describe(r.l))
		}
		if want := error(context.Canceled); end == "close" {
			select {
			case err := <-closed:
				if err != nil {
					t.Errorf("Close: %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("Close did not return within 10s")
			}
			if !errors.Is(r.err, dlock.ErrClosed) {
				t.Errorf("Lock: %v, want ErrClosed", r.err)
			}
		} else if !errors.Is(r.err, want) {
			t.Errorf("Lock: %v, want the ctx's error", r.err)
		}
		// A backoff like the first look's (1ms doubling to 500ms) makes
		// about 13 looks in 2s; the round trip's pace, hundreds.
		if n > 40 {
			t.Errorf("%d acquires in %v while every grant came late: the start-over does not back off", n, window)
		}
		waitFor(t, ctx, "nothing left at Redis", func() bool { return k.left(ctx, rdb, name) == "" })
		if locals, tokens := dlock.Books(c); locals != 0 || tokens != 0 {
			t.Errorf("left in the Client's books: %d locks, %d tokens in line", locals, tokens)
		}
	})
}

// TestReviewStartOverVia: a waiter's look in line runs at Redis (it keeps
// its place) and its reply is held back 3.8s; meanwhile the holder
// unlocks, handing the lock to the waiter's token. The hand-over, heard
// past its validity, has expired at Redis: the confirming extension fails,
// the grant is given back, and the wait starts over with a fresh token,
// whose first look finds the lock free and takes it. The call's span (and
// its debug line) must say it obtained the lock by a look: the hand-over
// it was given back is not how it obtained it (the span said
// dlock.via=handover).
func TestReviewStartOverVia(t *testing.T) {
	const delay = 3800 * time.Millisecond
	for _, k := range []lateKind{lateKinds()[0], lateKinds()[1], lateKinds()[2]} { // mutex, fair, semaphore
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			s := redistest.Start(t)
			spans := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
			t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
			var logs syncBuffer
			logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			c, in := reviewClient(t, s, 5*time.Second, []dlock.Option{dlock.WithTracerProvider(tp), dlock.WithLogger(logger)},
				faults.Rule{Script: k.acq, Kind: faults.DelayReply, Calls: []int{2}, Min: delay, Max: delay})
			cs, rdb := newClients(t, s, 1)
			x := cs[0]
			ctx := ctxT(t, 30*time.Second)
			name := "startover-via-" + k.name
			key := "dlock:{" + name + "}"
			holder, err := k.lock(x, name)(ctx)
			if err != nil {
				t.Fatal(err)
			}
			unlocked := make(chan error, 1)
			go func() {
				if !pollUntil(ctx, 10*time.Second, func() bool { return lateFired(in, k.acq) && rdb.LLen(ctx, key+":q").Val() == 1 }) {
					unlocked <- errors.New("the delayed look never put the waiter in line")
					return
				}
				old := rdb.LIndex(ctx, key+":q", 0).Val()
				if err := holder.Unlock(ctx); err != nil {
					unlocked <- err
					return
				}
				if !handedTo(ctx, rdb, k, name, old) {
					unlocked <- errors.New("the release did not hand the lock to the waiter's token")
					return
				}
				unlocked <- nil
			}()
			l, err := k.lock(c, name)(ctx)
			if uerr := <-unlocked; uerr != nil {
				t.Fatalf("%v (Lock: %v)", uerr, err)
			}
			if err != nil {
				t.Fatalf("Lock: %v; faults: %s", err, in.Summary())
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(logs.String(), "waiting on with a new token") {
				t.Fatalf("the wait did not start over: %s", logs.String())
			}
			var lockSpans []sdktrace.ReadOnlySpan
			for _, sp := range spans.Ended() {
				if strings.HasPrefix(sp.Name(), "dlock.") && !strings.HasPrefix(sp.Name(), "dlock.Lease") && sp.Name() != "dlock.wait" {
					lockSpans = append(lockSpans, sp)
				}
			}
			if len(lockSpans) != 1 {
				t.Fatalf("%d spans of acquiring calls, want 1", len(lockSpans))
			}
			if v := spanAttr(lockSpans[0], "dlock.via").AsString(); v != "look" {
				t.Errorf("dlock.via=%q on the span of a Lock whose lease its own look obtained after a given-back hand-over, want look", v)
			}
			line := ""
			for _, ln := range strings.Split(logs.String(), "\n") {
				if strings.Contains(ln, "msg=\"dlock: acquire\"") {
					line = ln
				}
			}
			if !strings.Contains(line, "via=look") {
				t.Errorf("debug line %q: want via=look", line)
			}
		})
	}
}

// TestReviewDebugTookWithLevelRaised: a traced Client without metrics
// whose logger's level is raised to Debug while a Lock waits logs that
// call's debug line as the call ends; its took must be the call's
// duration (at least what it waited), not 0s (the call's start was not
// timed, since neither metrics nor debug lines were on when it began).
func TestReviewDebugTookWithLevelRaised(t *testing.T) {
	s := redistest.Start(t)
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	var level slog.LevelVar
	level.Set(slog.LevelInfo)
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: &level}))
	c, rdb := newClient(t, s, dlock.WithTracerProvider(tp), dlock.WithLogger(logger))
	other, _ := newClient(t, s)
	ctx := ctxT(t, 10*time.Second)
	const name = "debug-took"
	h, err := other.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := goLock(ctx, c.Mutex(name).Lock)
	waitLine(t, ctx, rdb, "dlock:{"+name+"}", 1)
	level.Set(slog.LevelDebug)
	time.Sleep(200 * time.Millisecond) // the call lasts at least this long
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	if err := r.l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	var line string
	for _, ln := range strings.Split(logs.String(), "\n") {
		if strings.Contains(ln, "msg=\"dlock: acquire\"") {
			line = ln
		}
	}
	m := regexp.MustCompile(` took=(\S+)`).FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("no took in the acquire line %q (logs: %s)", line, logs.String())
	}
	took, err := time.ParseDuration(m[1])
	if err != nil {
		t.Fatal(err)
	}
	if took < 200*time.Millisecond {
		t.Errorf("acquire line %q: took=%v for a call that lasted over 200ms", line, took)
	}
}

// lateEveryGrant is the set-up of the start-over review tests for kind k:
// a Client c whose every acquire reply comes 5 ms late (in records them),
// another Client y, and the waiter's options: a 2 ms TTL, so that every
// grant it hears is past its validity.
type lateEveryGrant struct {
	c    *dlock.Client
	in   *faults.Injector
	y    *dlock.Client
	rdb  *redis.Client
	ctx  context.Context
	opts []dlock.LockOption
}

func newLateEveryGrant(t *testing.T, k lateKind) lateEveryGrant {
	t.Helper()
	s := redistest.Start(t)
	c, in := reviewClient(t, s, 5*time.Second, nil,
		faults.Rule{Script: k.acq, Kind: faults.DelayReply, P: 1, Min: 5 * time.Millisecond, Max: 5 * time.Millisecond})
	cs, rdb := newClients(t, s, 1)
	opts := []dlock.LockOption{dlock.TTL(2 * time.Millisecond)}
	if k.name == "fair" {
		opts = append(opts, dlock.Fair())
	}
	return lateEveryGrant{c: c, in: in, y: cs[0], rdb: rdb, ctx: ctxT(t, 30*time.Second), opts: opts}
}
