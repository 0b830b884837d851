package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faultproxy"
	"github.com/dlock-go/dlock/internal/faults"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/wire"
	"github.com/redis/go-redis/v9"
)

// TestInterleavings explores the interleavings of every call on one lock
// name, per primitive (Mutex, Mutex with Fair, RWMutex, Semaphore): several
// Clients in one process, each with a few goroutines that Lock, TryLock, Do,
// re-enter, Extend, ask the TTL and Unlock (with an ended ctx, twice at once,
// with a ctx that ends meanwhile, alongside an Extend), while Clients are
// closed and replaced, the server is paused, subscription connections are
// killed, and every script call and subscription gets seeded faults
// (internal/faults: delays before sending and of the reply, replies lost
// after Redis ran the command, sends that fail, cut connections; SSUBSCRIBEs
// confirmed late, refused, or followed by a drop, and server-side
// unsubscribes).
//
// A lease counts as believed valid from the return of the call that granted
// it until its holder calls Unlock or sees its context ended. Each check
// looks at every lease granted and not yet given up, and asks its context:
// two that both say valid were valid at one instant (validity only ever
// ends, and each was granted before the check began). At every grant and
// before every Unlock it checks that
//   - at most one mutex lease is valid (one writer and no reader, for an
//     RWMutex); the permits of the valid semaphore leases fit the size;
//   - a mutex lease (an RWMutex writer) that is valid when granted has a
//     fence above every lease found valid before it (a reader: above every
//     writer's); a semaphore never grants one fence twice;
//
// and, after every caller has returned, that the lock is free at Redis
// within one TTL (no holding left renewed or counted), and that no call
// hung: every call with a bounded ctx (Lock, TryLock, Extend, TTL, a
// reentrant Lock, Unlock) returns within 3s of its ctx's end. Porcupine is not needed here: the property is checked directly on
// the intervals (TestMutualExclusionAcrossProcesses checks a history of
// fenced writes with it).
//
// A short run with a fresh seed is part of every test run; DLOCK_SEED
// replays one, DLOCK_CHAOS sets the duration of each run (default 3s) and
// DLOCK_CHAOS_ROUNDS the number of seeds per primitive (make chaos). A
// failure prints the command that replays it; with DLOCK_EVENTS=1 it also
// prints every fault injected, on the run's clock, with the tokens they
// concern (leases are printed with theirs).
func TestInterleavings(t *testing.T) { interleavings(t, "TestInterleavings", false) }

// TestInterleavingsReplicaAck is TestInterleavings on a primary with one
// replica, every Client made WithReplicaAck(1, ...), the replica stopped
// for a while now and then as well: besides every check of
// TestInterleavings, every lease believed valid must be held on the
// replica too, and calls fail with ErrNotReplicated rather than grant what
// the replica has not confirmed.
func TestInterleavingsReplicaAck(t *testing.T) {
	interleavings(t, "TestInterleavingsReplicaAck", true)
}

// interleavings runs the interleaving test named test, on topology R with
// replica acknowledgement if ack.
func interleavings(t *testing.T, test string, ack bool) {
	dur := 3 * time.Second
	if v := os.Getenv("DLOCK_CHAOS"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("DLOCK_CHAOS=%q: want a positive duration", v)
		}
		dur = d
	}
	rounds := envRounds(t, "DLOCK_CHAOS_ROUNDS", 1)
	fixed, replay := envSeed(t)
	if replay {
		rounds = 1
	}
	for _, kind := range []string{"mutex", "fair", "rw", "sem"} {
		t.Run(kind, func(t *testing.T) {
			for range rounds {
				seed := fixed
				if !replay {
					seed = rand.Uint64N(1 << 40)
				}
				t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
					w := newInterleaving(t, kind, seed, dur, ack)
					defer func() {
						if t.Failed() {
							t.Logf("replay: DLOCK_SEED=%d DLOCK_CHAOS=%v go test -race -count=1 -run '%s/%s/seed=%d$' .", seed, dur, test, kind, seed)
						}
					}()
					w.run()
				})
			}
		})
	}
}

// ilReplicaWait is how long grants wait for the replica's confirmation.
const ilReplicaWait = 100 * time.Millisecond

// interleaving is one run: one lock name, one server, its Clients and what
// the run has seen.
type interleaving struct {
	t     *testing.T
	kind  string
	seed  uint64
	dur   time.Duration
	name  string
	size  int64 // sem: permits in all
	s     *redistest.Server
	plain *redis.Client
	epoch time.Time
	// With replica acknowledgement: s's replica, a client of it, and the
	// proxy its replication link goes through.
	replica      *redistest.Server
	replicaPlain *redis.Client
	link         *faultproxy.Proxy
	prof         ilProfile

	slots  []atomic.Pointer[ilClient] // the Clients the workers use, replaced as they close
	gen    atomic.Int64               // Clients made so far
	maxTTL time.Duration              // the longest TTL any call asked for

	mu       sync.Mutex
	held     map[*ilLease]struct{} // granted, not yet given up by its holder
	maxFence uint64                // mutex: of every lease seen valid; rw: of every writer's
	maxAll   uint64                // rw: of every lease seen valid
	fences   map[uint64]bool       // sem: fences granted
	grants   int
	checks   int
	ops      map[string]int
	fails    []string
	clients  []*ilClient // every Client made
}

// ilClient is one dlock Client with its own go-redis client and faults.
type ilClient struct {
	gen int64
	c   *dlock.Client
	in  *faults.Injector
}

// ilLease is one grant as its holder sees it.
type ilLease struct {
	l       *dlock.Lease
	ic      *ilClient
	client  int64
	fence   uint64
	permits int64
	writer  bool
	at      time.Duration
	via     string
	gaveUp  bool // its holder called Unlock (or saw it end)
}

// ilProfile is what one run stresses, drawn from its seed (swarm testing):
// a defect that needs several things at once (a lost reply on one script, a
// lease without renewal, a long hold) is found by the runs that weigh them
// all, which a single mix would rarely do.
type ilProfile struct {
	noRenew float64       // chance that a lock call asks NoRenew
	long    float64       // chance that a hold lasts up to longMax
	longMax time.Duration // a long hold's bound
	extend  float64       // chance that a holder extends
	faults  float64       // multiplies every script fault's chance
	passes  float64       // chance of a fault on each pass record and extension
	subs    float64       // multiplies every subscription fault's chance
	chaos   time.Duration // mean time between closes, pauses and kills
}

func drawProfile(seed uint64) ilProfile {
	r := rand.New(rand.NewPCG(seed, 7))
	pick := func(low, high float64) float64 { return [2]float64{low, high}[r.IntN(2)] }
	return ilProfile{
		noRenew: pick(0.1, 0.6),
		long:    pick(0.05, 0.3),
		longMax: time.Duration(pick(400, 1000)) * time.Millisecond,
		extend:  pick(0.1, 0.4),
		faults:  pick(0.5, 2),
		passes:  pick(0.05, 0.3),
		subs:    pick(0, 2),
		chaos:   time.Duration(pick(300, 2000)) * time.Millisecond,
	}
}

// override sets the fields named in spec ("passes=0.3,long=0.3", from
// DLOCK_CHAOS_PROFILE), to aim runs at one mix.
func (p *ilProfile) override(t *testing.T, spec string) {
	for _, kv := range strings.Split(spec, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(kv), "=")
		f, err := strconv.ParseFloat(v, 64)
		fields := map[string]*float64{"noRenew": &p.noRenew, "long": &p.long, "extend": &p.extend, "faults": &p.faults, "passes": &p.passes, "subs": &p.subs}
		ptr := fields[k]
		switch {
		case err == nil && ptr != nil:
			*ptr = f
		case err == nil && k == "longMax":
			p.longMax = time.Duration(f) * time.Millisecond
		case err == nil && k == "chaos":
			p.chaos = time.Duration(f) * time.Millisecond
		default:
			t.Fatalf("DLOCK_CHAOS_PROFILE: %q is not NAME=NUMBER with a field of %+v", kv, *p)
		}
	}
}

func (p ilProfile) String() string {
	return fmt.Sprintf("noRenew %.2f, long holds %.2f up to %v, extend %.2f, faults x%.0f, pass/extend faults %.1f, subscription faults x%.0f, chaos every %v",
		p.noRenew, p.long, p.longMax, p.extend, p.faults, p.passes, p.subs, p.chaos)
}

const (
	ilClients = 3
	ilWorkers = 4    // per Client slot
	ilSize    = 4    // a semaphore's permits
	ilMaxTTL  = 4000 // ms: the longest TTL a call asks for
)

func newInterleaving(t *testing.T, kind string, seed uint64, dur time.Duration, ack bool) *interleaving {
	w := &interleaving{
		t: t, kind: kind, seed: seed, dur: dur,
		// Every byte a name may hold must survive keys, entries and channels.
		name:   "il," + kind + " {x}:\n\xff",
		size:   ilSize,
		epoch:  time.Now(),
		held:   map[*ilLease]struct{}{},
		fences: map[uint64]bool{},
		ops:    map[string]int{},
		maxTTL: ilMaxTTL * time.Millisecond,
		prof:   drawProfile(seed),
	}
	if spec := os.Getenv("DLOCK_CHAOS_PROFILE"); spec != "" {
		w.prof.override(t, spec)
	}
	if ack {
		w.s, w.replica, w.plain, w.replicaPlain, w.link = primaryAndReplicaVia(t)
	} else {
		w.s = redistest.Start(t)
		w.plain = w.s.Client(t)
	}
	w.epoch = time.Now()
	w.slots = make([]atomic.Pointer[ilClient], ilClients)
	for i := range w.slots {
		w.slots[i].Store(w.newClient())
	}
	return w
}

// newClient makes a Client whose script calls and subscriptions get faults
// drawn from the run's seed.
func (w *interleaving) newClient() *ilClient {
	t := w.t
	gen := w.gen.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r := rand.New(rand.NewPCG(w.seed, uint64(1000+gen)))
	for _, sc := range wire.Scripts() { // a fault never meets NOSCRIPT instead of the script's work
		if err := w.plain.ScriptLoad(ctx, sc.Src).Err(); err != nil {
			t.Fatal(err)
		}
	}
	ms, f, p, sf := time.Millisecond, w.prof.faults, w.prof.passes, w.prof.subs
	in := faults.New(faults.Config{
		Seed:    w.seed*1000 + uint64(gen),
		Scripts: engineScripts(t),
		Rules: []faults.Rule{
			{Script: "pass", Kind: faults.LoseReply, P: p, Max: 300 * ms},
			{Script: "pass", Kind: faults.DelaySend, P: p, Max: 150 * ms},
			{Script: "extend", Via: faults.Batch, Kind: faults.DelaySend, P: p, Max: 200 * ms}, // a renewal in flight for long
			{Script: "extend", Kind: faults.DelayReply, P: p, Max: 250 * ms},
			{Script: "sem.e", Via: faults.Batch, Kind: faults.DelaySend, P: p, Max: 200 * ms},
			{Script: "sem.e", Kind: faults.DelayReply, P: p, Max: 250 * ms},
			{Kind: faults.DelaySend, P: 0.03 * f, Max: 80 * ms},
			{Kind: faults.DelayReply, P: 0.03 * f, Max: 150 * ms},
			{Kind: faults.LoseReply, P: 0.015 * f, Max: 60 * ms},
			{Kind: faults.FailSend, P: 0.01 * f, Max: 30 * ms},
			{Kind: faults.Cut, P: 0.005 * f},
		},
		Sub:      faults.SubFaults{Delay: 0.1 * sf, MaxDelay: 300 * ms, Refuse: 0.05 * sf, Drop: 0.03 * sf, Unsubscribe: 0.02 * sf},
		MaxDelay: time.Second,
		Epoch:    w.epoch,
	})
	rdb := w.s.Client(t)
	rdb.AddHook(in)
	opts := []dlock.Option{dlock.WithAutoPipeline(r.IntN(2) == 0)}
	if w.replica != nil {
		opts = append(opts, dlock.WithReplicaAck(1, ilReplicaWait))
	}
	c := dlock.New(rdb, opts...)
	ic := &ilClient{gen: gen, c: c, in: in}
	w.mu.Lock()
	w.clients = append(w.clients, ic)
	w.mu.Unlock()
	return ic
}

func (w *interleaving) now() time.Duration { return time.Since(w.epoch) }

func (w *interleaving) count(op string) {
	w.mu.Lock()
	w.ops[op]++
	w.mu.Unlock()
}

func (o *ilLease) String() string {
	role := ""
	if o.writer {
		role = " writer"
	}
	return fmt.Sprintf("{client %d%s fence %d permits %d via %s at %.3fs token %s}", o.client, role, o.fence, o.permits, o.via, o.at.Seconds(), o.l.Token())
}

// run runs the workers and the chaos for w.dur, then checks what is left.
func (w *interleaving) run() {
	t := w.t
	end := time.Now().Add(w.dur)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for g := range ilClients * ilWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(w.seed, uint64(g)))
			for time.Now().Before(end) {
				w.round(r, g%ilClients)
			}
		}()
	}
	var chaos sync.WaitGroup
	chaos.Add(1)
	go func() {
		defer chaos.Done()
		w.chaos(rand.New(rand.NewPCG(w.seed, 999)), stop)
	}()
	if w.link != nil {
		chaos.Add(1)
		go func() {
			defer chaos.Done()
			w.replication(rand.New(rand.NewPCG(w.seed, 998)), stop)
		}()
	}
	done := make(chan struct{})
	go func() { wg.Wait(); done <- struct{}{} }()
	// Every call a worker makes is bounded (its ctx, or the Client's
	// timeouts); a worker not back well after the end hangs.
	select {
	case <-done:
	case <-time.After(w.dur + 30*time.Second):
		var b strings.Builder
		_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
		t.Fatalf("workers still running 30s after the end: a call hangs\n%s", b.String())
	}
	close(stop)
	chaos.Wait()
	returned := time.Now()
	w.checkFree(returned)
	w.mu.Lock()
	t.Logf("profile: %v", w.prof)
	t.Logf("%s seed %d: %d grants, %d checks, ops %v, %d Clients", w.kind, w.seed, w.grants, w.checks, w.ops, len(w.clients))
	var heard uint64
	for _, ic := range w.clients {
		heard += dlock.HandOversHeard(ic.c)
		t.Logf("client %d faults: %s", ic.gen, ic.in.Summary())
	}
	t.Logf("hand-overs heard: %d", heard)
	// Waiters in line at Redis are handed the lock by the release that frees
	// it, and told so by message: most grants of a Fair mutex, an RWMutex
	// or a Semaphore under contention come that way, even with these faults.
	// A line that took its waiters for dead would hand over none. The bound
	// is low: a seed whose profile weighs server pauses and subscription
	// faults heavily makes few grants, and fewer of them heard (7 of 35 in
	// one 3 s run of rw).
	if w.kind != "mutex" && heard < uint64(w.grants/10) {
		t.Errorf("only %d of %d grants were hand-overs heard by a waiter in line", heard, w.grants)
	}
	for _, f := range w.fails {
		t.Error(f)
	}
	if len(w.fails) > 0 && os.Getenv("DLOCK_EVENTS") != "" {
		for _, ic := range w.clients {
			for _, e := range ic.in.Events(nil) {
				t.Logf("client %d event %v", ic.gen, e)
			}
		}
	}
	if w.grants == 0 {
		t.Error("no lease was granted: nothing was checked")
	}
	w.mu.Unlock()
	for i := range w.slots {
		ic := w.slots[i].Load()
		closed := make(chan error, 1)
		go func() { closed <- ic.c.Close() }()
		select {
		case <-closed:
		case <-time.After(20 * time.Second):
			t.Fatalf("Close of client %d hangs", ic.gen)
		}
	}
}

// chaos closes and replaces Clients, pauses the server and kills the
// subscription connections, at seeded random times, until stop.
func (w *interleaving) chaos(r *rand.Rand, stop <-chan struct{}) {
	t := w.t
	for i := 0; i < 1000; i++ { // bounded; the run's end stops it first
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(r.Int64N(int64(2 * w.prof.chaos)))):
		}
		switch r.IntN(3) {
		case 0: // a Client closes under its workers; a new one takes its place
			slot := &w.slots[r.IntN(len(w.slots))]
			old := slot.Swap(w.newClient())
			closed := make(chan error, 1)
			go func() { closed <- old.c.Close() }()
			select {
			case <-closed:
				w.count("close")
			case <-time.After(20 * time.Second):
				w.mu.Lock()
				w.failf("Close of client %d did not return in 20s", old.gen)
				w.mu.Unlock()
				return
			}
		case 1: // the server stops for a while, maybe longer than a TTL
			d := time.Duration(10+r.IntN(300)) * time.Millisecond
			w.s.Pause()
			time.Sleep(d)
			w.s.Resume()
			w.count("pause")
		case 2: // every subscription connection is killed
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			if err := w.plain.ClientKillByFilter(ctx, "TYPE", "pubsub").Err(); err != nil {
				t.Logf("CLIENT KILL: %v", err)
			}
			cancel()
			w.count("kill pubsub")
		}
	}
}

// replication troubles the replica of a run with replica acknowledgement
// until stop: the primary's stream is held back from it (it still
// answers, so checkRedis sees what it lacks), or it stops, for up to a
// second at a time (longer than the wait for a confirmation, so that
// calls end while it lasts), about half of the run in all.
func (w *interleaving) replication(r *rand.Rand, stop <-chan struct{}) {
	for i := 0; i < 1000; i++ { // bounded; the run's end stops it first
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(100+r.IntN(500)) * time.Millisecond):
		}
		d := time.Duration(10+r.IntN(1000)) * time.Millisecond
		if r.IntN(4) == 0 {
			w.replica.Pause()
			time.Sleep(d)
			w.replica.Resume()
			w.count("replica pause")
			continue
		}
		w.link.Hold(faultproxy.Downstream)
		time.Sleep(d)
		w.link.Release(faultproxy.Downstream)
		w.count("replication held")
	}
}

// round is one worker's turn: obtain the lock, hold it for a while doing
// what a holder may, give it up.
func (w *interleaving) round(r *rand.Rand, slot int) {
	ic := w.slots[slot].Load()
	me, err := w.obtain(r, ic)
	if err != nil {
		w.expected(err, "obtain")
		return
	}
	if me == nil {
		return
	}
	w.granted(me)
	if w.replica != nil {
		w.checkRedis() // at once: the replica must have what was confirmed
	}
	w.hold(r, me)
	w.release(r, me)
}

// obtain makes one lock call of a random kind, with random options.
func (w *interleaving) obtain(r *rand.Rand, ic *ilClient) (*ilLease, error) {
	ttl := time.Duration(250+r.IntN(400)) * time.Millisecond
	opts := []dlock.LockOption{dlock.TTL(ttl)}
	if r.Float64() < w.prof.noRenew {
		opts = append(opts, dlock.NoRenew())
	}
	wait := time.Duration(r.IntN(300)) * time.Millisecond
	if r.IntN(3) == 0 {
		wait = 2 * time.Second
	}
	deadline := time.Now().Add(wait)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if r.IntN(20) == 0 {
		cancel() // an ended ctx: no lease, nothing left behind
	}
	try := r.IntN(5) == 0
	me := &ilLease{ic: ic, client: ic.gen, permits: 1}
	var l *dlock.Lease
	var err error
	switch w.kind {
	case "mutex", "fair":
		if w.kind == "fair" {
			opts = append(opts, dlock.Fair())
		}
		m := ic.c.Mutex(w.name, opts...)
		switch {
		case try:
			me.via = "TryLock"
			l, err = m.TryLock(ctx)
		case r.IntN(5) == 0:
			me.via = "Do"
			w.count(me.via)
			return nil, w.do(r, m, ctx, me)
		default:
			me.via = "Lock"
			l, err = m.Lock(ctx)
		}
	case "rw":
		rw := ic.c.RWMutex(w.name, opts...)
		me.writer = r.IntN(3) == 0
		switch {
		case me.writer && try:
			me.via = "TryLock"
			l, err = rw.TryLock(ctx)
		case me.writer:
			me.via = "Lock"
			l, err = rw.Lock(ctx)
		case try:
			me.via = "TryRLock"
			l, err = rw.TryRLock(ctx)
		default:
			me.via = "RLock"
			l, err = rw.RLock(ctx)
		}
	case "sem":
		me.permits = int64(1 + r.IntN(ilSize))
		s := ic.c.Semaphore(w.name, ilSize, opts...)
		if try {
			me.via = "TryAcquire"
			l, err = s.TryAcquire(ctx, me.permits)
		} else {
			me.via = "Acquire"
			l, err = s.Acquire(ctx, me.permits)
		}
	}
	w.count(me.via)
	w.returnedBy(me.via, deadline)
	if err != nil {
		return nil, err
	}
	me.l, me.fence = l, l.Fence()
	return me, nil
}

// do runs Mutex.Do, its function doing what a holder does. The function
// finds its lease by re-entering the lock under Do's ctx: the reentrant
// lease shares the holding (its fence, its context), and Do unlocks the
// holding as the function returns.
func (w *interleaving) do(r *rand.Rand, m *dlock.Mutex, ctx context.Context, me *ilLease) error {
	return m.Do(ctx, func(lctx context.Context) error {
		inner, err := m.Lock(lctx)
		if err != nil {
			w.expected(err, "Lock within Do")
			return nil
		}
		me.l, me.fence = inner, inner.Fence()
		w.granted(me)
		w.hold(r, me)
		w.check("end of Do of " + me.String())
		w.giveUp(me)
		w.expected(inner.Unlock(context.Background()), "inner Unlock within Do")
		return nil
	})
}

// hold does what a holder may while it holds the lease, in a few steps:
// extend it, ask its TTL, re-enter it, each followed by a short or long
// wait (renewals, maybe a lost lease) and a check.
func (w *interleaving) hold(r *rand.Rand, me *ilLease) {
	for range 1 + r.IntN(3) {
		switch {
		case r.Float64() < w.prof.extend/2:
			w.extend(r, me)
		case r.Float64() < w.prof.extend/2:
			// Two calls on one lease at once: an Extend while its renewal is
			// on the wire.
			if me.ic.in.WaitInFlight(300*time.Millisecond, func(c faults.Call) bool { return c.Via == faults.Batch && c.Has(me.l.Token()) }) {
				w.count("Extend during renewal")
			}
			w.extendTo(r, me, time.Duration(1000+r.IntN(ilMaxTTL-1000))*time.Millisecond)
			w.watch(r, time.Duration(r.Int64N(int64(w.prof.longMax))))
		case r.IntN(8) == 0:
			end := time.Now().Add(time.Duration(r.IntN(100)) * time.Millisecond)
			ctx, cancel := context.WithDeadline(context.Background(), end)
			_, err := me.l.TTL(ctx)
			cancel()
			w.returnedBy("TTL", end)
			w.expected(err, "TTL")
			w.count("TTL")
		case r.IntN(8) == 0 && (w.kind == "mutex" || w.kind == "fair" || me.writer):
			w.reenter(r, me)
		}
		if r.Float64() < w.prof.long {
			w.watch(r, time.Duration(r.Int64N(int64(w.prof.longMax))))
		} else {
			time.Sleep(time.Duration(r.IntN(2000)) * time.Microsecond)
		}
		w.check("hold of " + me.String())
		w.checkRedis()
	}
}

// watch waits d, looking at Redis every few tens of milliseconds: a lease
// believed valid beyond its expiry at Redis is seen in that window, whether
// or not someone else takes the lock meanwhile.
func (w *interleaving) watch(r *rand.Rand, d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); {
		time.Sleep(min(time.Until(end), time.Duration(10+r.IntN(30))*time.Millisecond))
		w.checkRedis()
	}
}

// extend extends the lease to a random TTL.
func (w *interleaving) extend(r *rand.Rand, me *ilLease) {
	ttl := time.Duration(40+r.IntN(860)) * time.Millisecond
	if r.IntN(5) == 0 {
		ttl = time.Duration(1000+r.IntN(ilMaxTTL-1000)) * time.Millisecond // far beyond the lock's
	}
	w.extendTo(r, me, ttl)
}

func (w *interleaving) extendTo(r *rand.Rand, me *ilLease, ttl time.Duration) {
	end := time.Now().Add(time.Duration(r.IntN(400)) * time.Millisecond)
	ctx, cancel := context.WithDeadline(context.Background(), end)
	defer cancel()
	err := me.l.Extend(ctx, ttl)
	w.returnedBy("Extend", end)
	w.expected(err, "Extend")
	w.count("Extend")
}

// reenter locks the held lock again under the lease's context: the same
// holding, the same fence; its Unlock leaves the lock held.
func (w *interleaving) reenter(r *rand.Rand, me *ilLease) {
	end := time.Now().Add(time.Duration(r.IntN(100)) * time.Millisecond)
	ctx, cancel := context.WithDeadline(me.l.Context(), end)
	defer cancel()
	defer w.returnedBy("reentrant Lock", end)
	var inner *dlock.Lease
	var err error
	ic := w.clientOf(me)
	if ic == nil {
		return
	}
	switch w.kind {
	case "mutex", "fair":
		opts := []dlock.LockOption{}
		if w.kind == "fair" {
			opts = append(opts, dlock.Fair())
		}
		inner, err = ic.c.Mutex(w.name, opts...).Lock(ctx)
	default:
		inner, err = ic.c.RWMutex(w.name).Lock(ctx)
	}
	w.count("reenter")
	if err != nil {
		w.expected(err, "reenter")
		return
	}
	if inner.Fence() != me.fence {
		w.mu.Lock()
		w.failf("a reentrant lock of %v got fence %d", me, inner.Fence())
		w.mu.Unlock()
	}
	if err := inner.Unlock(context.Background()); err != nil {
		w.expected(err, "inner Unlock")
	}
}

// clientOf returns the Client that granted me, if it is still in use.
func (w *interleaving) clientOf(me *ilLease) *ilClient {
	for i := range w.slots {
		if ic := w.slots[i].Load(); ic.gen == me.client {
			return ic
		}
	}
	return nil
}

// release gives the lease up in one of the ways a holder may.
func (w *interleaving) release(r *rand.Rand, me *ilLease) {
	w.check("release of " + me.String())
	w.giveUp(me)
	var err error
	switch r.IntN(6) {
	case 0: // with a ctx that has ended (a finished request's)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		end := time.Now()
		err = me.l.Unlock(ctx)
		w.returnedBy("Unlock with an ended ctx", end)
		w.count("Unlock ended ctx")
	case 1: // twice at once
		var errs [2]error
		var wg sync.WaitGroup
		for i := range errs {
			wg.Add(1)
			go func() { defer wg.Done(); errs[i] = me.l.Unlock(context.Background()) }()
		}
		wg.Wait()
		err = errs[0]
		// One may report an outcome it could not know (a lost reply) that
		// the other then learned; two known outcomes must agree.
		lost0, lost1 := errors.Is(errs[0], dlock.ErrLockLost), errors.Is(errs[1], dlock.ErrLockLost)
		if errs[0] == nil && lost1 || errs[1] == nil && lost0 {
			w.mu.Lock()
			w.failf("two Unlocks of %v at once disagree: %v and %v", me, errs[0], errs[1])
			w.mu.Unlock()
		}
		w.count("Unlock twice at once")
	case 2: // beside an Extend
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); w.extend(r2(r), me) }()
		err = me.l.Unlock(context.Background())
		wg.Wait()
		w.count("Unlock beside Extend")
	default: // with a ctx that may end meanwhile
		end := time.Now().Add(time.Duration(1+r.IntN(100)) * time.Millisecond)
		ctx, cancel := context.WithDeadline(context.Background(), end)
		err = me.l.Unlock(ctx)
		cancel()
		w.returnedBy("Unlock", end)
		w.count("Unlock")
	}
	w.expected(err, "Unlock")
	if err == nil {
		// A final outcome is kept: a later call reports it again.
		if again := me.l.Unlock(context.Background()); again != nil {
			w.mu.Lock()
			w.failf("Unlock of %v returned nil, then %v", me, again)
			w.mu.Unlock()
		}
	}
}

// r2 is a source of its own for a goroutine, drawn from r.
func r2(r *rand.Rand) *rand.Rand { return rand.New(rand.NewPCG(r.Uint64(), r.Uint64())) }
