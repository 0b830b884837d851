package dlock_test

// Review of quorum mode (NewQuorum): each test reproduces one defect on real
// redis-server processes and failed on the code it was written against
// (eae0504). The interleaving is in each test's comment.

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faultproxy"
	"github.com/dlock-go/dlock/internal/faults"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/wire"
	"github.com/redis/go-redis/v9"
)

// faultyMaster returns a go-redis client of s whose script calls get the
// faults of rules, with every script loaded on s first (so that a fault
// never meets NOSCRIPT instead of the script's work).
func faultyMaster(t *testing.T, s *redistest.Server, rules ...faults.Rule) (*redis.Client, *faults.Injector) {
	t.Helper()
	return seededMaster(t, s, 0, rules...)
}

// seededMaster is faultyMaster with the injector's random source seeded.
func seededMaster(t *testing.T, s *redistest.Server, seed uint64, rules ...faults.Rule) (*redis.Client, *faults.Injector) {
	t.Helper()
	for _, sc := range wire.Scripts() {
		s.Do(t, "script", "load", sc.Src)
	}
	in := faults.New(faults.Config{Seed: seed, Scripts: faults.EngineScripts(), Rules: rules, MaxDelay: 5 * time.Second})
	rdb := s.Client(t)
	injectFaults(t, rdb, in)
	return rdb, in
}

// noSecondGrant tries m (another Client's Mutex of l's lock) for at most d,
// until l is no longer believed valid, and fails the test if it obtains
// the lock while l is (two leases at once), or if an attempt errs with
// anything but ErrNotObtained (or, with young, a refusal to vote).
func noSecondGrant(t *testing.T, ctx context.Context, m *dlock.Mutex, l *dlock.Lease, servers []*redistest.Server, d time.Duration, young bool) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end) && stillValid(l); time.Sleep(20 * time.Millisecond) {
		l2, err := m.TryLock(ctx)
		if err == nil {
			held := len(heldOn(t, servers, m.Name(), l.Token()))
			valid := stillValid(l)
			_ = l2.Unlock(ctx)
			if valid {
				t.Fatalf("double grant: a second lease (fence %d) was granted while the first (fence %d) is believed valid; the first holds %d of %d masters",
					l2.Fence(), l.Fence(), held, len(servers))
			}
			return
		}
		if !errors.Is(err, dlock.ErrNotObtained) && !(young && strings.Contains(err.Error(), "not voting")) {
			t.Fatalf("TryLock: %v", err)
		}
	}
}

// TestReviewQuorumRetryKeepsItsGrant: a Lock used one token for all its
// attempts. Attempt 1 is granted on master A but its reply comes after the
// per-master timeout (B failed, C is down: no majority); it is given back,
// and A's late reply schedules one more give-back by token. Attempt 2, with
// the same token, wins A and B. The late give-back then releases A under
// the holder's feet: it holds B alone, and another Client takes A and C
// while the first lease is believed valid.
func TestReviewQuorumRetryKeepsItsGrant(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	servers, rdbs := quorumMasters(t, 3)
	a, _ := faultyMaster(t, servers[0], faults.Rule{Script: "quorum_acquire", Kind: faults.DelayReply, Calls: []int{1}, Min: 2500 * time.Millisecond, Max: 2500 * time.Millisecond})
	b, _ := faultyMaster(t, servers[1], faults.Rule{Script: "quorum_acquire", Kind: faults.FailSend, Calls: []int{1}})
	view := downMasters(t, []redis.UniversalClient{a, b, rdbs[2]}, 2)
	first := newQuorum(t, view, dlock.WithNodeTimeout(100*time.Millisecond))
	l, err := first.Mutex("retried", dlock.TTL(10*time.Second)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(heldOn(t, servers, "retried", l.Token())); n < 2 {
		t.Fatalf("the lease holds %d of 3 masters as Lock returns", n)
	}
	other := newQuorum(t, downMasters(t, rdbs, 1)) // A and C
	noSecondGrant(t, ctx, other.Mutex("retried"), l, servers, 4*time.Second, false)
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// downMasters returns rdbs with the masters at skip replaced by clients of
// a proxy that resets every connection: masters this Client cannot reach.
// (Refused dials would make go-redis retry dialling in the background for
// a second after its client closed, which goleak sees when a test runs
// alone.)
func downMasters(t *testing.T, rdbs []redis.UniversalClient, skip ...int) []redis.UniversalClient {
	t.Helper()
	out := append([]redis.UniversalClient(nil), rdbs...)
	for _, i := range skip {
		p, err := faultproxy.Start("127.0.0.1:1")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close() })
		p.Refuse(true)
		rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), MaxRetries: -1, DisableIdentity: true})
		t.Cleanup(func() { _ = rdb.Close() })
		out[i] = rdb
	}
	return out
}

// sleepToFrac sleeps until the wall clock's fraction of a second is frac
// (in this second if it is still ahead, else in the next).
func sleepToFrac(frac time.Duration) {
	now := time.Now()
	at := now.Truncate(time.Second).Add(frac)
	if !at.After(now) {
		at = at.Add(time.Second)
	}
	time.Sleep(time.Until(at))
}

// epochOf returns the start a master's epoch key records, in ms since the
// Unix epoch.
func epochOf(t *testing.T, s *redistest.Server) int64 {
	t.Helper()
	v, _ := s.Do(t, "get", "dlock:epoch").(string)
	f := strings.Fields(v)
	if len(f) == 0 {
		t.Fatalf("%s has no epoch key", s.Addr())
	}
	ms, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil {
		t.Fatalf("epoch key %q: %v", v, err)
	}
	return ms
}

// TestReviewQuorumRestartedMasterWaitsFullDelay: INFO's uptime_in_seconds
// is the difference of two whole-second clocks (now and the start, each
// rounded down), so it can be up to a second more than the real uptime;
// the epoch computed from it (now - uptime) then lies before the process
// started, and a restarted master votes up to a second before the restart
// delay has passed. With the delay equal to the TTL (the least the
// documentation allows): a lease is granted on A and B at .3 s past a
// second k, A restarts without its data at once, and A is first asked at
// k+1.02 s: its epoch comes out as k.02 instead of after k.3, and from
// k+2.02 s A votes for a contender with C while the lease is valid until
// about k+2.28 s.
func TestReviewQuorumRestartedMasterWaitsFullDelay(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	servers, rdbs := quorumMasters(t, 3)
	const ttl = 2 * time.Second
	first := newQuorum(t, downMasters(t, rdbs, 2), dlock.WithRestartDelay(ttl)) // A and B
	// A's first vote after its restart dials anew and loads the script:
	// more than the default 50 ms per master on a loaded machine, which
	// would make the refusal below an unknown outcome.
	other := newQuorum(t, downMasters(t, rdbs, 1), dlock.WithRestartDelay(ttl), dlock.WithNodeTimeout(time.Second)) // A and C
	sleepToFrac(300 * time.Millisecond)
	l, err := first.Mutex("restarted", dlock.TTL(ttl), dlock.NoRenew()).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	restarted := time.Now()
	servers[0].Restart(t) // without persistence: A forgets the lease
	sleepToFrac(20 * time.Millisecond)
	m := other.Mutex("restarted", dlock.TTL(ttl))
	if _, err := m.TryLock(ctx); err == nil || !strings.Contains(err.Error(), "not voting") {
		t.Fatalf("TryLock just after A restarted: %v, want a refusal to vote", err)
	}
	if e := epochOf(t, servers[0]); e < restarted.UnixMilli() {
		t.Errorf("A's epoch is %v, before its restart began (%v)", time.UnixMilli(e).Format("15:04:05.000"), restarted.Format("15:04:05.000"))
	}
	noSecondGrant(t, ctx, m, l, servers, 4*time.Second, true)
}

// TestReviewQuorumRestartFromOldSnapshot: a master with persistence that
// restarts comes back with what its last snapshot (or fsync) had: its
// epoch key, written long ago, but not the leases it granted since. It
// voted at once, as the epoch key said its data were old, and granted the
// lock again while the lease it had forgotten was valid. Here A's RDB
// snapshot is taken before the lease is granted on A and B; A restarts
// from it, and another Client gets A and C.
func TestReviewQuorumRestartFromOldSnapshot(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	servers, rdbs := quorumMasters(t, 3)
	servers[0].Do(t, "save")                       // A's snapshot: the epoch key, no lease
	first := newQuorum(t, downMasters(t, rdbs, 2)) // A and B
	l, err := first.Mutex("snapshot").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	servers[0].Restart(t) // killed, back from its snapshot
	if servers[0].Do(t, "exists", "dlock:epoch") != int64(1) {
		t.Fatal("A lost its epoch key: the snapshot did not load")
	}
	other := newQuorum(t, downMasters(t, rdbs, 1)) // A and C
	noSecondGrant(t, ctx, other.Mutex("snapshot"), l, servers, 2*time.Second, true)
}

// TestReviewQuorumFailoverToLaggingReplica: a failover client's master is
// replaced by its replica, whose data lag behind: it has the epoch key
// (replicated long ago) but not the lease granted just before the failover
// (replication is asynchronous). It voted at once and granted the lock
// again while that lease was valid. Here the replication link of A is held
// while the lease is granted on A and B; A dies, its replica A' is
// promoted, and another Client gets A' and C (A' stands for A: a failover
// client would now reach it at A's place).
func TestReviewQuorumFailoverToLaggingReplica(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	// A full sync at once, not after Redis's wait for more replicas.
	servers := redistest.Masters(t, 3, redistest.Options{Args: []string{"--repl-diskless-sync-delay", "0"}})
	rdbs := make([]redis.UniversalClient, len(servers))
	for i, s := range servers {
		certifyOld(t, s)
		rdbs[i] = s.Client(t)
	}
	replica, link := redistest.StartReplica(t, servers[0], true)
	link.Hold(faultproxy.Downstream)               // A's writes from now on do not reach A'
	first := newQuorum(t, downMasters(t, rdbs, 2)) // A and B
	l, err := first.Mutex("failover").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	servers[0].Kill()
	replica.Do(t, "replicaof", "no", "one")
	if replica.Do(t, "exists", "dlock:epoch") != int64(1) {
		t.Fatal("A' has no epoch key: it did not sync before the failover")
	}
	view := downMasters(t, []redis.UniversalClient{replica.Client(t), rdbs[1], rdbs[2]}, 1) // A' and C
	other := newQuorum(t, view)
	noSecondGrant(t, ctx, other.Mutex("failover"), l, append([]*redistest.Server{replica}, servers[1:]...), 2*time.Second, true)
}

// TestReviewQuorumFailoverClients: NewQuorum takes "a failover client too",
// but go-redis gives every failover client the address "FailoverClient",
// so NewQuorum refused any two of them as "both FailoverClient: the
// masters must be independent".
func TestReviewQuorumFailoverClients(t *testing.T) {
	skipOnRueidis(t, "the defect is go-redis's address for every failover client; a rueidis Sentinel client is told apart by its primary's address, and is not made without a reachable sentinel")
	rdbs := make([]redis.UniversalClient, 3)
	for i := range rdbs {
		rdbs[i] = redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m" + strconv.Itoa(i), SentinelAddrs: []string{"127.0.0.1:1"}})
		t.Cleanup(func() { _ = rdbs[i].Close() })
	}
	c, err := dlock.NewQuorum(rdbs)
	if err != nil {
		t.Fatalf("NewQuorum of three failover clients: %v", err)
	}
	_ = c.Close()
	if _, err := dlock.NewQuorum([]redis.UniversalClient{rdbs[0], rdbs[1], rdbs[0]}); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Fatalf("NewQuorum with one failover client twice: %v, want ErrInvalidArgument", err)
	}
}

// unanswering returns a client of s through a proxy that drops every
// command: a master that never answers (until the test ends). Its calls
// end with their ctx (ContextTimeoutEnabled), so that no helper goroutine
// waits for go-redis's read timeout when the Client closes. Over rueidis,
// whose NewClient waits for a handshake that never comes, the dial
// timeout bounds that wait (go-redis's bounds only the dial).
func unanswering(t *testing.T, s *redistest.Server) redis.UniversalClient {
	t.Helper()
	p, err := faultproxy.Start(s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	p.Drop(faultproxy.Upstream)
	rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), DisableIdentity: true, MaxRetries: -1, ContextTimeoutEnabled: true, DialTimeout: 500 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	return rdb
}

// TestReviewQuorumWaiterAfterSplitVote: a Lock counted every "held by
// another owner" reply toward one majority, whoever the owners were. Two
// contenders' attempts hold A, B and C, D for a moment (each waits for the
// masters that do not answer it, then gives back); a waiter that looks
// then finds four of five masters held, takes that for a holder with a
// majority, and sleeps for the longest lease it was told of (30 s here)
// or a release: but the contenders give back without waking anyone (their
// payload 0 wakes nobody), so it slept 30 s on a free lock.
func TestReviewQuorumWaiterAfterSplitVote(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	servers, rdbs := quorumMasters(t, 5)
	const ttl = 30 * time.Second
	// Both contenders are made before either tries, so that their
	// attempts overlap however long making them takes.
	contender := func(mine ...int) func() {
		view := make([]redis.UniversalClient, 5)
		for i, s := range servers {
			if !slices.Contains(mine, i) {
				view[i] = unanswering(t, s)
			}
		}
		for _, i := range mine {
			view[i] = rdbs[i]
		}
		c := newQuorum(t, view, dlock.WithNodeTimeout(time.Second))
		return func() {
			go func() {
				if _, err := c.Mutex("split-vote", dlock.TTL(ttl)).TryLock(ctx); err == nil {
					t.Error("a contender with two of five masters got the lock")
				}
			}()
		}
	}
	first, second := contender(0, 1), contender(2, 3)
	first()
	second()
	waitFor(t, ctx, "the contenders to hold A, B, C and D", func() bool {
		for _, s := range servers[:4] {
			if s.Do(t, "hget", "dlock:{split-vote}", "o") == nil {
				return false
			}
		}
		return true
	})
	waiter := newQuorum(t, rdbs)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second) // a third of the contenders' TTL
	defer cancel()
	l, err := waiter.Mutex("split-vote", dlock.TTL(ttl)).Lock(wctx)
	if err != nil {
		t.Fatalf("Lock of a lock that nobody held for more than a second: %v", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestReviewQuorumShortErrCountsEveryVote: an attempt stopped counting once
// no majority could grant, and put the masters that answered later among
// those that "did not answer", grants included. Here A and B are new (not
// voting yet) and C grants, a little late: the error said "0 of 3 masters
// granted ... 1 did not answer".
func TestReviewQuorumShortErrCountsEveryVote(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	servers := redistest.Masters(t, 3)
	certifyOld(t, servers[2])
	c, _ := faultyMaster(t, servers[2], faults.Rule{Script: "quorum_acquire", Kind: faults.DelayReply, P: 1, Min: 100 * time.Millisecond, Max: 100 * time.Millisecond})
	q := newQuorum(t, []redis.UniversalClient{servers[0].Client(t), servers[1].Client(t), c}, dlock.WithNodeTimeout(time.Second))
	_, err := q.Mutex("counted").TryLock(ctx)
	if err == nil || !strings.Contains(err.Error(), "1 of 3 masters granted") || !strings.Contains(err.Error(), "2 not voting") || !strings.Contains(err.Error(), "0 did not answer") {
		t.Fatalf("TryLock with A and B not voting and C granting: %v, want 1 granted, 2 not voting, 0 did not answer", err)
	}
	if o := servers[2].Do(t, "hget", "dlock:{counted}", "o"); o != nil {
		t.Fatalf("C still holds the failed attempt's grant (owner %v)", o)
	}
}

// TestReviewQuorumCloseGivesBackLateGrant: a master that runs an acquire
// after its per-master timeout gives back its late grant when the reply
// comes, on a goroutine of the Client; but once Close had begun no
// goroutine could start (and the give-back's ctx ended with the Client),
// so the grant stayed on that master until its TTL. Here A runs the
// TryLock's acquire 400 ms late; B and C grant, Close releases them (and
// A, which has nothing yet), then A grants, and nothing gave it back.
func TestReviewQuorumCloseGivesBackLateGrant(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	servers, rdbs := quorumMasters(t, 3)
	a, _ := faultyMaster(t, servers[0], faults.Rule{Script: "quorum_acquire", Kind: faults.DelayWrite, Calls: []int{1}, Min: 400 * time.Millisecond, Max: 400 * time.Millisecond})
	q := newQuorum(t, []redis.UniversalClient{a, rdbs[1], rdbs[2]}, dlock.WithNodeTimeout(100*time.Millisecond))
	if _, err := q.Mutex("closed").TryLock(ctx); err != nil {
		t.Fatal(err)
	}
	_ = q.Close() // returns once A's late reply has been dealt with
	for _, s := range servers {
		if o := s.Do(t, "hget", "dlock:{closed}", "o"); o != nil {
			t.Errorf("%s still holds the lock (owner %v, PTTL %v ms) after Close", s.Addr(), o, s.Do(t, "pttl", "dlock:{closed}"))
		}
	}
}

// TestReviewQuorumUnlockBeforeSlowGrant: an acquire is decided by the first
// majority; a master that grants after that, in time, keeps the grant "until
// Unlock". But an Unlock sent before that master ran the acquire finds
// nothing there, and the grant that follows stayed until its TTL. Here A
// runs the TryLock's acquire 100 ms late (within its 300 ms timeout); B and
// C grant at once, the lease is unlocked at once, and then A holds it.
func TestReviewQuorumUnlockBeforeSlowGrant(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	servers, rdbs := quorumMasters(t, 3)
	a, in := faultyMaster(t, servers[0], faults.Rule{Script: "quorum_acquire", Kind: faults.DelayWrite, Calls: []int{1}, Min: 100 * time.Millisecond, Max: 100 * time.Millisecond})
	q := newQuorum(t, []redis.UniversalClient{a, rdbs[1], rdbs[2]}, dlock.WithNodeTimeout(300*time.Millisecond))
	l, err := q.Mutex("slow-grant").TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	isAcquire := func(c faults.Call) bool { return c.Script == "quorum_acquire" }
	waitFor(t, ctx, "A's acquire to be answered", func() bool { return !in.InFlight(isAcquire) })
	// What follows A's reply runs in the background: waited for, 5 s at
	// most (a loaded machine may take more than the second this allowed),
	// half the 10 s TTL of A's grant, so that a grant nothing releases is
	// still there when looked at.
	freedOnAllWithin(t, servers[:1], "slow-grant", "after A's acquire was answered, the lease unlocked", 5*time.Second)
}

// TestReviewQuorumTTLTooShortIsRefused: a quorum lease is valid for its TTL
// less 1% and 2 ms after its first send, so a TTL of 2 ms or less can never
// be valid. TryLock said the validity "ran out while the masters answered"
// (as if they had been slow), Lock retried for as long as its ctx lasted,
// granting and giving back on every master each time, and Extend to such a
// TTL was accepted (and the lease then lost).
func TestReviewQuorumTTLTooShortIsRefused(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	_, rdbs := quorumMasters(t, 3)
	q := newQuorum(t, rdbs)
	short := q.Mutex("short", dlock.TTL(2*time.Millisecond))
	if _, err := short.TryLock(ctx); !errors.Is(err, dlock.ErrInvalidArgument) || !strings.Contains(err.Error(), "TTL 2ms") {
		t.Errorf("TryLock with TTL 2ms: %v, want ErrInvalidArgument naming the TTL", err)
	}
	lctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if _, err := short.Lock(lctx); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Errorf("Lock with TTL 2ms: %v, want ErrInvalidArgument", err)
	}
	l, err := q.Mutex("short").TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Extend(ctx, 2*time.Millisecond); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Errorf("Extend to 2ms: %v, want ErrInvalidArgument", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("Unlock after a refused Extend: %v", err)
	}
}

// TestReviewQuorumFrozenMasterWithinCtx: a frozen server costs a call at
// most its ctx. A quorum attempt that failed gave back what it took on
// every master before returning, each give-back bounded by the per-master
// timeout but not by the caller's ctx: with C frozen and a 5 s per-master
// timeout, a TryLock with a 300 ms ctx took 5.3 s.
func TestReviewQuorumFrozenMasterWithinCtx(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	servers, rdbs := quorumMasters(t, 3)
	holder := newQuorum(t, downMasters(t, rdbs, 2)) // A and B
	l, err := holder.Mutex("frozen").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	q := newQuorum(t, rdbs, dlock.WithNodeTimeout(5*time.Second))
	servers[2].Pause()
	defer servers[2].Resume()
	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if _, err := q.Mutex("frozen").TryLock(dctx); err == nil {
		t.Fatal("TryLock of a held lock succeeded")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("TryLock took %v past a 300ms ctx", d)
	}
	servers[2].Resume()
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestReviewQuorumCloseWithMasterDown: Close released the held leases one
// after another within its 3 s budget, each release waiting for every
// master within the per-master timeout: with a master that does not
// answer, each cost that timeout, the budget ran out, and the rest of the
// leases stayed locked on every master until their TTL. Here 60 leases,
// C frozen, a 100 ms per-master timeout: Close left about 30 of them held
// on A and B. Close now releases them in one pipeline per master.
func TestReviewQuorumCloseWithMasterDown(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	servers, _ := quorumMasters(t, 3)
	rdbs := make([]redis.UniversalClient, len(servers))
	for i, s := range servers {
		// Calls that end with their ctx: Close does not wait for go-redis's
		// read timeouts on the frozen master (see aside).
		rdbs[i] = s.Client(t, func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	}
	q, err := newQuorumOrErr(t, rdbs, dlock.WithNodeTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	servers[2].Pause()
	defer servers[2].Resume()
	const n = 60
	for i := range n {
		if _, err := q.Mutex("down-" + strconv.Itoa(i)).TryLock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	_ = q.Close()
	left := 0
	for i := range n {
		if servers[0].Do(t, "hget", "dlock:{down-"+strconv.Itoa(i)+"}", "o") != nil {
			left++
		}
	}
	if left > 0 {
		t.Fatalf("%d of %d leases still held on A after Close", left, n)
	}
}

// TestReviewQuorumInterleavings explores quorum mode under seeded faults:
// three Clients over five masters, each Client's view of each master with
// writes and replies delayed, replies lost and connections cut at random;
// six workers lock one name (short TTL, renewed) for random short whiles.
// Whenever a lease is obtained, no other lease may still be believed valid,
// and its fence must be above every fence obtained before. DLOCK_CHAOS sets
// the duration (default 3s), DLOCK_SEED replays a seed. (On eae0504, a
// 25 s run found three double grants: a Lock's retries shared one token.)
func TestReviewQuorumInterleavings(t *testing.T) {
	if len(shareOf(t.Name(), []string{"mutex"})) == 0 {
		t.Skip("drawn out of this pass, as half the chaos runs are (DLOCK_CHAOS_ROUNDS=1 runs it)")
	}
	dur := 3 * time.Second
	if v := os.Getenv("DLOCK_CHAOS"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			t.Fatalf("DLOCK_CHAOS=%q: want a positive duration", v)
		}
		dur = d
	}
	seed, replay := envSeed(t)
	if !replay {
		seed = rand.Uint64N(1 << 40)
	}
	defer func() {
		if t.Failed() {
			t.Logf("replay: %sDLOCK_SEED=%d DLOCK_CHAOS=%v go test -race -count=1 -run '^TestReviewQuorumInterleavings$' .", driverPrefix(), seed, dur)
		}
	}()
	ctx := ctxT(t, dur+30*time.Second)
	servers, _ := quorumMasters(t, 5)
	ms := time.Millisecond
	var clients []*dlock.Client
	for ci := range 3 {
		view := make([]redis.UniversalClient, len(servers))
		for i, s := range servers {
			view[i], _ = seededMaster(t, s, seed*100+uint64(ci*10+i),
				faults.Rule{Kind: faults.DelayWrite, P: 0.1, Max: 120 * ms},
				faults.Rule{Kind: faults.DelayReply, P: 0.1, Max: 120 * ms},
				faults.Rule{Kind: faults.LoseReply, P: 0.05, Max: 60 * ms},
				faults.Rule{Kind: faults.Cut, P: 0.03},
			)
		}
		clients = append(clients, newQuorum(t, view, dlock.WithNodeTimeout(50*ms)))
	}
	var mu sync.Mutex
	inside := map[*dlock.Lease]bool{}
	var maxFence uint64
	grants := 0
	var wg sync.WaitGroup
	end := time.Now().Add(dur)
	for w := range 6 {
		r := rand.New(rand.NewPCG(seed, uint64(w)))
		wg.Go(func() {
			c := clients[w%len(clients)]
			for time.Now().Before(end) && ctx.Err() == nil {
				lctx, cancel := context.WithTimeout(ctx, time.Second)
				l, err := c.Mutex("interleaved", dlock.TTL(400*ms)).Lock(lctx)
				cancel()
				if err != nil {
					continue
				}
				mu.Lock()
				for o := range inside {
					if stillValid(o) && stillValid(l) {
						t.Errorf("double grant: fences %d and %d both believed valid", o.Fence(), l.Fence())
					}
				}
				if l.Fence() <= maxFence {
					t.Errorf("fence %d obtained after fence %d", l.Fence(), maxFence)
				}
				maxFence = max(maxFence, l.Fence())
				inside[l] = true
				grants++
				mu.Unlock()
				time.Sleep(time.Duration(r.IntN(120)) * ms)
				mu.Lock()
				delete(inside, l)
				mu.Unlock()
				_ = l.Unlock(context.Background())
			}
		})
	}
	wg.Wait()
	if grants == 0 {
		t.Fatal("no lease was obtained")
	}
	t.Logf("seed %d: %d leases in %v", seed, grants, dur)
}

// TestReviewQuorumUnlockErrorSaysReleaseOnce: an Unlock whose release no
// majority answered said "release: release: 0 of 3 masters answered"
// (the quorum's message and Unlock's each began with "release").
func TestReviewQuorumUnlockErrorSaysReleaseOnce(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	servers, _ := quorumMasters(t, 3)
	rdbs := make([]redis.UniversalClient, len(servers))
	for i, s := range servers {
		rdbs[i] = s.Client(t, func(o *redis.Options) { o.ContextTimeoutEnabled = true })
	}
	q := newQuorum(t, rdbs)
	l, err := q.Mutex("said").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range servers {
		s.Pause()
		defer s.Resume()
	}
	uctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	defer cancel()
	err = l.Unlock(uctx)
	if err == nil || strings.Count(err.Error(), "release") != 1 || !strings.Contains(err.Error(), "0 of 3 masters answered") {
		t.Fatalf("Unlock with every master frozen: %v, want one 'release' and '0 of 3 masters answered'", err)
	}
	for _, s := range servers {
		s.Resume()
	}
}
