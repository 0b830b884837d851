package dlock_test

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faults"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// startOverKinds are the primitives whose Lock waits in the line at Redis
// and can be handed the lock there: lateKinds' mutex (default mode), fair
// Mutex, Semaphore and RWMutex (its Lock), and the RWMutex's RLock behind
// a writer.
func startOverKinds() []lateKind {
	var out []lateKind
	for _, k := range lateKinds() {
		switch k.name {
		case "mutex", "fair", "semaphore":
			out = append(out, k)
		case "rwmutex":
			out = append(out, k)
			r := k
			r.name = "rwmutex-read"
			r.lock = func(c *dlock.Client, n string) func(context.Context) (*dlock.Lease, error) {
				return c.RWMutex(n, dlock.TTL(lateTTL)).RLock
			}
			out = append(out, r) // held by a writer (k.lock), tried by one (k.try)
		}
	}
	return out
}

// pollUntil polls cond every 5ms until it holds (true), d passes or ctx
// ends (false). Unlike waitFor it may run on any goroutine.
func pollUntil(ctx context.Context, d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return false
		}
		time.Sleep(5 * time.Millisecond)
	}
	return true
}

// handedTo reports whether the lock name is token's at Redis, as a
// hand-over makes it: a mutex's owner, a semaphore's (an RWMutex's)
// holder.
func handedTo(ctx context.Context, rdb redis.Cmdable, k lateKind, name, token string) bool {
	key := "dlock:{" + name + "}"
	if k.acq == "sem.a" {
		return rdb.HExists(ctx, key, "h:"+token).Val()
	}
	return rdb.HGet(ctx, key, "o").Val() == token
}

// TestLateHandOverStartsOver: a waiter's look in line runs at Redis (the
// lock is held: it keeps its place) but its reply is held back 3.8s;
// meanwhile the holder unlocks and the release hands the lock to the
// waiter's token. The hand-over, dated from that look, is heard past its
// validity, and by then it has expired at Redis and another Client (y)
// took the lock: the confirming extension fails and the grant is given
// back. Lock must not fail for that (it waits until its ctx ends): it
// waits on with a fresh token, back in the line at Redis (y unlocks only
// once the new token is there), and returns a lease of that token, with a
// fence above the late hand-over's and y's, valid at Redis, once y has
// let go, and not while y holds. Nothing is left in line or in the
// Client's books afterwards, and the metrics of the one call balance: one
// acquire duration, no waiter left.
func TestLateHandOverStartsOver(t *testing.T) {
	const delay = 3800 * time.Millisecond
	for _, k := range startOverKinds() {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel() // each on a server of its own, mostly waiting out a hand-over's expiry
			s := redistest.Start(t)
			o := newObserved(t)
			c, in := reviewClient(t, s, 5*time.Second, o.opts,
				faults.Rule{Script: k.acq, Kind: faults.DelayReply, Calls: []int{2}, Min: delay, Max: delay})
			cs, rdb := newClients(t, s, 2)
			x, y := cs[0], cs[1]
			ctx := ctxT(t, 40*time.Second)
			name := "latestart-" + k.name
			key := "dlock:{" + name + "}"
			hold := k.lock
			if k.name == "rwmutex-read" {
				hold = func(c *dlock.Client, n string) func(context.Context) (*dlock.Lease, error) {
					return c.RWMutex(n, dlock.TTL(lateTTL)).Lock // a writer
				}
			}
			holder, err := hold(x, name)(ctx)
			if err != nil {
				t.Fatal(err)
			}
			type seen struct {
				old    string // the waiter's token handed the lock
				handed uint64 // the late hand-over's fence
				other  uint64 // y's fence
				err    string
			}
			var yHolds atomic.Bool
			done := make(chan seen, 1)
			go func() {
				var v seen
				defer func() { done <- v }()
				if !pollUntil(ctx, 10*time.Second, func() bool { return lateFired(in, k.acq) && rdb.LLen(ctx, key+":q").Val() == 1 }) {
					v.err = "the delayed look never put the waiter in line"
					return
				}
				v.old = rdb.LIndex(ctx, key+":q", 0).Val()
				if err := holder.Unlock(ctx); err != nil {
					v.err = "the holder's Unlock: " + err.Error()
					return
				}
				if !handedTo(ctx, rdb, k, name, v.old) {
					v.err = "the release did not hand the lock to the waiter's token"
					return
				}
				v.handed, _ = strconv.ParseUint(rdb.HGet(ctx, key, "f").Val(), 10, 64)
				var other *dlock.Lease
				if !pollUntil(ctx, 10*time.Second, func() bool {
					l, err := k.try(y, name)(ctx)
					if err != nil {
						return false
					}
					other = l
					yHolds.Store(true)
					return true
				}) {
					v.err = "y never took the lock once the hand-over expired"
					return
				}
				v.other = other.Fence()
				// y keeps it until the waiter waits in line again, with a new token.
				if !pollUntil(ctx, 10*time.Second, func() bool {
					q := rdb.LRange(ctx, key+":q", 0, -1).Val()
					return len(q) == 1 && q[0] != v.old
				}) {
					v.err = "the waiter never joined the line again with a new token: " + in.Summary()
				}
				yHolds.Store(false)
				if err := other.Unlock(ctx); err != nil {
					v.err = "y's Unlock: " + err.Error()
				}
			}()
			l, err := k.lock(c, name)(ctx)
			overlap := yHolds.Load()
			v := <-done
			if v.err != "" {
				if err == nil {
					_ = l.Unlock(ctx)
				}
				t.Fatalf("%s (Lock: %v)", v.err, err)
			}
			if !lateFired(in, k.acq) {
				t.Fatalf("the look in line was not delayed: %s", in.Summary())
			}
			if err != nil {
				t.Fatalf("Lock: %v, want it to wait on with a new token and obtain the lock; faults: %s", err, in.Summary())
			}
			desc := dlock.Describe(l)
			switch {
			case overlap:
				t.Fatalf("double grant: Lock returned (%s) while y still held the lock (fence %d)", desc, v.other)
			case l.Token() == v.old:
				t.Fatalf("Lock returned a lease of the spent token %s (%s)", v.old, desc)
			case l.Fence() <= v.handed || l.Fence() <= v.other:
				t.Fatalf("fence %d, want above the late hand-over's %d and y's %d", l.Fence(), v.handed, v.other)
			case l.Context().Err() != nil || !time.Now().Before(dlock.Deadline(l)):
				t.Fatalf("Lock returned a lease already ended (%s)", desc)
			}
			if _, err := l.TTL(ctx); err != nil {
				t.Fatalf("the lease at Redis: %v (%s)", err, desc)
			}
			if other, err := k.try(y, name)(ctx); err == nil {
				_ = other.Unlock(ctx)
				t.Fatalf("double grant: y took %s under the lease Lock returned (%s)", name, desc)
			} else if !errors.Is(err, dlock.ErrNotObtained) {
				t.Fatal(err)
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			waitFor(t, ctx, "nothing left at Redis", func() bool { return k.left(ctx, rdb, name) == "" })
			if locals, tokens := dlock.Books(c); locals != 0 || tokens != 0 {
				t.Errorf("left in the Client's books: %d locks, %d tokens in line", locals, tokens)
			}
			o.want("dlock.acquire.duration", 1)
			o.want("dlock.waiters", 0)
			o.waitValue(ctx, "dlock.leases.held", 0)
		})
	}
}
