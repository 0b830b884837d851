package dlock_test

// The election kind of TestInterleavings (interleave_test.go): candidates
// campaign, proclaim, read the leader and resign under the run's faults,
// and an observer follows the election throughout. Besides the checks of
// a Fair mutex (an Election is one: one leader believed valid at a time,
// fences in grant order), every value read or observed must have been
// published under the term it is reported with, the observer's terms never
// go back, and once every candidate is gone the observer's latest report
// is that nobody leads.

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/dlock-go/dlock"
)

// ilElection is what an election run has published and observed, under
// the run's mu.
type ilElection struct {
	// Every value a Campaign or Proclaim sent, with the term it was sent
	// for: 0 when unknown (a Campaign learns its term only from its
	// reply, and one that failed may have published all the same).
	values map[string]uint64
	seq    int
	// The observer's reports, in order.
	seen   []dlock.Leader
	cancel context.CancelFunc
	done   chan struct{}
	oc     *ilClient
}

// value returns a value no call has sent before, recorded as sent for term.
func (w *interleaving) value(ic *ilClient, term uint64) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.elect.seq++
	v := fmt.Sprintf("c%d.%d", ic.gen, w.elect.seq)
	w.elect.values[v] = term
	return v
}

// campaign campaigns with a new Election of ic, as a lock call of the run.
func (w *interleaving) campaign(ctx context.Context, ic *ilClient, opts []dlock.LockOption, me *ilLease) (*dlock.Lease, error) {
	me.e = ic.c.Election(w.name, opts...)
	me.via = "Campaign"
	v := w.value(ic, 0)
	l, err := me.e.Campaign(ctx, v)
	if err == nil {
		w.mu.Lock()
		w.elect.values[v] = l.Fence()
		w.mu.Unlock()
	}
	return l, err
}

// published checks that the leader l, read or observed (by what), was
// published under its term. Called under w.mu.
func (w *interleaving) published(what string, l dlock.Leader) {
	term, ok := w.elect.values[l.Value]
	switch {
	case !ok:
		w.failf("%s: leader %+v: no call published that value", what, l)
	case term != 0 && term != l.Fence:
		w.failf("%s: leader %+v: its value was published for term %d", what, l, term)
	}
}

// proclaim publishes a new value for me's term.
func (w *interleaving) proclaim(r *rand.Rand, me *ilLease) {
	end := time.Now().Add(time.Duration(r.IntN(200)) * time.Millisecond)
	ctx, cancel := context.WithDeadline(context.Background(), end)
	defer cancel()
	err := me.e.Proclaim(ctx, w.value(me.ic, me.fence))
	w.returnedBy("Proclaim", end)
	w.expected(err, "Proclaim")
	w.count("Proclaim")
}

// readLeader reads the leader through ic.
func (w *interleaving) readLeader(r *rand.Rand, ic *ilClient) {
	end := time.Now().Add(time.Duration(r.IntN(200)) * time.Millisecond)
	ctx, cancel := context.WithDeadline(context.Background(), end)
	defer cancel()
	// A leader that was believed valid before the read and still is after
	// it led throughout (as checkRedis reasons), its value published: the
	// read must find it.
	w.mu.Lock()
	var leaders []*ilLease
	for o := range w.held {
		if !dlock.Pending(o.l) && o.valid() {
			leaders = append(leaders, o)
		}
	}
	w.mu.Unlock()
	v, f, err := ic.c.Election(w.name).Leader(ctx)
	w.returnedBy("Leader", end)
	w.count("Leader")
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, o := range leaders {
		if o.valid() && (err == nil || errors.Is(err, dlock.ErrNoLeader)) && f != o.fence {
			w.failf("Leader read %q, term %d, err %v while %v led throughout", v, f, err, o)
		}
	}
	switch {
	case err == nil:
		w.published("Leader", dlock.Leader{Value: v, Fence: f})
	case !errors.Is(err, dlock.ErrNoLeader):
		w.mu.Unlock()
		w.expected(err, "Leader")
		w.mu.Lock()
	}
}

// resign ends me's leadership with Resign, with a ctx that may end
// meanwhile; a second Resign finds nothing to do.
func (w *interleaving) resign(r *rand.Rand, me *ilLease) {
	end := time.Now().Add(time.Duration(1+r.IntN(100)) * time.Millisecond)
	ctx, cancel := context.WithDeadline(context.Background(), end)
	err := me.e.Resign(ctx)
	cancel()
	w.returnedBy("Resign", end)
	w.expected(err, "Resign")
	w.count("Resign")
	if again := me.e.Resign(context.Background()); again != nil {
		w.mu.Lock()
		w.failf("a second Resign of %v: %v, want nil (it no longer leads)", me, again)
		w.mu.Unlock()
	}
}

// observe starts the run's observer, on a Client of its own (with faults
// of its own, never closed by the chaos).
func (w *interleaving) observe() {
	oc := w.newClient()
	ctx, cancel := context.WithCancel(context.Background())
	w.elect.oc, w.elect.cancel, w.elect.done = oc, cancel, make(chan struct{})
	ch := oc.c.Election(w.name).Observe(ctx)
	go func() {
		defer close(w.elect.done)
		for l := range ch {
			w.mu.Lock()
			if l.Fence != 0 && w.lastTerm() > l.Fence {
				w.failf("the observer reported term %d after term %d", l.Fence, w.lastTerm())
			}
			if l.Fence != 0 {
				w.published("Observe", l)
			}
			w.elect.seen = append(w.elect.seen, l)
			w.mu.Unlock()
		}
	}()
}

// lastTerm is the highest term observed so far. Called under w.mu.
func (w *interleaving) lastTerm() uint64 {
	var top uint64
	for _, l := range w.elect.seen {
		top = max(top, l.Fence)
	}
	return top
}

// settle checks, once the lock is free, that the observer comes to report
// that nobody leads: within the longest TTL a missed release costs, and a
// little more. Then it stops the observer and its Client.
func (w *interleaving) settle() {
	deadline := time.Now().Add(w.maxTTL + 2*time.Second)
	for {
		w.mu.Lock()
		n := len(w.elect.seen)
		var last dlock.Leader
		if n > 0 {
			last = w.elect.seen[n-1]
		}
		w.mu.Unlock()
		if n > 0 && last == (dlock.Leader{}) {
			break
		}
		if time.Now().After(deadline) {
			w.mu.Lock()
			w.failf("the lock is free, yet the observer's latest report is %+v (of %d)", last, n)
			w.mu.Unlock()
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	w.elect.cancel()
	select {
	case <-w.elect.done:
	case <-time.After(5 * time.Second):
		w.mu.Lock()
		w.failf("Observe's channel still open 5s after its ctx ended")
		w.mu.Unlock()
	}
	_ = w.elect.oc.c.Close()
	w.mu.Lock()
	w.ops["observed"] = len(w.elect.seen)
	w.mu.Unlock()
}
