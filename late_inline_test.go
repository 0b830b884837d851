package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faults"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// lateTTL, lateDelay: a grant's reply held back to 3.97s of a 4s TTL comes
// past validUntil (3.96s) while the key still lives at Redis.
const lateTTL, lateDelay = 4 * time.Second, 3970 * time.Millisecond

// lateKind is one primitive for the late-grant tests: how it locks, which
// scripts its acquire and its give-back's release are, and what of it is
// left at Redis.
type lateKind struct {
	name       string
	acq, give  string // script names (faults.EngineScripts)
	lock, try  func(c *dlock.Client, name string) func(context.Context) (*dlock.Lease, error)
	left       func(ctx context.Context, rdb redis.Cmdable, name string) string
	stringLock bool
}

func lateKinds() []lateKind {
	opts := []dlock.LockOption{dlock.TTL(lateTTL)}
	mutexLeft := func(ctx context.Context, rdb redis.Cmdable, name string) string {
		k := "dlock:{" + name + "}"
		var out []string
		if o := rdb.HGet(ctx, k, "o").Val(); o != "" {
			out = append(out, "owner "+o)
		}
		if n := rdb.LLen(ctx, k+":q").Val(); n > 0 {
			out = append(out, fmt.Sprintf("%d in line", n))
		}
		if n := rdb.HLen(ctx, k+":w").Val(); n > 0 {
			out = append(out, fmt.Sprintf("%d waiters", n))
		}
		return strings.Join(out, ", ")
	}
	semLeft := func(ctx context.Context, rdb redis.Cmdable, name string) string {
		k := "dlock:{" + name + "}"
		out := mutexLeft(ctx, rdb, name)
		if n := rdb.ZCard(ctx, k+":h").Val(); n > 0 {
			out += fmt.Sprintf(" %d holders", n)
		}
		return strings.TrimSpace(out)
	}
	return []lateKind{
		{name: "mutex", acq: "acquire", give: "release", left: mutexLeft,
			lock: func(c *dlock.Client, n string) func(context.Context) (*dlock.Lease, error) {
				return c.Mutex(n, opts...).Lock
			},
			try: func(c *dlock.Client, n string) func(context.Context) (*dlock.Lease, error) {
				return c.Mutex(n, opts...).TryLock
			}},
		{name: "fair", acq: "fair_acquire", give: "release", left: mutexLeft,
			lock: func(c *dlock.Client, n string) func(context.Context) (*dlock.Lease, error) {
				return c.Mutex(n, append(opts, dlock.Fair())...).Lock
			},
			try: func(c *dlock.Client, n string) func(context.Context) (*dlock.Lease, error) {
				return c.Mutex(n, append(opts, dlock.Fair())...).TryLock
			}},
		{name: "semaphore", acq: "sem.a", give: "sem.l", left: semLeft,
			lock: func(c *dlock.Client, n string) func(context.Context) (*dlock.Lease, error) {
				s := c.Semaphore(n, 1, opts...)
				return func(ctx context.Context) (*dlock.Lease, error) { return s.Acquire(ctx, 1) }
			},
			try: func(c *dlock.Client, n string) func(context.Context) (*dlock.Lease, error) {
				s := c.Semaphore(n, 1, opts...)
				return func(ctx context.Context) (*dlock.Lease, error) { return s.TryAcquire(ctx, 1) }
			}},
		{name: "rwmutex", acq: "sem.a", give: "sem.l", left: semLeft,
			lock: func(c *dlock.Client, n string) func(context.Context) (*dlock.Lease, error) {
				return c.RWMutex(n, opts...).Lock
			},
			try: func(c *dlock.Client, n string) func(context.Context) (*dlock.Lease, error) {
				return c.RWMutex(n, opts...).TryLock
			}},
		{name: "string", acq: "str_acquire", give: "str_release", stringLock: true,
			left: func(ctx context.Context, rdb redis.Cmdable, name string) string {
				if v := rdb.Get(ctx, name).Val(); v != "" {
					return "held by " + v
				}
				return ""
			},
			lock: func(c *dlock.Client, n string) func(context.Context) (*dlock.Lease, error) {
				return c.StringMutex(n, opts...).Lock
			},
			try: func(c *dlock.Client, n string) func(context.Context) (*dlock.Lease, error) {
				return c.StringMutex(n, opts...).TryLock
			}},
	}
}

// checkLateOutcome checks what a late grant's Lock left: it failed with
// ErrNotObtained (a lease it returned instead must at least not be shared
// with another Client: that is reported first, as a double grant); once
// the late give-back ran, nothing of the failed call is left at Redis, and
// another Client takes the lock and keeps it.
func checkLateOutcome(t *testing.T, ctx context.Context, k lateKind, in *faults.Injector, rdb redis.Cmdable, y *dlock.Client, name string, l *dlock.Lease, err error) {
	t.Helper()
	in.WaitLate() // the late copy of the give-back has run at Redis
	if err == nil {
		if other, err := k.try(y, name)(ctx); err == nil && l.Context().Err() == nil && time.Now().Before(dlock.Deadline(l)) {
			_ = other.Unlock(ctx)
			t.Fatalf("double grant: another Client took %s while the lease Lock returned is valid for %v; faults: %s",
				name, time.Until(dlock.Deadline(l)).Round(time.Millisecond), in.Summary())
		}
		t.Fatalf("Lock returned a lease (fence %d, %s) for a token whose grant it gave back; faults: %s",
			l.Fence(), dlock.Describe(l), in.Summary())
	}
	if !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("Lock: %v, want ErrNotObtained; faults: %s", err, in.Summary())
	}
	waitFor(t, ctx, "nothing of the failed Lock left at Redis", func() bool { return k.left(ctx, rdb, name) == "" })
	other, err := k.try(y, name)(ctx)
	if err != nil {
		t.Fatalf("another Client's TryLock after the failed Lock: %v (left: %q)", err, k.left(ctx, rdb, name))
	}
	// Whatever of the failed Lock is still on its way must not free it.
	time.Sleep(300 * time.Millisecond)
	if _, err := other.TTL(ctx); err != nil {
		t.Fatalf("the other Client's lease was freed under it: %v", err)
	}
	if err := other.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// lateClient is a Client on s whose acquire call number call of kind k
// is replied past the lease's validity, and whose first give-back is run
// late as well, 400ms on (faults.RunLate).
func lateClient(t *testing.T, s *redistest.Server, k lateKind, call int) (*dlock.Client, *faults.Injector) {
	t.Helper()
	return reviewClient(t, s, 5*time.Second, nil,
		faults.Rule{Script: k.acq, Kind: faults.DelayReply, Calls: []int{call}, Min: lateDelay, Max: lateDelay},
		faults.Rule{Script: k.give, Kind: faults.RunLate, Calls: []int{1}, Min: 400 * time.Millisecond, Max: 400 * time.Millisecond})
}

// TestLateGrantInLine: a Lock that waits in line (its first look found the
// lock held) is granted by a look of its own whose reply comes past the
// lease's validity, and the release of its give-back is answered to nobody
// and run late. Its token is in the line and in its Client's books, so it
// cannot take a fresh one: the call fails with ErrNotObtained, leaves no
// place in line and nothing held, and another Client then takes the lock
// and keeps it. The holder unlocks just before the waiter subscribes (the
// subscribe hook), so that the waiter's first look in line finds it free.
// In default mode a second Lock of the same Client queued behind the
// failed one then gets the lock (no hang in the local queue).
func TestLateGrantInLine(t *testing.T) {
	for _, k := range lateKinds() {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel() // each on a server of its own, mostly waiting out a TTL
			s := redistest.Start(t)
			c, in := lateClient(t, s, k, 2)
			cs, rdb := newClients(t, s, 2)
			x, y := cs[0], cs[1]
			ctx := ctxT(t, 40*time.Second)
			name := "lateline-" + k.name
			holder, err := k.lock(x, name)(ctx)
			if err != nil {
				t.Fatal(err)
			}
			var once sync.Once
			dlock.SetSubscribeHook(c, func() {
				once.Do(func() {
					if err := holder.Unlock(ctx); err != nil {
						t.Error(err)
					}
				})
			})
			var second <-chan result
			if k.name == "mutex" || k.stringLock {
				// A second Lock of c, queued behind the first (it makes no
				// look of its own while one of c's waits).
				second = goLock(ctx, func(ctx context.Context) (*dlock.Lease, error) {
					waitFor(t, ctx, "the delayed look", func() bool { return lateFired(in, k.acq) })
					return k.lock(c, name)(ctx)
				})
			}
			l, err := k.lock(c, name)(ctx)
			if !lateFired(in, k.acq) {
				t.Fatalf("the look in line was not delayed: %s", in.Summary())
			}
			if second != nil {
				// The failed call must not leave the queued one behind.
				r := <-second
				if r.err != nil {
					t.Fatalf("the second Lock of the same Client: %v", r.err)
				}
				if err := r.l.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
			}
			checkLateOutcome(t, ctx, k, in, rdb, y, name, l, err)
		})
	}
}

// TestLateGrantFirstLookKinds: the first look's late grant, as in
// TestLateGrantGiveBackInDoubt, for every primitive: Lock goes on with a
// fresh token, so the late release of the old one does not free the lease
// it returns (another Client cannot take the lock while it is valid).
func TestLateGrantFirstLookKinds(t *testing.T) {
	for _, k := range lateKinds() {
		t.Run(k.name, func(t *testing.T) {
			t.Parallel() // each on a server of its own, mostly waiting out a TTL
			s := redistest.Start(t)
			c, in := lateClient(t, s, k, 1)
			cs, rdb := newClients(t, s, 1)
			y := cs[0]
			ctx := ctxT(t, 30*time.Second)
			name := "latefirst-" + k.name
			l, err := k.lock(c, name)(ctx)
			if err != nil {
				t.Fatalf("Lock: %v (faults: %s)", err, in.Summary())
			}
			if !lateFired(in, k.acq) {
				t.Fatalf("the first look was not delayed: %s", in.Summary())
			}
			in.WaitLate()
			if other, err := k.try(y, name)(ctx); err == nil {
				_ = other.Unlock(ctx)
				if l.Context().Err() == nil && time.Now().Before(dlock.Deadline(l)) {
					t.Fatalf("double grant: another Client took %s while the lease is valid for %v; faults: %s",
						name, time.Until(dlock.Deadline(l)).Round(time.Millisecond), in.Summary())
				}
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			waitFor(t, ctx, "nothing left at Redis", func() bool { return k.left(ctx, rdb, name) == "" })
		})
	}
}

// TestMultiLockLateGrant: a MultiLock's grant whose reply comes past its
// validity, on each of its paths: the group acquire of its first look
// (multi_acquire), the first look of its wait for a part that blocked (the
// part's acquire, with the take's token), and that wait's look in line.
// The token is the take's, shared with its other parts, and spent: Lock
// gives back what it held and starts over with a new token, and the late
// release of the spent one frees none of the names it then holds.
func TestMultiLockLateGrant(t *testing.T) {
	for _, path := range []string{"group", "wait-first-look", "wait-in-line"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel() // each on a server of its own, mostly waiting out a TTL
			s := redistest.Start(t)
			var rules []faults.Rule
			switch path {
			case "group":
				rules = []faults.Rule{{Script: "multi_acquire", Kind: faults.DelayReply, Calls: []int{1}, Min: lateDelay, Max: lateDelay}}
			case "wait-first-look":
				rules = []faults.Rule{
					// Refused at b, replied late enough for the holder to go.
					{Script: "multi_acquire", Kind: faults.DelayReply, Calls: []int{1}, Min: 300 * time.Millisecond, Max: 300 * time.Millisecond},
					{Script: "acquire", Kind: faults.DelayReply, Calls: []int{1}, Min: lateDelay, Max: lateDelay}}
			case "wait-in-line":
				rules = []faults.Rule{{Script: "acquire", Kind: faults.DelayReply, Calls: []int{2}, Min: lateDelay, Max: lateDelay}}
			}
			rules = append(rules, faults.Rule{Script: "release", Kind: faults.RunLate, Calls: []int{1}, Min: 400 * time.Millisecond, Max: 400 * time.Millisecond})
			c, in := reviewClient(t, s, 5*time.Second, nil, rules...)
			cs, rdb := newClients(t, s, 2)
			x, y := cs[0], cs[1]
			ctx := ctxT(t, 40*time.Second)
			a, b := "mlate-a-"+path, "mlate-b-"+path
			var holder *dlock.Lease
			if path != "group" {
				var err error
				if holder, err = x.Mutex(b, dlock.TTL(lateTTL)).Lock(ctx); err != nil {
					t.Fatal(err)
				}
			}
			switch path {
			case "wait-first-look":
				// The group acquire is c's first script call, and the
				// holder's first renewal is a third of its 4 s TTL away: the
				// next EVALSHA the server runs is that acquire.
				ran := evalshaCalls(t, ctx, rdb)
				go func() {
					// It has run at Redis (refused at b); its reply is held
					// back. Waited for, not slept on: a holder gone before it
					// ran would let it take both names.
					waitFor(t, ctx, "the group acquire run at Redis", func() bool {
						return lateFired(in, "multi_acquire") && evalshaCalls(t, ctx, rdb) > ran
					})
					if err := holder.Unlock(ctx); err != nil {
						t.Error(err)
					}
				}()
			case "wait-in-line":
				var once sync.Once
				dlock.SetSubscribeHook(c, func() {
					once.Do(func() {
						if err := holder.Unlock(ctx); err != nil {
							t.Error(err)
						}
					})
				})
			}
			l, err := c.MultiLock([]string{a, b}, dlock.TTL(lateTTL)).Lock(ctx)
			want := "acquire"
			if path == "group" {
				want = "multi_acquire"
			}
			if !lateFired(in, want) {
				t.Fatalf("the %s was not delayed: %s", want, in.Summary())
			}
			in.WaitLate() // the late copy of the give-back has run at Redis
			if err != nil {
				t.Fatalf("MultiLock.Lock: %v, want a lease taken afresh with a new token; faults: %s", err, in.Summary())
			}
			// The late release of the spent token must not have freed the
			// new take's names: another Client cannot take one while the
			// lease is valid, and the lease still holds them after it.
			for _, n := range []string{a, b} {
				part := dlock.PartOf(l, n)
				if other, err := y.Mutex(n, dlock.TTL(lateTTL)).TryLock(ctx); err == nil {
					_ = other.Unlock(ctx)
					if part.Context().Err() == nil && time.Now().Before(dlock.Deadline(part)) {
						t.Fatalf("double grant: another Client took %s while the MultiLock lease's part is valid for %v; faults: %s",
							n, time.Until(dlock.Deadline(part)).Round(time.Millisecond), in.Summary())
					}
					t.Fatalf("the MultiLock lease's part %s was freed under it (%s); faults: %s", n, dlock.Describe(part), in.Summary())
				}
			}
			if _, err := l.TTL(ctx); err != nil {
				t.Fatalf("the MultiLock lease after the late release: %v; faults: %s", err, in.Summary())
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			k := lateKinds()[0]
			for _, n := range []string{a, b} {
				waitFor(t, ctx, "nothing of "+n+" left at Redis", func() bool { return k.left(ctx, rdb, n) == "" })
			}
		})
	}
}

// lateFired reports whether a delayed reply of script was injected.
func lateFired(in *faults.Injector, script string) bool {
	for k, n := range in.Stats() {
		if n > 0 && strings.HasPrefix(k, script+" delay-reply") {
			return true
		}
	}
	return false
}

type result struct {
	l   *dlock.Lease
	err error
}

// goLock runs lock in the background and sends its outcome.
func goLock(ctx context.Context, lock func(context.Context) (*dlock.Lease, error)) <-chan result {
	out := make(chan result, 1)
	go func() {
		l, err := lock(ctx)
		out <- result{l, err}
	}()
	return out
}

// TestLateHandOverInLine: a waiter's look in line runs at Redis (the lock
// is held: it keeps its place) but its reply is held back; meanwhile the
// holder unlocks and release.lua hands the lock to the waiter. The waiter
// dates a hand-over from that look (min(TTL, 1s) after it was sent), so
// when the reply comes the hand-over's lease is already past its validity.
// Lock must not return it as it is (it returned a lease past its
// deadline): held back 1.5s, the lock is still the waiter's at Redis (the
// hand-over set it to expire about 3s after), and Lock returns a lease
// confirmed afresh; held back 3.5s, the hand-over has expired at Redis and
// another Client took the lock meanwhile: Lock fails with ErrNotObtained.
// Either way nothing is left at Redis, and no two leases are valid at once.
func TestLateHandOverInLine(t *testing.T) {
	for _, mode := range []string{"fair", "mutex", "semaphore"} {
		for _, delay := range []time.Duration{1500 * time.Millisecond, 3500 * time.Millisecond} {
			t.Run(fmt.Sprintf("%s/%v", mode, delay), func(t *testing.T) {
				t.Parallel() // each on a server of its own, mostly waiting out a TTL
				var k lateKind
				for _, kk := range lateKinds() {
					if kk.name == mode {
						k = kk
					}
				}
				expired := delay > 3*time.Second
				s := redistest.Start(t)
				c, in := reviewClient(t, s, 5*time.Second, nil,
					faults.Rule{Script: k.acq, Kind: faults.DelayReply, Calls: []int{2}, Min: delay, Max: delay})
				cs, rdb := newClients(t, s, 2)
				x, y := cs[0], cs[1]
				ctx := ctxT(t, 30*time.Second)
				name := "latehandover-" + mode
				holder, err := k.lock(x, name)(ctx)
				if err != nil {
					t.Fatal(err)
				}
				returned := make(chan struct{})
				took := make(chan *dlock.Lease, 1)
				go func() {
					defer close(took)
					waitFor(t, ctx, "the delayed look", func() bool { return lateFired(in, k.acq) })
					waitLine(t, ctx, rdb, "dlock:{"+name+"}", 1) // it ran at Redis: the waiter is in line
					if err := holder.Unlock(ctx); err != nil {
						t.Error(err)
					}
					for expired {
						// Another Client takes the lock once the hand-over expires.
						if l, err := k.try(y, name)(ctx); err == nil {
							took <- l
							return
						}
						select {
						case <-returned:
							return
						case <-time.After(20 * time.Millisecond):
						}
					}
				}()
				l, err := k.lock(c, name)(ctx)
				close(returned)
				if !lateFired(in, k.acq) {
					t.Fatalf("the look in line was not delayed: %s", in.Summary())
				}
				other := <-took
				if expired && other == nil {
					t.Fatal("the other Client never took the lock")
				}
				if err == nil {
					valid := l.Context().Err() == nil && time.Now().Before(dlock.Deadline(l))
					desc := dlock.Describe(l)
					_ = l.Unlock(ctx)
					switch {
					case other != nil && valid:
						t.Fatalf("double grant: Lock returned a valid lease (%s) while another Client holds %s; faults: %s", desc, name, in.Summary())
					case !valid:
						t.Fatalf("Lock returned a lease already past its validity (%s); faults: %s", desc, in.Summary())
					case expired:
						t.Fatalf("Lock returned a lease (%s) for a hand-over that expired at Redis", desc)
					}
				} else if expired && errors.Is(err, dlock.ErrNotObtained) {
					t.Logf("Lock: %v", err)
				} else {
					t.Fatalf("Lock: %v (want a lease confirmed afresh)", err)
				}
				if other != nil {
					if _, err := other.TTL(ctx); err != nil {
						t.Fatalf("the other Client's lease: %v", err)
					}
					if err := other.Unlock(ctx); err != nil {
						t.Fatal(err)
					}
				}
				waitFor(t, ctx, "nothing left at Redis", func() bool { return k.left(ctx, rdb, name) == "" })
				if l, err := k.try(y, name)(ctx); err != nil {
					t.Fatalf("another Client's TryLock afterwards: %v", err)
				} else {
					_ = l.Unlock(ctx)
				}
			})
		}
	}
}

// TestLatePassInLine: a holder passes the lock to the next waiter of its
// Client with 80ms of its lease left (above passMargin), and the waiter
// takes the pass only 150ms later (the pass hook holds it up, as a
// stalled process would). The passed lease lives on the passer's deadline
// until its record lands, and the record cannot land after it: Lock must
// not return that lease as obtained once its deadline has passed; the pass
// is given back and nothing is left at Redis.
func TestLatePassInLine(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s)
	cs, _ := newClients(t, s, 1)
	y := cs[0]
	var once sync.Once
	dlock.SetPassHook(c, func(_, _ *dlock.Lease) {
		once.Do(func() { time.Sleep(150 * time.Millisecond) })
	})
	ctx := ctxT(t, 20*time.Second)
	const name = "latepass"
	m := c.Mutex(name, dlock.TTL(400*time.Millisecond), dlock.NoRenew())
	// A pass needs a holder that waited (it has a turn): y holds, c's
	// first Lock waits in line and is handed the lock; c's second waits
	// behind it.
	first, err := y.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	a := goLock(ctx, m.Lock)
	waitLine(t, ctx, rdb, "dlock:{"+name+"}", 1)
	got := goLock(ctx, m.Lock)
	waitFor(t, ctx, "two queued", func() bool { n, _ := dlock.QueuedLocally(c, name); return n == 2 })
	if err := first.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	ra := <-a
	if ra.err != nil {
		t.Fatal(ra.err)
	}
	holder := ra.l
	waitFor(t, ctx, "the waiter asleep", func() bool { n, asleep := dlock.QueuedLocally(c, name); return n == 1 && asleep })
	time.Sleep(time.Until(dlock.Deadline(holder).Add(-80 * time.Millisecond)))
	uerr := holder.Unlock(ctx)
	r := <-got
	if r.err == nil {
		valid := r.l.Context().Err() == nil && time.Now().Before(dlock.Deadline(r.l))
		desc := dlock.Describe(r.l)
		_ = r.l.Unlock(ctx)
		if !valid {
			t.Fatalf("Lock returned a passed lease already past its validity (%s); the passer's Unlock: %v", desc, uerr)
		}
		t.Logf("Lock obtained a valid lease (%s)", desc)
	} else {
		t.Logf("Lock: %v; the passer's Unlock: %v", r.err, uerr)
	}
	k := lateKinds()[0]
	waitFor(t, ctx, "nothing left at Redis", func() bool { return k.left(ctx, rdb, name) == "" })
	l, err := y.Mutex(name).TryLock(ctx)
	if err != nil {
		t.Fatalf("another Client's TryLock afterwards: %v", err)
	}
	_ = l.Unlock(ctx)
}
