package dlock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faults"
)

// TestReviewStartOverBackoffResets: every acquire reply of a waiting Lock
// (TTL 2ms) comes 5ms late, so every grant it finds is given back and the
// wait starts over, backing off 1ms doubling to 500ms. Once it has started
// over a dozen times (the backoff at its cap), another Client y takes the
// lock for 1s: the waiter's next token looks while y holds, finds the lock
// held, and keeps its place in line, its looks answered as they should be.
// Only when y's lease runs out is that token's grant late in turn. That
// start-over follows a wait that went as it should, not a run of late
// grants: it must not pause 500ms out of the line (with the lock free) as
// if the earlier run were still going on. The backoff resets once a look
// finds the lock held, as the line's own retry backoff does after a look.
func TestReviewStartOverBackoffResets(t *testing.T) {
	for _, k := range []lateKind{lateKinds()[0], lateKinds()[1]} { // mutex (default mode), fair
		t.Run(k.name, func(t *testing.T) {
			t.Parallel()
			e := newLateEveryGrant(t, k)
			c, in, y, rdb, ctx, opts := e.c, e.in, e.y, e.rdb, e.ctx, e.opts
			name := "startover-reset-" + k.name
			// The waiter's acquires, in order: (token, when sent).
			type acq struct {
				token string
				at    time.Duration
			}
			acquires := func() []acq {
				var out []acq
				for _, e := range in.Events(func(e faults.Event) bool { return e.Call.Script == k.acq && len(e.Call.Args) > 0 }) {
					out = append(out, acq{e.Call.Args[0], e.At})
				}
				return out
			}
			tokens := func(as []acq) []string {
				var out []string
				for i, a := range as {
					if i == 0 || as[i-1].token != a.token {
						out = append(out, a.token)
					}
				}
				return out
			}
			// y holds first (300ms, not renewed), so that the Lock waits:
			// once y's lease runs out, its looks in line are granted, late.
			if _, err := y.Mutex(name, dlock.TTL(300*time.Millisecond), dlock.NoRenew()).Lock(ctx); err != nil {
				t.Fatal(err)
			}
			lctx, cancel := context.WithCancel(ctx)
			defer cancel()
			got := goLock(lctx, c.Mutex(name, opts...).Lock)
			// A run of start-overs: 12 tokens, the backoff then at its cap.
			waitFor(t, ctx, "12 start-overs", func() bool { return len(tokens(acquires())) >= 12 })
			// y takes the lock (free but for the waiter's late grants,
			// each given back at once) for 1s, not renewed.
			if !pollUntil(ctx, 10*time.Second, func() bool {
				_, err := y.Mutex(name, dlock.TTL(time.Second), dlock.NoRenew()).TryLock(ctx)
				return err == nil
			}) {
				t.Fatal("y never took the lock")
			}
			from := len(acquires()) // the looks before y took the lock again
			// The first token of the waiter's that looked more than once
			// (it found y holding and kept its place), and the token that
			// followed it once its grant came late at y's expiry.
			var gap time.Duration
			waitFor(t, ctx, "the start-over after y's expiry", func() bool {
				as := acquires()[from:]
				for i := 1; i < len(as); i++ {
					if as[i].token != as[i-1].token {
						continue
					}
					// as[i-1..] is one token's looks; find its last and the next token's first.
					j := i
					for j+1 < len(as) && as[j+1].token == as[i].token {
						j++
					}
					if j+1 >= len(as) {
						return false
					}
					gap = as[j+1].at - as[j].at
					return true
				}
				return false
			})
			select {
			case r := <-got:
				t.Fatalf("Lock returned: %v (every grant is late)", r.err)
			default:
			}
			cancel()
			r := <-got
			if r.err == nil {
				_ = r.l.Unlock(ctx)
				t.Fatalf("Lock obtained a lease of a 2ms TTL whose every reply is 5ms late")
			}
			if !errors.Is(r.err, context.Canceled) {
				t.Errorf("Lock: %v, want the ctx's error", r.err)
			}
			// 5ms for the late reply, a give-back, and a 1ms pause; under
			// load some tens of ms. Not a backoff left at 500ms by a run
			// that ended a second before.
			if gap > 250*time.Millisecond {
				t.Errorf("the waiter's first look after a start-over came %v after its last look (its grant late once, after a wait in line that went as it should): the backoff of an earlier run of start-overs was not reset", gap.Round(time.Millisecond))
			}
			waitFor(t, ctx, "nothing left at Redis", func() bool { return k.left(ctx, rdb, name) == "" })
			if locals, tokens := dlock.Books(c); locals != 0 || tokens != 0 {
				t.Errorf("left in the Client's books: %d locks, %d tokens in line", locals, tokens)
			}
		})
	}
}
