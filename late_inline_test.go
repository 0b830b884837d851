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

// checkLateOutcome checks the lease a Lock returned after a late grant
// in line: Lock waited on with a fresh token and obtained the lock. Once
// the late give-back of the spent token has run at Redis, the lease is
// still valid and held there, and another Client cannot take the lock
// while it is. It leaves l held.
func checkLateOutcome(t *testing.T, ctx context.Context, k lateKind, in *faults.Injector, y *dlock.Client, name string, l *dlock.Lease, err error) {
	t.Helper()
	in.WaitLate() // the late copy of the give-back has run at Redis
	if err != nil {
		t.Fatalf("Lock: %v, want it to wait on with a new token and obtain the lock; faults: %s", err, in.Summary())
	}
	if other, err := k.try(y, name)(ctx); err == nil {
		_ = other.Unlock(ctx)
		if l.Context().Err() == nil && time.Now().Before(dlock.Deadline(l)) {
			t.Fatalf("double grant: another Client took %s while the lease Lock returned is valid for %v; faults: %s",
				name, time.Until(dlock.Deadline(l)).Round(time.Millisecond), in.Summary())
		}
		t.Fatalf("the lease Lock returned (fence %d, %s) was freed under it; faults: %s", l.Fence(), dlock.Describe(l), in.Summary())
	}
	if _, err := l.TTL(ctx); err != nil {
		t.Fatalf("the lease Lock returned, after the late give-back: %v; faults: %s", err, in.Summary())
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
// and run late. The token is spent: the call must not fail (it waits until
// its ctx ends), nor try that token again (the late release would free
// it): it waits on with a fresh token and obtains the lock, which the late
// release does not free (checkLateOutcome). Once it unlocks, nothing is
// left at Redis, and another Client takes the lock and keeps it. The
// holder unlocks just before the waiter subscribes (the subscribe hook),
// so that the waiter's first look in line finds it free. In default mode
// a second Lock of the same Client queued behind the first then gets the
// lock (no hang in the local queue).
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
			checkLateOutcome(t, ctx, k, in, y, name, l, err)
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			if second != nil {
				// The call that started over must not leave the queued one behind.
				r := <-second
				if r.err != nil {
					t.Fatalf("the second Lock of the same Client: %v", r.err)
				}
				if err := r.l.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
			}
			waitFor(t, ctx, "nothing of the Lock left at Redis", func() bool { return k.left(ctx, rdb, name) == "" })
			if locals, tokens := dlock.Books(c); locals != 0 || tokens != 0 {
				t.Errorf("left in the Client's books: %d locks, %d tokens in line", locals, tokens)
			}
			other, err := k.try(y, name)(ctx)
			if err != nil {
				t.Fatalf("another Client's TryLock afterwards: %v (left: %q)", err, k.left(ctx, rdb, name))
			}
			time.Sleep(300 * time.Millisecond) // whatever of the spent token is still on its way must not free it
			if _, err := other.TTL(ctx); err != nil {
				t.Fatalf("the other Client's lease was freed under it: %v", err)
			}
			if err := other.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
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
// is held: it keeps its place) but its reply is held back 1.5s; meanwhile
// the holder unlocks and release.lua hands the lock to the waiter. The
// waiter dates a hand-over from that look (min(TTL, 1s) after it was
// sent), so when the reply comes the hand-over's lease is already past its
// validity. Lock must not return it as it is (it returned a lease past its
// deadline): the lock is still the waiter's at Redis (the hand-over set it
// to expire about 3s after), and Lock returns a lease confirmed afresh.
// Nothing is left at Redis afterwards. (Held back until the hand-over has
// expired at Redis: TestLateHandOverStartsOver.)
func TestLateHandOverInLine(t *testing.T) {
	const delay = 1500 * time.Millisecond
	for _, mode := range []string{"fair", "mutex", "semaphore"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel() // each on a server of its own
			var k lateKind
			for _, kk := range lateKinds() {
				if kk.name == mode {
					k = kk
				}
			}
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
			unlocked := make(chan error, 1)
			go func() {
				if !pollUntil(ctx, 10*time.Second, func() bool {
					// It ran at Redis: the waiter is in line.
					return lateFired(in, k.acq) && rdb.LLen(ctx, "dlock:{"+name+"}:q").Val() == 1
				}) {
					unlocked <- errors.New("the delayed look never put the waiter in line")
					return
				}
				unlocked <- holder.Unlock(ctx)
			}()
			l, err := k.lock(c, name)(ctx)
			if uerr := <-unlocked; uerr != nil {
				t.Fatal(uerr)
			}
			if !lateFired(in, k.acq) {
				t.Fatalf("the look in line was not delayed: %s", in.Summary())
			}
			if err != nil {
				t.Fatalf("Lock: %v (want a lease confirmed afresh)", err)
			}
			valid := l.Context().Err() == nil && time.Now().Before(dlock.Deadline(l))
			desc := dlock.Describe(l)
			if !valid {
				_ = l.Unlock(ctx)
				t.Fatalf("Lock returned a lease already past its validity (%s); faults: %s", desc, in.Summary())
			}
			if other, err := k.try(y, name)(ctx); err == nil {
				_ = other.Unlock(ctx)
				t.Fatalf("double grant: another Client took %s under the lease Lock returned (%s)", name, desc)
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
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

// TestLatePassInLine: a holder passes the lock to the next waiter of its
// Client with 80ms of its lease left (above passMargin), and the waiter
// takes the pass only 150ms later (the pass hook holds it up, as a
// stalled process would). The passed lease lives on the passer's deadline
// until its record lands, and the record cannot land after it: Lock must
// not return that lease as obtained once its deadline has passed; the pass
// is given back. Nor may Lock fail for it (it waits until its ctx ends): it
// waits on with a fresh token, and returns a lease of that token, with a
// fence above the pass's, valid at Redis, once the passer's lease is over
// and while no other Client can take the lock. Nothing is left at Redis or
// in the Client's books afterwards.
func TestLatePassInLine(t *testing.T) {
	s := redistest.Start(t)
	o := newObserved(t)
	c, rdb := newClient(t, s, o.opts...)
	cs, _ := newClients(t, s, 1)
	y := cs[0]
	var once sync.Once
	var passTok string
	var passFence uint64
	dlock.SetPassHook(c, func(_, to *dlock.Lease) {
		once.Do(func() {
			passTok, passFence = to.Token(), to.Fence() // before the waiter sees the pass (under the Client's lock)
			time.Sleep(150 * time.Millisecond)
		})
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
	if r.err != nil {
		t.Fatalf("Lock: %v, want it to wait on with a new token and obtain the lock; the passer's Unlock: %v", r.err, uerr)
	}
	l := r.l
	desc := dlock.Describe(l)
	switch {
	case passTok == "":
		t.Fatalf("no pass was made (%s)", desc)
	case holder.Context().Err() == nil && time.Now().Before(dlock.Deadline(holder)):
		t.Fatalf("double grant: Lock returned (%s) while the passer's lease is valid (%s)", desc, dlock.Describe(holder))
	case l.Token() == passTok:
		t.Fatalf("Lock returned the late pass's lease, or one of its spent token (%s); the passer's Unlock: %v", desc, uerr)
	case l.Fence() <= passFence:
		t.Fatalf("fence %d, want above the pass's %d", l.Fence(), passFence)
	}
	if other, err := y.Mutex(name).TryLock(ctx); err == nil {
		_ = other.Unlock(ctx)
		if l.Context().Err() == nil && time.Now().Before(dlock.Deadline(l)) {
			t.Fatalf("double grant: another Client took %s under the lease Lock returned (%s)", name, desc)
		}
	}
	_ = l.Unlock(ctx) // it may have run out already: 400ms, not renewed
	k := lateKinds()[0]
	waitFor(t, ctx, "nothing left at Redis", func() bool { return k.left(ctx, rdb, name) == "" })
	if locals, tokens := dlock.Books(c); locals != 0 || tokens != 0 {
		t.Errorf("left in the Client's books: %d locks, %d tokens in line", locals, tokens)
	}
	l, err = y.Mutex(name).TryLock(ctx)
	if err != nil {
		t.Fatalf("another Client's TryLock afterwards: %v", err)
	}
	_ = l.Unlock(ctx)
	o.want("dlock.acquire.duration", 2) // c's two Locks
	o.want("dlock.waiters", 0)
	o.waitValue(ctx, "dlock.leases.held", 0)
}
