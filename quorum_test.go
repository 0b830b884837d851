package dlock_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faults"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/wire"
	"github.com/dlock-go/dlock/rueidisdlock"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// quorumMasters starts n independent masters whose data the test knows to
// be new: their epoch keys are set to long ago, so they vote at once (a
// master's first use otherwise waits out the restart delay).
func quorumMasters(t testing.TB, n int, opts ...redistest.Options) ([]*redistest.Server, []redis.UniversalClient) {
	t.Helper()
	servers := redistest.Masters(t, n, opts...)
	rdbs := make([]redis.UniversalClient, n)
	for i, s := range servers {
		certifyOld(t, s)
		rdbs[i] = s.Client(t)
	}
	return servers, rdbs
}

// certifyOld lets s vote at once (it is new: see redistest.SetOldEpoch).
func certifyOld(t testing.TB, s *redistest.Server) { t.Helper(); s.SetOldEpoch(t, "dlock:epoch") }

// newQuorum returns a quorum Client over rdbs' masters, through the
// driver DLOCK_DRIVER names (see newQuorumOrErr), closed when the test
// ends.
func newQuorum(t testing.TB, rdbs []redis.UniversalClient, opts ...dlock.Option) *dlock.Client {
	t.Helper()
	c, err := newQuorumOrErr(t, rdbs, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// newQuorumOrErr is dlock.NewQuorum(rdbs, opts...) by default; with
// DLOCK_DRIVER=rueidis, rueidisdlock.NewQuorum over a rueidis client made
// from each of rdbs as newDlock makes one (nil for nil), with the Injector
// that injectFaults gave it. A master not reached yet is no error, as
// under go-redis: its client is made anyway and dials again at each call
// (see newRueidis); any other failure to make a client fails the test.
func newQuorumOrErr(t testing.TB, rdbs []redis.UniversalClient, opts ...dlock.Option) (*dlock.Client, error) {
	t.Helper()
	if !onRueidis() {
		return dlock.NewQuorum(rdbs, opts...)
	}
	clients := make([]rueidis.Client, len(rdbs))
	for i, rdb := range rdbs {
		if rdb == nil {
			continue
		}
		rc, err := newRueidis(t, rdb)
		if rc == nil {
			t.Fatalf("%s=rueidis: a rueidis client for master %d: %v", driverEnv, i, err)
		}
		clients[i] = rc
	}
	return rueidisdlock.NewQuorum(clients, opts...)
}

func TestQuorumMutexBasics(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	servers, rdbs := quorumMasters(t, 5)
	a, b := newQuorum(t, rdbs), newQuorum(t, rdbs)
	m := a.Mutex("basics", dlock.TTL(2*time.Second))
	l, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	holders := 0
	for _, s := range servers {
		if s.Do(t, "hget", "dlock:{basics}", "o") == l.Token() {
			holders++
		}
	}
	if holders < 3 {
		t.Fatalf("the lease is held on %d of 5 masters", holders)
	}
	if _, err := b.Mutex("basics").TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock of a held lock: %v, want ErrNotObtained", err)
	}
	if ttl, err := l.TTL(ctx); err != nil || ttl <= 0 || ttl > 2*time.Second {
		t.Fatalf("TTL: %v, %v", ttl, err)
	}
	if err := l.Extend(ctx, 3*time.Second); err != nil {
		t.Fatal(err)
	}
	// Renewal keeps it past its TTL.
	time.Sleep(4 * time.Second)
	if err := l.Context().Err(); err != nil {
		t.Fatalf("renewed lease ended: %v", context.Cause(l.Context()))
	}
	waited := make(chan *dlock.Lease)
	go func() {
		l2, err := b.Mutex("basics").Lock(ctx)
		if err != nil {
			t.Error(err)
		}
		waited <- l2
	}()
	time.Sleep(100 * time.Millisecond)
	released := time.Now()
	f1 := l.Fence()
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l2 := <-waited
	if l2 == nil {
		return
	}
	if d := time.Since(released); d > time.Second {
		t.Fatalf("waiter took the lock %v after the release: not woken", d)
	}
	if l2.Fence() <= f1 {
		t.Fatalf("fence %d after %d", l2.Fence(), f1)
	}
	if err := l2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// Unlock returns once a majority released; Close waits for the
	// releases still on their way to the others: b's of l2, and a's of l
	// (which may come after l2's grants on the other masters).
	_ = a.Close()
	_ = b.Close()
	freeOnAll(t, servers, "basics", "after unlock")
}

func TestQuorumBadSettings(t *testing.T) {
	ctx := ctxT(t, 10*time.Second)
	_, rdbs := quorumMasters(t, 3)
	// A go-redis ClusterClient is refused for its type, a rueidis client
	// for its mode, which rueidis learns from a cluster it reached.
	var cluster redis.UniversalClient = redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer cluster.Close()
	isCluster := "a *redis.ClusterClient"
	if onRueidis() {
		cluster, isCluster = redistest.ClusterClient(t, redistest.Cluster(t, 1)), "a Cluster client"
	}
	for _, c := range []struct {
		name string
		rdbs []redis.UniversalClient
		opts []dlock.Option
		want string
	}{
		{"two masters", rdbs[:2], nil, "at least 3"},
		{"same master twice", []redis.UniversalClient{rdbs[0], rdbs[1], rdbs[0]}, nil, "masters 0 and 2 are both " + rdbs[0].(*redis.Client).Options().Addr},
		{"a cluster", []redis.UniversalClient{rdbs[0], rdbs[1], cluster}, nil, "master 2 is " + isCluster},
		{"no client", []redis.UniversalClient{rdbs[0], nil, rdbs[2]}, nil, "master 1 is"},
		{"replica ack", rdbs, []dlock.Option{dlock.WithReplicaAck(1, time.Second)}, "WithReplicaAck"},
		{"node timeout", rdbs, []dlock.Option{dlock.WithNodeTimeout(0)}, "WithNodeTimeout"},
		{"restart delay", rdbs, []dlock.Option{dlock.WithRestartDelay(-time.Second)}, "WithRestartDelay"},
		{"prefix", rdbs, []dlock.Option{dlock.WithPrefix("a{}:")}, "prefix"},
	} {
		q, err := newQuorumOrErr(t, c.rdbs, c.opts...)
		if !errors.Is(err, dlock.ErrInvalidArgument) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want ErrInvalidArgument naming %q", c.name, err, c.want)
		}
		if q != nil {
			t.Errorf("%s: a Client with the error", c.name)
			_ = q.Close()
		}
	}
	// Quorum options on a one-server Client are refused by its locks.
	one := newDlock(t, rdbs[0], dlock.WithRestartDelay(time.Second))
	defer one.Close()
	if _, err := one.Mutex("x").TryLock(ctx); !errors.Is(err, dlock.ErrInvalidArgument) || !strings.Contains(err.Error(), "NewQuorum only") {
		t.Errorf("WithRestartDelay on New: %v", err)
	}
	q := newQuorum(t, rdbs, dlock.WithRestartDelay(5*time.Second))
	for what, lock := range map[string]func() error{
		"RWMutex":   func() error { _, err := q.RWMutex("x").Lock(ctx); return err },
		"Semaphore": func() error { _, err := q.Semaphore("x", 2).Acquire(ctx, 1); return err },
		"Fair":      func() error { _, err := q.Mutex("x", dlock.Fair()).TryLock(ctx); return err },
	} {
		if err := lock(); !errors.Is(err, errors.ErrUnsupported) {
			t.Errorf("%s in quorum mode: %v, want errors.ErrUnsupported", what, err)
		}
	}
	if _, err := q.Mutex("x", dlock.TTL(6*time.Second)).TryLock(ctx); !errors.Is(err, dlock.ErrInvalidArgument) || !strings.Contains(err.Error(), "restart delay") {
		t.Errorf("TTL above the restart delay: %v", err)
	}
	l, err := q.Mutex("x", dlock.TTL(time.Second)).TryLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Extend(ctx, 6*time.Second); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Errorf("Extend above the restart delay: %v", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestQuorumYoungMastersDoNotVote: a master whose data began less than the
// restart delay ago (here: just started, with no epoch key) does not vote
// until the delay has passed since it started, and one that restarted
// without persistence stops voting again.
func TestQuorumYoungMastersDoNotVote(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	servers := redistest.Masters(t, 3)
	rdbs := make([]redis.UniversalClient, len(servers))
	for i, s := range servers {
		rdbs[i] = s.Client(t)
	}
	const delay = 2 * time.Second
	q := newQuorum(t, rdbs, dlock.WithRestartDelay(delay))
	m := q.Mutex("young", dlock.TTL(time.Second))
	start := time.Now()
	_, err := m.TryLock(ctx)
	if err == nil || errors.Is(err, dlock.ErrNotObtained) || !strings.Contains(err.Error(), "not voting") {
		t.Fatalf("TryLock on masters up for under the restart delay: %v, want an error saying they do not vote", err)
	}
	var l *dlock.Lease
	for l == nil {
		if time.Since(start) > delay+5*time.Second {
			t.Fatalf("masters never voted: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
		l, err = m.TryLock(ctx)
	}
	if time.Since(start) < delay-time.Second { // uptime is in whole seconds
		t.Fatalf("masters voted %v after they started, before the restart delay", time.Since(start))
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// Unlock returns once two released: a lease still on master 2 would
	// answer the TryLock below "held", not "not voting".
	releasedOnAll(t, servers, "young", "after Unlock")
	// Two masters restart without their data: no majority votes.
	servers[0].Restart(t)
	servers[1].Restart(t)
	if _, err := m.TryLock(ctx); err == nil || !strings.Contains(err.Error(), "not voting") {
		t.Fatalf("TryLock with two of three masters restarted: %v, want not voting", err)
	}
}

// TestQuorumFenceAfterMajorityMissesLargest: a grant whose majority
// includes the master with the largest counter gets that counter as its
// fence; a later grant whose majority misses that master must still get a
// larger one (the first grant raised the counter on its whole majority).
func TestQuorumFenceAfterMajorityMissesLargest(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	servers, rdbs := quorumMasters(t, 5)
	const big = "9000000000000000"
	servers[2].Do(t, "hset", "dlock:{fenced}", "f", big)
	without := func(skip ...int) []redis.UniversalClient { return downMasters(t, rdbs, skip...) }
	first := newQuorum(t, without(3, 4)) // its majority: masters 0, 1, 2
	l, err := first.Mutex("fenced").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := strconv.FormatUint(l.Fence(), 10); got <= big || len(got) != len(big) {
		t.Fatalf("first fence %s, want above the largest counter %s", got, big)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	second := newQuorum(t, without(2)) // its majority misses master 2
	l2, err := second.Mutex("fenced").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l2.Fence() <= l.Fence() {
		t.Fatalf("second fence %d is not above the first %d: its majority missed the largest counter", l2.Fence(), l.Fence())
	}
	if err := l2.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestQuorumMinorityIsNotEnough: with the lock held on masters 0-2, a
// contender that gets masters 3 and 4 has no majority: not obtained, and
// what it took on 3 and 4 is given back.
func TestQuorumMinorityIsNotEnough(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	servers, rdbs := quorumMasters(t, 5)
	holder := newQuorum(t, downMasters(t, rdbs, 3, 4))
	l, err := holder.Mutex("split").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	other := newQuorum(t, rdbs)
	if _, err := other.Mutex("split").TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock with 2 of 5 masters free: %v, want ErrNotObtained", err)
	}
	// A grant whose reply came after its per-master timeout is given back
	// in the background (waited for, below the 10 s TTL).
	releasedOnAll(t, servers[3:], "split", "after a failed attempt's give-back")
	if err := l.Context().Err(); err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestQuorumRenewalNeedsMajority: once three of five masters no longer
// have the lease (an operator deleted it there), the next renewal cannot
// get a majority and the lease ends with ErrLockLost, before its deadline.
func TestQuorumRenewalNeedsMajority(t *testing.T) {
	ctx := ctxT(t, 20*time.Second)
	servers, rdbs := quorumMasters(t, 5)
	q := newQuorum(t, rdbs)
	l, err := q.Mutex("renewed", dlock.TTL(3*time.Second)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Lock returns once three granted: a master whose grant comes after
	// the deletes below would make three owners again (seen once under
	// load).
	grantedOnAll(t, ctx, servers, "renewed", l)
	for _, s := range servers[:3] {
		s.Do(t, "del", "dlock:{renewed}")
	}
	select {
	case <-l.Context().Done():
	case <-time.After(5 * time.Second): // past its deadline, unless renewals wrongly went on
		t.Fatal("the lease outlived the renewals that found it on 2 of 5 masters")
	}
	if !errors.Is(context.Cause(l.Context()), dlock.ErrLockLost) {
		t.Fatalf("cause %v, want ErrLockLost", context.Cause(l.Context()))
	}
	if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Unlock of a lost lease: %v", err)
	}
}

// TestQuorumUnlockLeavesNoGrant: Lock returns once a majority granted,
// while the other masters' acquires may not have run yet; the release
// must not overtake them (on other connections), or their grants stay
// until the TTL and a later Lock with a master down finds no majority.
// Serial cycles make the overtaking likely; after them no master may name
// an owner.
func TestQuorumUnlockLeavesNoGrant(t *testing.T) {
	ctx := ctxT(t, 60*time.Second)
	servers, rdbs := quorumMasters(t, 5)
	c := newQuorum(t, rdbs)
	m := c.Mutex("overtaken")
	for range 1000 {
		l, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	_ = c.Close() // waits for the releases still on their way
	freeOnAll(t, servers, "overtaken", "after every lease was unlocked")
}

// TestQuorumTryLockNoMajorityGivesBack: with 3 of 5 masters down a TryLock
// fails, and the 2 live masters that granted are released before it
// returns (those down are released in the background). The per-master
// timeout is one the live masters answer within on a loaded machine (not
// 20 ms): a grant whose reply came after it would be in doubt, and given
// back in the background as well.
func TestQuorumTryLockNoMajorityGivesBack(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	servers, rdbs := quorumMasters(t, 5)
	for _, s := range servers[2:] {
		s.Kill()
	}
	c := newQuorum(t, rdbs, dlock.WithNodeTimeout(250*time.Millisecond))
	for range 5 {
		if l, err := c.Mutex("partial").TryLock(ctx); err == nil {
			_ = l.Unlock(ctx)
			t.Fatal("TryLock obtained a lock on 2 of 5 masters")
		}
		freeOnAll(t, servers[:2], "partial", "after a failed TryLock")
	}
}

// TestQuorumLockWaitsWithMastersDown: a Lock that has to wait, with 2 of 5
// masters down, gets the lock when the holder unlocks. Its wait for the
// masters' subscriptions is bounded once for all: the down masters never
// confirm theirs, and a bound that ended the wait for the first of them
// only left the Lock waiting for the second until its ctx ended.
func TestQuorumLockWaitsWithMastersDown(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	servers, rdbs := quorumMasters(t, 5)
	for _, s := range servers[3:] {
		s.Kill()
	}
	a, b := newQuorum(t, rdbs), newQuorum(t, rdbs)
	l, err := a.Mutex("down").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	got := async(t, wctx, b.Mutex("down").Lock)
	time.Sleep(100 * time.Millisecond)
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l2, err := got()
	if err != nil {
		t.Fatalf("the waiter, after the holder unlocked: %v", err)
	}
	_ = l2.Unlock(ctx)
}

func TestQuorumLateAnswerOfAnEarlierAttempt(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	servers, rdbs := quorumMasters(t, 3)
	late := time.Second
	rules := [][]faults.Rule{
		// The first attempt's answer comes long after the master's timeout.
		{{Script: "quorum_acquire", Kind: faults.DelaySend, Calls: []int{1}, Min: late}},
		// The first attempt gets no majority; the second gets one without m2.
		{{Script: "quorum_acquire", Kind: faults.FailSend, Calls: []int{1}}},
		{{Script: "quorum_acquire", Kind: faults.FailSend, Calls: []int{2}}},
	}
	var faulty []redis.UniversalClient
	var first *faults.Injector
	for i, s := range servers {
		loadScripts(t, rdbs[i].(*redis.Client))
		in := faults.New(faults.Config{Scripts: faults.EngineScripts(), Rules: rules[i], MaxDelay: 2 * late})
		if i == 0 {
			first = in
		}
		rdb := s.Client(t)
		injectFaults(t, rdb, in)
		faulty = append(faulty, rdb)
	}
	a, b := newQuorum(t, faulty), newQuorum(t, rdbs)
	// A TTL whose first renewal comes well after the late answer.
	l, err := a.Mutex("late", dlock.TTL(20*time.Second)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Unlock(ctx) }()
	if !first.WaitInFlight(time.Second, func(faults.Call) bool { return true }) {
		t.Fatal("the first attempt's call to master 0 is not in flight")
	}
	for first.InFlight(func(faults.Call) bool { return true }) {
		time.Sleep(time.Millisecond)
	}
	holders := func() (n int) {
		for _, s := range servers {
			if s.Do(t, "hget", "dlock:{late}", "o") == l.Token() {
				n++
			}
		}
		return n
	}
	// What a late answer sets off runs in the background: look for a while.
	for end := time.Now().Add(500 * time.Millisecond); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if n := holders(); n < 2 {
			t.Errorf("the lease is held on %d of 3 masters after the first attempt's late answer (believed valid: %v)", n, l.Context().Err() == nil)
			break
		}
	}
	if l2, err := b.Mutex("late").TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("another Client's TryLock while the lease is valid (%v): %v, %v", context.Cause(l.Context()), l2, err)
	}
}

func TestQuorumFirstUseBesideOtherCalls(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	servers := redistest.Masters(t, 3)
	for round := range 10 {
		rdbs := make([]redis.UniversalClient, len(servers))
		for i, s := range servers {
			rdbs[i] = s.Client(t)
		}
		c := newQuorum(t, rdbs, dlock.WithRestartDelay(0))
		done := make(chan error, 1)
		go func() {
			l, err := c.Mutex("first").TryLock(ctx)
			if err == nil {
				err = l.Unlock(ctx)
			}
			done <- err
		}()
		for _, r := range rdbs {
			if err := r.Ping(ctx).Err(); err != nil {
				t.Fatal(err)
			}
		}
		if err := <-done; err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
	}
}

func TestQuorumMajorityTooLate(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	servers, rdbs := quorumMasters(t, 3)
	faulty := func(rule faults.Rule) *dlock.Client {
		var fr []redis.UniversalClient
		for i, s := range servers {
			loadScripts(t, rdbs[i].(*redis.Client))
			rdb := s.Client(t)
			injectFaults(t, rdb, faults.New(faults.Config{Scripts: faults.EngineScripts(), Rules: []faults.Rule{rule}}))
			fr = append(fr, rdb)
		}
		return newQuorum(t, fr, dlock.WithNodeTimeout(time.Second))
	}
	for _, tc := range []struct {
		what  string
		c     *dlock.Client
		ttl   time.Duration
		ahead func(master int) time.Duration // each master's counter, ahead of the clock
	}{{
		what: "validity",
		// Every grant comes back after the lease's TTL; the counters are
		// the same, so that no raise is needed.
		c:     faulty(faults.Rule{Script: "quorum_acquire", Kind: faults.DelayReply, P: 1, Min: 200 * time.Millisecond}),
		ttl:   100 * time.Millisecond,
		ahead: func(int) time.Duration { return time.Hour },
	}, {
		what: "fence",
		// Every raise fails, and the counters differ, so that one is needed.
		c:     faulty(faults.Rule{Script: "quorum_fence", Kind: faults.FailSend, P: 1}),
		ttl:   5 * time.Second,
		ahead: func(i int) time.Duration { return time.Duration(i+1) * time.Hour },
	}} {
		name := "late-" + tc.what
		now := time.Now()
		for i, s := range servers {
			s.Do(t, "hset", "dlock:{"+name+"}", "f", now.Add(tc.ahead(i)).UnixMicro())
		}
		_, err := tc.c.Mutex(name, dlock.TTL(tc.ttl)).TryLock(ctx)
		if !errors.Is(err, dlock.ErrNotObtained) {
			t.Errorf("%s: TryLock: %v, want ErrNotObtained", tc.what, err)
		}
		freeOnAll(t, servers, name, tc.what)
	}
}

func TestQuorumEpochNotBeforeRestart(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	servers, rdbs := quorumMasters(t, 3)
	conclusive := 0
	for range 3 {
		// Kill at the middle of a second; certify just after the next one.
		now := time.Now()
		time.Sleep(now.Truncate(time.Second).Add(1500*time.Millisecond).Sub(now) % time.Second)
		killed := time.Now()
		servers[0].Restart(t)
		up := time.Now()
		next := killed.Truncate(time.Second).Add(time.Second)
		time.Sleep(time.Until(next.Add(30 * time.Millisecond)))
		// A new Client certifies each master at its first call. The
		// per-master timeout is generous: on a loaded machine the restarted
		// master's first answer took longer than the 50ms default, and it
		// was then not certified at all.
		// A TryLock that fails (a loaded machine's restarted master still
		// refusing connections) may have certified nothing: it is asked
		// again, a bounded number of times, until the key is there. One
		// that succeeds returned once two masters granted: the restarted
		// master's vote, which sets the key, may still be on its way
		// (within the per-master timeout), and is waited for (3 s at most).
		c := newQuorum(t, rdbs, dlock.WithNodeTimeout(2*time.Second))
		var got string
		var ok bool
		var lockErr error
		for try := 0; try < 5 && !ok; try++ {
			var l *dlock.Lease
			if l, lockErr = c.Mutex("epoch").TryLock(ctx); lockErr == nil {
				_ = l.Unlock(ctx)
			}
			pollUntil(ctx, 3*time.Second, func() bool {
				got, ok = servers[0].Do(t, "get", "dlock:epoch").(string)
				return ok || lockErr != nil
			})
		}
		if !ok {
			t.Fatalf("the restarted master has no epoch key after five TryLocks (the last: %v)", lockErr)
		}
		start, _, _ := strings.Cut(got, " ") // "START RUN_ID"
		epoch, err := strconv.ParseInt(start, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		if e := time.UnixMilli(epoch); e.Before(killed) {
			t.Fatalf("the epoch of a master restarted at %s is %s, %v before it", killed.Format("15:04:05.000"), e.Format("15:04:05.000"), killed.Sub(e))
		}
		if up.Before(next) {
			conclusive++
		}
	}
	if conclusive == 0 {
		t.Fatal("no restart took less than half a second: nothing was checked")
	}
}

// countRaises counts the fence raises (quorum_fence.lua) that the
// quorum Clients made over rdbs afterwards send, whichever the driver:
// an Injector whose one fault, a zero delay on every raise, is counted in
// its Stats (a batch of raises once). It returns the count so far.
func countRaises(t testing.TB, rdbs []redis.UniversalClient) func() int {
	t.Helper()
	in := faults.New(faults.Config{Scripts: faults.EngineScripts(), Rules: []faults.Rule{{Script: wire.QuorumFence.Name, Kind: faults.DelayReply, P: 1}}})
	for _, r := range rdbs {
		injectFaults(t, r, in)
	}
	return func() int {
		n := 0
		for k, v := range in.Stats() {
			if strings.HasPrefix(k, wire.QuorumFence.Name+" ") {
				n += v
			}
		}
		return n
	}
}

// A quorum acquire proposes a fence that its masters take, so that they
// hand out one fence and no raise is needed: grants one after another, by
// two Clients in turn, are mostly not raised, and their fences increase.
func TestQuorumProposedFenceSavesRaise(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	_, rdbs := quorumMasters(t, 5)
	raises := countRaises(t, rdbs)
	cs := []*dlock.Client{patientQuorum(t, rdbs), patientQuorum(t, rdbs)}
	const grants = 40
	var last uint64
	raised := 0 // grants that needed a raise
	for i := range grants {
		before := raises()
		l, err := cs[i%2].Mutex("proposed").Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if raises() > before {
			raised++
		}
		if l.Fence() <= last {
			t.Fatalf("grant %d: fence %d after %d", i, l.Fence(), last)
		}
		last = l.Fence()
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Each Client's first grant has nothing to propose; more may meet a
	// master whose clock went past a proposal, when a loaded machine
	// delays a reply past the round trip the proposal allowed for. Without
	// proposals every grant needs one.
	if raised > grants/2 {
		t.Fatalf("%d of %d grants needed a raise: the proposed fence was not taken", raised, grants)
	}
	t.Logf("%d of %d grants needed a raise", raised, grants)
}

// A proposal is taken only up to a tenth of the TTL ahead of a master's
// clock: a Client that saw a fence an hour ahead (a counter that a master
// with a fast clock handed out) does not carry every other name's fences
// an hour ahead, past what the masters' clocks give after an expiry.
func TestQuorumProposedFenceBounded(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	servers, rdbs := quorumMasters(t, 5)
	c := patientQuorum(t, rdbs)
	ahead := time.Now().Add(time.Hour).UnixMicro()
	for _, s := range servers {
		s.Do(t, "hset", "dlock:{ahead}", "f", ahead)
	}
	l, err := c.Mutex("ahead").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l.Fence() <= uint64(ahead) {
		t.Fatalf("fence %d, want above the counters' %d", l.Fence(), ahead)
	}
	_ = l.Unlock(ctx)
	const ttl = 10 * time.Second
	l, err = c.Mutex("fresh", dlock.TTL(ttl)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(ctx)
	if limit := uint64(time.Now().Add(ttl / 5).UnixMicro()); l.Fence() > limit {
		t.Fatalf("fresh name's fence %d is %v ahead of the clock, want at most a tenth of the TTL (%v)", l.Fence(), time.Duration(l.Fence()-uint64(time.Now().UnixMicro()))*time.Microsecond, ttl/10)
	}
}
