package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
// name, per primitive (Mutex, Mutex with Fair, RWMutex, Semaphore, Election,
// StringMutex; and a MultiLock's: several names of a pool of four, see
// interleave_multi_test.go): several
// Clients in one process, each with a few goroutines that Lock, TryLock, Do,
// re-enter, Extend, ask the TTL and Unlock (with an ended ctx, twice at once,
// with a ctx that ends meanwhile, alongside an Extend), while Clients are
// closed and replaced, the server is paused, subscription connections are
// killed, and every script call and subscription gets seeded faults
// (internal/faults: delays before sending and of the reply, replies lost
// after Redis ran the command, sends that fail, cut connections; SSUBSCRIBEs
// confirmed late, refused, or followed by a drop, and server-side
// unsubscribes; in some runs, acquire replies held back past the lease's
// TTL, which bring grants too late to be valid).
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
//   - a Mutex lease, valid or not, has a fence above every lease whose
//     call returned before its own call was made;
//   - no call returned a lease granted by an acquire whose reply was held
//     back past its TTL (see lateGrants);
//
// and, after every caller has returned, that the lock is free at Redis
// within one TTL (no holding left renewed or counted), and that no call
// hung: every call with a bounded ctx (Lock, TryLock, Extend, TTL, a
// reentrant Lock, Unlock) returns within 3s of its ctx's end. Porcupine is not needed here: the property is checked directly on
// the intervals (TestMutualExclusionAcrossProcesses checks a history of
// fenced writes with it).
//
// A short run with a fresh seed is part of every test run (make test
// shares the primitives out between its -race and rueidis passes, drawn
// anew each time; a plain go test over rueidis runs half of them, unless
// DLOCK_CHAOS_ROUNDS is set: see passShare); DLOCK_SEED replays one, DLOCK_CHAOS sets the duration of each run
// (default 3s) and DLOCK_CHAOS_ROUNDS the number of seeds per primitive
// (make chaos). Faults reach a rueidis client as a go-redis one
// (injectFaults). A failure prints the command that replays it; with DLOCK_EVENTS=1 it also
// prints every fault injected, on the run's clock, with the tokens they
// concern (leases are printed with theirs).
func TestInterleavings(t *testing.T) { interleavings(t, "TestInterleavings", ilSingle, ilKinds, "") }

// TestInterleavingsLateGrants is TestInterleavings for the RWMutex with a
// profile that weighs late grants: most acquires that take no place in
// line (a Try call's, a Lock's first look) have their reply held back past
// the lease's TTL, and every lock call may wait long enough to see it.
// Such a grant is too late to be valid: the call gives it back and must
// not return it (see lateGrants). The run must show some given back (an
// RWMutex's readers share it, so that first looks find it free more often
// than a mutex's). Other seeds weigh late grants less, or not at all.
func TestInterleavingsLateGrants(t *testing.T) {
	late, seeds := interleavings(t, "TestInterleavingsLateGrants", ilSingle, []string{"rw"}, "late=0.8,lateLine=0.8,patient=1,long=0.05")
	t.Logf("late grants given back: %d in %d seeds", late, seeds)
	if seeds > 0 && late == 0 {
		t.Errorf("no call gave back a late grant in %d seeds: the acquire replies held back past the TTL did not reach that path", seeds)
	}
}

// TestInterleavingsReplicaAck is TestInterleavings on a primary with one
// replica, every Client made WithReplicaAck(1, ...), the replica stopped
// for a while now and then as well: besides every check of
// TestInterleavings, every lease believed valid must be held on the
// replica too, and calls fail with ErrNotReplicated rather than grant what
// the replica has not confirmed.
func TestInterleavingsReplicaAck(t *testing.T) {
	interleavings(t, "TestInterleavingsReplicaAck", ilReplicaAck, ilKinds, "")
}

// TestInterleavingsQuorum is TestInterleavings for the Mutex (default
// mode, the only lock quorum mode has) on five independent masters, every
// Client made by NewQuorum (rueidisdlock's under DLOCK_DRIVER=rueidis):
// each master's client gets faults of its own, one or two masters are
// paused at a time, and a master restarts without its data now and then
// (WithRestartDelay is the longest TTL). A
// lease believed valid must be held on a majority of the masters, counting
// one that lost its data less than the restart delay ago (it votes for
// nobody until then), and the lock must be free on every master one TTL
// after every caller returned. Meanwhile the fence counter of a master
// that holds no lease is set up to ilSkewMax ahead of its clock now and
// then, as a master whose clock runs that far ahead would leave it: the
// masters here share one clock, and fences, drawn from it, would come out
// in grant order whether or not every grant raised its fence on a
// majority.
func TestInterleavingsQuorum(t *testing.T) {
	interleavings(t, "TestInterleavingsQuorum", ilQuorum, []string{"mutex"}, "") // quorum mode has the Mutex in default mode only
}

// ilTopology is what the lock of an interleaving run lives on.
type ilTopology int

const (
	ilSingle     ilTopology = iota // one server
	ilReplicaAck                   // a primary and its replica, grants confirmed by it
	ilQuorum                       // ilMasters independent masters (NewQuorum)
	ilCluster                      // a Redis Cluster of ilClusterMasters masters, no replicas
)

// ilMasters is how many masters a quorum run has.
const ilMasters = 5

// ilKinds are the primitives an interleaving run may lock.
var ilKinds = []string{"mutex", "fair", "rw", "sem", "election", "multi", "string"}

// interleavings runs the interleaving test named test on topo for each of
// kinds; profile (as DLOCK_CHAOS_PROFILE, which comes after it) sets fields
// of every seed's profile. It returns how many late grants the seeds' calls
// gave back, and how many seeds ran to their end.
func interleavings(t *testing.T, test string, topo ilTopology, kinds []string, profile string) (late int64, seeds int) {
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
	if topo == ilCluster && os.Getenv("DLOCK_CHAOS") == "" {
		dur = ilClusterDur
	}
	driver := driverPrefix()
	// make test runs each primitive once, over one of the two drivers
	// (see passShare); a plain go test over rueidis, half of them. A
	// Cluster run shares out the few it draws (see clusterKinds).
	if kinds = shareOf(test, kinds); len(kinds) == 0 {
		t.Skip("drawn out of this pass, as half the primitives are (DLOCK_CHAOS_ROUNDS=1 runs it)")
	}
	for _, kind := range kinds {
		t.Run(kind, func(t *testing.T) {
			for range rounds {
				seed := fixed
				if !replay {
					seed = rand.Uint64N(1 << 40)
				}
				t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
					w := newInterleaving(t, kind, seed, dur, topo, profile)
					defer func() {
						if t.Failed() {
							t.Logf("replay: %sDLOCK_SEED=%d DLOCK_CHAOS=%v go test -race -count=1 -run '%s/%s/seed=%d$' .", driver, seed, dur, test, kind, seed)
						}
					}()
					w.run()
					seeds++
					late += int64(w.ops[lateGrantOp]) + w.lateLocks.Load()
				})
			}
		})
	}
	return late, seeds
}

// ilReplicaWait is how long grants wait for the replica's confirmation.
const ilReplicaWait = 100 * time.Millisecond

// interleaving is one run: one lock name, the servers it lives on, its
// Clients and what the run has seen.
type interleaving struct {
	t    *testing.T
	kind string
	seed uint64
	dur  time.Duration
	name string
	pool []string // the names the run locks: a MultiLock's pool (kind multi), else name alone
	size int64    // sem: permits in all
	topo ilTopology
	// The servers the lock is taken on (one, or the quorum's masters), and
	// a plain client of each.
	masters []*redistest.Server
	plains  []*redis.Client
	epoch   time.Time
	// Quorum: each master's last restart, under mu; the restart delay.
	restarted []ilRestart
	delay     time.Duration
	// Cluster: a plain ClusterClient that reads each key where its slot
	// is served now, and the run's slots with their masters (see
	// interleave_cluster_test.go).
	cplain *redis.ClusterClient
	cslots []*ilSlot
	// With replica acknowledgement: the primary's replica, a client of it,
	// and the proxy its replication link goes through.
	replica      *redistest.Server
	replicaPlain *redis.Client
	link         *faultproxy.Proxy
	prof         ilProfile

	slots      []atomic.Pointer[ilClient] // the Clients the workers use, replaced as they close
	gen        atomic.Int64               // Clients made so far
	lateLocks  atomic.Int64               // late grants that Lock calls gave back before they tried again
	startOvers atomic.Int64               // of those, waits that went on with a fresh token
	maxTTL     time.Duration              // the longest TTL any call asked for

	mu       sync.Mutex
	held     map[*ilLease]struct{} // granted, not yet given up by its holder
	maxFence uint64                // rw: of every writer's seen valid
	maxAll   uint64                // rw: of every lease seen valid
	top      map[string]uint64     // one holder at a time: by name, the fence of every lease seen valid
	order    map[string][]ilGrant  // one holder at a time: by name, every grant, in the order recorded
	fences   map[uint64]bool       // sem: fences granted
	grants   int
	checks   int
	ops      map[string]int
	fails    []string
	clients  []*ilClient // every Client made
	elect    ilElection  // kind election
}

// ilClient is one dlock Client with its own go-redis client for each
// master, and each one's faults.
type ilClient struct {
	gen int64
	c   *dlock.Client
	ins []*faults.Injector // one per master
}

// ilGrant is a grant as the fence order check keeps it: when it was
// recorded, and the largest fence recorded by then.
type ilGrant struct {
	at  time.Duration
	max uint64
}

// ilLease is one grant as its holder sees it.
type ilLease struct {
	l       *dlock.Lease
	ic      *ilClient
	client  int64
	fence   uint64
	permits int64
	writer  bool
	called  time.Duration // when the call that granted it was made
	at      time.Duration // when the grant was recorded, after that call returned
	via     string
	gaveUp  bool            // its holder called Unlock (or saw it end)
	e       *dlock.Election // the election it leads (kind election)
	names   []string        // the names it holds: a MultiLock's, in lock order, else the one
	fences  []uint64        // FenceOf each of names
	multi   bool            // a MultiLock's lease (kind multi: else a Mutex of one name of the pool)
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
	slow    float64       // quorum: multiplies every script fault's chance on the first master
	late    float64       // one server, a Cluster: chance that the reply of an acquire outside the line comes past its TTL
	patient float64       // chance that a lock call may wait 2s (else up to 300ms)
	// lateLine is the chance that a look in line is answered past the TTL
	// (one server, a Cluster; a quarter of late unless set): its grant is given back
	// and the wait starts over with a fresh token.
	lateLine float64
}

func drawProfile(seed uint64) ilProfile {
	r := rand.New(rand.NewPCG(seed, 7))
	pick := func(low, high float64) float64 { return [2]float64{low, high}[r.IntN(2)] }
	p := ilProfile{
		noRenew: pick(0.1, 0.6),
		long:    pick(0.05, 0.3),
		longMax: time.Duration(pick(400, 1000)) * time.Millisecond,
		extend:  pick(0.1, 0.4),
		faults:  pick(0.5, 2),
		passes:  pick(0.05, 0.3),
		subs:    pick(0, 2),
		chaos:   time.Duration(pick(300, 2000)) * time.Millisecond,
		slow:    pick(1, 5),
		late:    pick(0, 0.3),
		patient: pick(1.0/3, 2.0/3),
	}
	p.lateLine = p.late / 4
	return p
}

// override sets the fields named in spec ("passes=0.3,long=0.3", from
// DLOCK_CHAOS_PROFILE), to aim runs at one mix.
func (p *ilProfile) override(t *testing.T, spec string) {
	for _, kv := range strings.Split(spec, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(kv), "=")
		f, err := strconv.ParseFloat(v, 64)
		fields := map[string]*float64{"noRenew": &p.noRenew, "long": &p.long, "extend": &p.extend, "faults": &p.faults, "passes": &p.passes, "subs": &p.subs, "slow": &p.slow, "late": &p.late, "lateLine": &p.lateLine, "patient": &p.patient}
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
	return fmt.Sprintf("noRenew %.2f, long holds %.2f up to %v, extend %.2f, faults x%.0f, pass/extend faults %.1f, subscription faults x%.0f, chaos every %v, (quorum) first master's faults x%.0f, (one server, Cluster) late grants %.2f, in line %.2f, patient %.2f",
		p.noRenew, p.long, p.longMax, p.extend, p.faults, p.passes, p.subs, p.chaos, p.slow, p.late, p.lateLine, p.patient)
}

const (
	ilClients = 3
	ilWorkers = 4    // per Client slot
	ilSize    = 4    // a semaphore's permits
	ilMaxTTL  = 4000 // ms: the longest TTL a call asks for
	ilLockTTL = 650  // ms: lock calls ask for a TTL below this
)

func newInterleaving(t *testing.T, kind string, seed uint64, dur time.Duration, topo ilTopology, profile string) *interleaving {
	w := &interleaving{
		t: t, kind: kind, seed: seed, dur: dur, topo: topo,
		// Every byte a name may hold must survive keys, entries and channels.
		name:   "il," + kind + " {x}:\n\xff",
		size:   ilSize,
		epoch:  time.Now(),
		held:   map[*ilLease]struct{}{},
		fences: map[uint64]bool{},
		top:    map[string]uint64{},
		order:  map[string][]ilGrant{},
		ops:    map[string]int{},
		maxTTL: ilMaxTTL * time.Millisecond,
		prof:   drawProfile(seed),
	}
	for _, spec := range []string{profile, os.Getenv("DLOCK_CHAOS_PROFILE")} {
		if spec != "" {
			w.prof.override(t, spec)
		}
	}
	w.pool = []string{w.name}
	if kind == "multi" {
		w.pool = ilMultiPool
	}
	switch topo {
	case ilSingle:
		s := redistest.Start(t)
		w.masters, w.plains = []*redistest.Server{s}, []*redis.Client{s.Client(t)}
	case ilReplicaAck:
		var s *redistest.Server
		var plain *redis.Client
		s, w.replica, plain, w.replicaPlain, w.link = primaryAndReplicaVia(t)
		w.masters, w.plains = []*redistest.Server{s}, []*redis.Client{plain}
	case ilQuorum:
		w.startQuorum()
	case ilCluster:
		w.startCluster()
	}
	w.epoch = time.Now()
	w.slots = make([]atomic.Pointer[ilClient], ilClients)
	for i := range w.slots {
		w.slots[i].Store(w.newClient())
	}
	if kind == "election" {
		w.elect.values = map[string]uint64{}
		w.observe()
	}
	return w
}

// startQuorum starts the masters of a quorum run: they vote at once (see
// quorumMasters).
func (w *interleaving) startQuorum() {
	var rdbs []redis.UniversalClient
	w.masters, rdbs = quorumMasters(w.t, ilMasters)
	for _, r := range rdbs {
		w.plains = append(w.plains, r.(*redis.Client))
	}
	w.restarted = make([]ilRestart, ilMasters)
	w.delay = w.maxTTL // no lease is longer
}

// newClient makes a Client whose script calls and subscriptions get faults
// drawn from the run's seed, on each master's connections apart.
func (w *interleaving) newClient() *ilClient {
	t := w.t
	gen := w.gen.Add(1)
	r := rand.New(rand.NewPCG(w.seed, uint64(1000+gen)))
	for _, plain := range w.plains {
		loadScripts(t, plain)
	}
	ic := &ilClient{gen: gen}
	var rdbs []redis.UniversalClient
	if w.topo == ilCluster {
		// One ClusterClient, its faults on the connections of every node.
		in := w.injector(w.seed*1000+uint64(gen), 1)
		rdb := redistest.ClusterClient(t, w.masters)
		injectFaults(t, rdb, in)
		rdbs, ic.ins = []redis.UniversalClient{rdb}, []*faults.Injector{in}
	}
	for i, s := range w.masters {
		if w.topo == ilCluster {
			break // its masters are reached through the ClusterClient
		}
		slow := 1.0
		if i == 0 && w.topo == ilQuorum {
			slow = w.prof.slow // one master is slow, or flaky, more often than the others
		}
		in := w.injector(uint64(i)<<56+w.seed*1000+uint64(gen), slow)
		rdb := s.Client(t)
		injectFaults(t, rdb, in)
		rdbs = append(rdbs, rdb)
		ic.ins = append(ic.ins, in)
	}
	opts := []dlock.Option{dlock.WithAutoPipeline(r.IntN(2) == 0)}
	switch w.topo {
	case ilSingle, ilCluster:
		ic.c = newDlock(t, rdbs[0], append(opts, dlock.WithLogger(slog.New(lateLog{&w.lateLocks, &w.startOvers})))...)
	case ilReplicaAck:
		ic.c = newDlock(t, rdbs[0], append(opts, dlock.WithReplicaAck(1, ilReplicaWait))...)
	case ilQuorum:
		ic.c = newQuorum(t, rdbs, append(opts, dlock.WithRestartDelay(w.delay))...)
	}
	w.mu.Lock()
	w.clients = append(w.clients, ic)
	w.mu.Unlock()
	return ic
}

// injector returns the faults of one go-redis client, drawn from seed, the
// chance of each script fault multiplied by slow.
func (w *interleaving) injector(seed uint64, slow float64) *faults.Injector {
	ms, f, p, sf := time.Millisecond, w.prof.faults*slow, w.prof.passes*slow, w.prof.subs
	late, lateLine := 0.0, 0.0
	if w.topo == ilSingle || w.topo == ilCluster {
		late, lateLine = w.prof.late, w.prof.lateLine
	}
	acquire := w.acquireScripts()
	// A server-side unsubscribe is made by writing an SUNSUBSCRIBE behind
	// the client's back: the server answers it with a push, which both
	// drivers take as the server's own. Not over rueidis on a Cluster: once
	// the channel's slot has moved, the node answers -MOVED instead, a
	// reply rueidis never asked for, and it panics ("protocol bug, message
	// handled out of order", on a connection's reader, which kills the
	// test binary: 8 of 15 rueidis runs of TestInterleavingsCluster's
	// seven primitives did, each on a seed with subscription faults; none
	// of 4 without these unsubscribes). There, the migrations make the
	// server's own unsubscribes.
	unsub := 0.02 * sf
	if w.topo == ilCluster && onRueidis() {
		unsub = 0
	}
	return faults.New(faults.Config{
		Seed:    seed,
		Scripts: faults.EngineScripts(),
		Rules: []faults.Rule{
			// A grant whose reply comes after its lease's TTL is too late
			// to be valid: the call must not return it, and gives it back
			// (checked by lateGrants).
			// (A MultiLock's group acquire; its waits' and a Mutex's
			// acquire.lua, half as often.)
			{Script: acquire[0], Match: outsideLine, Kind: faults.DelayReply, P: late, Min: (ilLockTTL + 50) * ms, Max: time.Second},
			{Script: acquire[len(acquire)-1], Match: outsideLine, Kind: faults.DelayReply, P: late / 2 * float64(len(acquire)-1), Min: (ilLockTTL + 50) * ms, Max: time.Second},
			// A look of a waiter in line whose reply comes past the TTL:
			// the grant it made is given back, and a hand-over heard after
			// it is confirmed by an extension or given back.
			{Script: acquire[len(acquire)-1], Match: inLine, Kind: faults.DelayReply, P: lateLine, Min: (ilLockTTL + 50) * ms, Max: time.Second},
			{Script: "pass", Kind: faults.LoseReply, P: p, Max: 300 * ms},
			{Script: "pass", Kind: faults.DelaySend, P: p, Max: 150 * ms},
			{Script: "extend", Via: faults.Batch, Kind: faults.DelaySend, P: p, Max: 200 * ms}, // a renewal in flight for long
			{Script: "extend", Kind: faults.DelayReply, P: p, Max: 250 * ms},
			{Script: "sem.e", Via: faults.Batch, Kind: faults.DelaySend, P: p, Max: 200 * ms},
			{Script: "sem.e", Kind: faults.DelayReply, P: p, Max: 250 * ms},
			{Script: "str_extend", Via: faults.Batch, Kind: faults.DelaySend, P: p, Max: 200 * ms},
			{Script: "str_extend", Kind: faults.DelayReply, P: p, Max: 250 * ms},
			{Script: "str_release", Kind: faults.LoseReply, P: p / 2, Max: 100 * ms},
			{Script: "multi_acquire", Kind: faults.LoseReply, P: p / 2, Max: 100 * ms},
			// An election's publish on its way past its leader's term.
			{Script: "proclaim", Kind: faults.DelayWrite, P: p, Max: 700 * ms},
			{Kind: faults.DelaySend, P: 0.03 * f, Max: 80 * ms},
			{Kind: faults.DelayReply, P: 0.03 * f, Max: 150 * ms},
			{Kind: faults.LoseReply, P: 0.015 * f, Max: 60 * ms},
			{Kind: faults.FailSend, P: 0.01 * f, Max: 30 * ms},
			{Kind: faults.Cut, P: 0.005 * f},
		},
		Sub:      faults.SubFaults{Delay: 0.1 * sf, MaxDelay: 300 * ms, Refuse: 0.05 * sf, Drop: 0.03 * sf, Unsubscribe: unsub},
		MaxDelay: time.Second,
		Epoch:    w.epoch,
	})
}

func (w *interleaving) now() time.Duration { return time.Since(w.epoch) }

// acquireScripts names the script calls (as faults.Rule.Script does) that
// take the lock of the run's kind: a MultiLock's group acquire, and its
// waits' (and a Mutex's) acquire.lua.
func (w *interleaving) acquireScripts() []string {
	switch w.kind {
	case "mutex":
		return []string{"acquire"}
	case "fair", "election": // an Election is a Fair mutex
		return []string{"fair_acquire"}
	case "multi":
		return []string{"multi_acquire", "acquire"}
	case "string":
		return []string{"str_acquire"}
	}
	return []string{"sem." + wire.SemAcquire}
}

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
	fence := fmt.Sprint(o.fence)
	if o.multi {
		fence = fmt.Sprintf("%q %v", o.names, o.fences)
	} else if strings.HasPrefix(o.via, "Mutex.") { // a Mutex of one name of a MultiLock's pool
		fence = fmt.Sprintf("%d of %q", o.fence, o.names[0])
	}
	return fmt.Sprintf("{client %d%s fence %s permits %d via %s at %.3fs token %s}", o.client, role, fence, o.permits, o.via, o.at.Seconds(), o.l.Token())
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
	if w.topo == ilQuorum {
		chaos.Add(1)
		go func() {
			defer chaos.Done()
			w.skew(rand.New(rand.NewPCG(w.seed, 997)), stop)
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
	if w.kind == "election" {
		w.settle()
	}
	w.mu.Lock()
	t.Logf("profile: %v", w.prof)
	t.Logf("%s seed %d: %d grants, %d checks, ops %v, %d Clients", w.kind, w.seed, w.grants, w.checks, w.ops, len(w.clients))
	var heard uint64
	for _, ic := range w.clients {
		heard += dlock.HandOversHeard(ic.c)
		for i, in := range ic.ins {
			t.Logf("client %d%s faults: %s", ic.gen, w.masterName(i), in.Summary())
		}
	}
	t.Logf("hand-overs heard: %d; late grants given back: %d by Try calls, %d by Lock calls (%d of them waits that started over)", heard, w.ops[lateGrantOp], w.lateLocks.Load(), w.startOvers.Load())
	// Waiters in line at Redis are handed the lock by the release that frees
	// it, and told so by message: most grants of a Fair mutex, an RWMutex
	// or a Semaphore under contention come that way, even with these faults.
	// A line that took its waiters for dead would hand over none. The bound
	// is low: a seed whose profile weighs server pauses and subscription
	// faults heavily makes few grants, and fewer of them heard (7 of 35 in
	// one 3 s run of rw). A default-mode Mutex has no line, and quorum mode
	// has none either (no line spans independent masters).
	// Nor do a string lock (it never hands over) and a MultiLock (its
	// names are default-mode mutexes).
	if w.kind != "mutex" && w.kind != "multi" && w.kind != "string" && w.topo != ilQuorum && heard < uint64(w.grants/10) {
		t.Errorf("only %d of %d grants were hand-overs heard by a waiter in line", heard, w.grants)
	}
	for _, f := range w.fails {
		t.Error(f)
	}
	if len(w.fails) > 0 && os.Getenv("DLOCK_EVENTS") != "" {
		for _, ic := range w.clients {
			for i, in := range ic.ins {
				for _, e := range in.Events(nil) {
					t.Logf("client %d%s event %v", ic.gen, w.masterName(i), e)
				}
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

// masterName names master i of a quorum run in a message ("" otherwise).
func (w *interleaving) masterName(i int) string {
	if w.topo != ilQuorum {
		return ""
	}
	return fmt.Sprintf(" master %d", i)
}

// chaos closes and replaces Clients, pauses the server (one or two
// masters of a quorum, one master of a Cluster) and kills the subscription
// connections, and restarts a quorum master without its data or migrates
// a slot of a Cluster run, at seeded random times, until stop.
func (w *interleaving) chaos(r *rand.Rand, stop <-chan struct{}) {
	t := w.t
	events := 3
	if w.topo == ilQuorum || w.topo == ilCluster {
		events = 4
	}
	for i := 0; i < 1000; i++ { // bounded; the run's end stops it first
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(r.Int64N(int64(2 * w.prof.chaos)))):
		}
		switch r.IntN(events) {
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
			if w.topo == ilCluster {
				w.pauseMaster(r, d)
				continue
			}
			// A quorum's masters: one or two of them (never a majority).
			paused := w.masters
			if w.topo == ilQuorum {
				paused = nil
				for _, j := range r.Perm(len(w.masters))[:1+r.IntN(2)] {
					paused = append(paused, w.masters[j])
				}
			}
			for _, s := range paused {
				s.Pause()
			}
			time.Sleep(d)
			for _, s := range paused {
				s.Resume()
			}
			w.count(fmt.Sprintf("pause %d", len(paused)))
		case 2: // the subscription connections are killed (of some masters)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			for _, plain := range w.plains {
				if len(w.plains) > 1 && r.IntN(2) == 0 {
					continue
				}
				if err := plain.ClientKillByFilter(ctx, "TYPE", "pubsub").Err(); err != nil {
					t.Logf("CLIENT KILL: %v", err)
				}
			}
			cancel()
			w.count("kill pubsub")
		case 3:
			if w.topo == ilCluster {
				w.migrate(r, stop)
				continue
			}
			w.restart(r.IntN(len(w.masters)))
		}
	}
}

// restart restarts quorum master i without its data (SIGKILL, no
// persistence), unless a master restarted less than the restart delay ago:
// one master at a time votes for nobody, so that pausing two more leaves no
// majority for a short while only.
func (w *interleaving) restart(i int) {
	w.mu.Lock()
	for _, r := range w.restarted {
		if r.lost() {
			w.mu.Unlock()
			return
		}
	}
	w.restarted[i] = ilRestart{killed: time.Now(), delay: w.delay} // before: a lease may lose its copy from now on
	w.mu.Unlock()
	w.masters[i].Restart(w.t)
	w.mu.Lock()
	w.restarted[i].up = time.Now()
	w.mu.Unlock()
	loadScripts(w.t, w.plains[i])
	w.count("restart")
}

// ilRestart is a quorum master's last restart.
type ilRestart struct {
	killed, up time.Time // when it was killed; when the new process answered (zero: not yet)
	delay      time.Duration
}

// lost reports whether the master lost its data less than the restart
// delay ago: it may not vote yet.
func (r ilRestart) lost() bool { return !r.killed.IsZero() && time.Since(r.killed) < r.delay }

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

// ilSkewMax bounds how far ahead of the clock skew sets a fence counter:
// below the shortest life of a lock key in a run (an Extend to 40ms), as
// fences in quorum mode need (a counter that expired with its key is
// reseeded from the clock, which must have passed every fence handed out;
// docs/PROTOCOL.md).
const ilSkewMax = 30 * time.Millisecond

// skewScript sets a free lock's fence counter ARGV[1] µs ahead of the
// server's clock, unless it is further ahead already.
var skewScript = redis.NewScript(`
local h = redis.call('HMGET', KEYS[1], 'o', 'f')
if h[1] or not h[2] then return 0 end
local t = redis.call('TIME')
local f = t[1] * 1000000 + t[2] + tonumber(ARGV[1])
if f <= tonumber(h[2]) then return 0 end
redis.call('HSET', KEYS[1], 'f', string.format('%.0f', f))
return 1`)

// skew sets the fence counter of a random quorum master up to ilSkewMax
// ahead of its clock every few tens of milliseconds, until stop, if no
// lease holds it there: the state a master whose clock runs ahead leaves
// behind a lease it granted.
func (w *interleaving) skew(r *rand.Rand, stop <-chan struct{}) {
	hash := wire.KeysOf(wire.DefaultPrefix, w.name).Hash
	for i := 0; i < 10000; i++ { // bounded; the run's end stops it first
		select {
		case <-stop:
			return
		case <-time.After(time.Duration(10+r.IntN(50)) * time.Millisecond):
		}
		plain := w.plains[r.IntN(len(w.plains))]
		ahead := 1 + r.Int64N(ilSkewMax.Microseconds())
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if n, err := skewScript.Run(ctx, plain, []string{hash}, ahead).Int(); err == nil && n == 1 {
			w.count("skew")
		}
		cancel()
	}
}

// round is one worker's turn: obtain the lock, hold it for a while doing
// what a holder may, give it up.
func (w *interleaving) round(r *rand.Rand, slot int) {
	ic := w.slots[slot].Load()
	me, err := w.obtain(r, ic)
	if err != nil {
		w.expected(err, "obtain")
		if w.kind == "election" && r.IntN(2) == 0 {
			w.readLeader(r, ic) // most likely while another leads
		}
		return
	}
	if me == nil {
		return
	}
	w.granted(me)
	if w.topo != ilSingle {
		// At once: the replica must have what was confirmed, a majority of
		// masters what they granted, with its fence.
		w.checkRedis(me)
	}
	w.hold(r, me)
	w.release(r, me)
}

// obtain makes one lock call of a random kind, with random options.
func (w *interleaving) obtain(r *rand.Rand, ic *ilClient) (*ilLease, error) {
	ttl := time.Duration(250+r.IntN(ilLockTTL-250)) * time.Millisecond
	opts := []dlock.LockOption{dlock.TTL(ttl)}
	if r.Float64() < w.prof.noRenew {
		opts = append(opts, dlock.NoRenew())
	}
	wait := time.Duration(r.IntN(300)) * time.Millisecond
	if r.Float64() < w.prof.patient {
		wait = 2 * time.Second
	}
	deadline := time.Now().Add(wait)
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if r.IntN(20) == 0 {
		cancel() // an ended ctx: no lease, nothing left behind
	}
	try := r.IntN(5) == 0
	me := &ilLease{ic: ic, client: ic.gen, permits: 1, called: w.now()}
	var l *dlock.Lease
	var err error
	switch w.kind {
	case "mutex", "fair", "string":
		var m *dlock.Mutex
		switch w.kind {
		case "fair":
			m = ic.c.Mutex(w.name, append(opts, dlock.Fair())...)
		case "string":
			m = ic.c.StringMutex(w.name, opts...)
		default:
			m = ic.c.Mutex(w.name, opts...)
		}
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
	case "election":
		l, err = w.campaign(ctx, ic, opts, me)
	case "multi":
		l, err = w.multiLock(r, ctx, ic, opts, try, me)
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
	w.lateGrants(ic, ttl, l, err)
	if err != nil {
		return nil, err
	}
	w.setLease(me, l)
	return me, nil
}

// setLease makes l me's lease: its names and their fences.
func (w *interleaving) setLease(me *ilLease, l *dlock.Lease) {
	me.l, me.fence, me.names, me.fences = l, l.Fence(), l.Names(), nil
	for _, n := range me.names {
		me.fences = append(me.fences, l.FenceOf(n))
	}
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
		w.setLease(me, inner)
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
		case me.e != nil && r.IntN(4) == 0:
			w.proclaim(r, me)
		case me.e != nil && r.IntN(3) == 0:
			w.readLeader(r, me.ic)
		case r.Float64() < w.prof.extend/2:
			w.extend(r, me)
		case r.Float64() < w.prof.extend/2:
			// Two calls on one lease at once: an Extend while its renewal is
			// on the wire.
			// (In quorum mode a renewal goes to every master at once: the
			// first master's shows it.)
			if me.ic.ins[0].WaitInFlight(300*time.Millisecond, func(c faults.Call) bool { return c.Via == faults.Batch && c.Has(me.l.Token()) }) {
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
		case r.IntN(8) == 0 && (w.kind == "mutex" || w.kind == "fair" || w.kind == "string" || w.kind == "multi" || me.writer):
			w.reenter(r, me)
		}
		if r.Float64() < w.prof.long {
			w.watch(r, time.Duration(r.Int64N(int64(w.prof.longMax))))
		} else {
			time.Sleep(time.Duration(r.IntN(2000)) * time.Microsecond)
		}
		w.check("hold of " + me.String())
		w.checkRedis(nil)
	}
}

// watch waits d, looking at Redis every few tens of milliseconds: a lease
// believed valid beyond its expiry at Redis is seen in that window, whether
// or not someone else takes the lock meanwhile.
func (w *interleaving) watch(r *rand.Rand, d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); {
		time.Sleep(min(time.Until(end), time.Duration(10+r.IntN(30))*time.Millisecond))
		w.checkRedis(nil)
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
	switch {
	case me.multi:
		w.reenterMulti(r, ctx, ic, me)
		return
	case w.kind == "mutex", w.kind == "fair", w.kind == "multi":
		// (Its TTL is not asked for, the holding's stays; but quorum mode
		// refuses one above the restart delay, as DefaultTTL is.)
		opts := []dlock.LockOption{dlock.TTL(w.maxTTL)}
		if w.kind == "fair" {
			opts = append(opts, dlock.Fair())
		}
		inner, err = ic.c.Mutex(me.names[0], opts...).Lock(ctx)
	case w.kind == "string":
		inner, err = ic.c.StringMutex(w.name, dlock.TTL(w.maxTTL)).Lock(ctx)
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
	if me.e != nil && r.IntN(3) == 0 {
		w.resign(r, me)
		return
	}
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
