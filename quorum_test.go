package dlock_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faults"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// quorumMasters starts n independent masters whose data the test knows to
// be new: their epoch keys are set to long ago, so they vote at once (a
// master's first use otherwise waits out the restart delay).
func quorumMasters(t *testing.T, n int) ([]*redistest.Server, []redis.UniversalClient) {
	t.Helper()
	servers := redistest.Masters(t, n)
	rdbs := make([]redis.UniversalClient, n)
	for i, s := range servers {
		certifyOld(t, s)
		rdbs[i] = s.Client(t)
	}
	return servers, rdbs
}

// certifyOld sets s's epoch key (default prefix) to the epoch of the clock.
func certifyOld(t *testing.T, s *redistest.Server) {
	t.Helper()
	s.Do(t, "set", "dlock:epoch", "0")
}

func newQuorum(t *testing.T, rdbs []redis.UniversalClient, opts ...dlock.Option) *dlock.Client {
	t.Helper()
	c, err := dlock.NewQuorum(rdbs, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
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
	for _, s := range servers {
		if o := s.Do(t, "hget", "dlock:{basics}", "o"); o != nil {
			t.Fatalf("owner %v left after unlock", o)
		}
	}
}

// TestQuorumLateAnswerOfAnEarlierAttempt: a Lock's first attempt fails, and
// one master's answer to it comes after the per-master timeout; the second
// attempt, made with the same token, wins with that master in its
// majority. The late answer must not give back what the second attempt
// counted: the lease would rest on a minority, and another Client could
// take the lock while it is believed valid (found by
// TestInterleavingsQuorum, seed 12345).
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
		in := faults.New(faults.Config{Scripts: engineScripts(t), Rules: rules[i], MaxDelay: 2 * late})
		if i == 0 {
			first = in
		}
		rdb := s.Client(t)
		rdb.AddHook(in)
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

// TestQuorumFirstUseBesideOtherCalls: a quorum Client's first call on each
// master (which sets the master's epoch key) while the application uses
// the same go-redis clients for other calls. go-redis races with itself
// when a Conn of a client and a pooled connection of it set up their
// first connections at once (both touch the options' maintenance
// notification mode, under different locks): the epoch must not be set
// through a Conn.
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

// TestQuorumMajorityTooLate: a majority that granted too late to leave any
// validity, or whose fence could not be raised on a majority, is reported
// as not obtained (ErrNotObtained, as NewQuorum's doc says), and what it
// took is given back on every master.
func TestQuorumMajorityTooLate(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	servers, rdbs := quorumMasters(t, 3)
	faulty := func(rule faults.Rule) *dlock.Client {
		var fr []redis.UniversalClient
		for i, s := range servers {
			loadScripts(t, rdbs[i].(*redis.Client))
			rdb := s.Client(t)
			rdb.AddHook(faults.New(faults.Config{Scripts: engineScripts(t), Rules: []faults.Rule{rule}}))
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
		for i, s := range servers {
			if o := s.Do(t, "hget", "dlock:{"+name+"}", "o"); o != nil {
				t.Errorf("%s: master %d still names owner %v", tc.what, i, o)
			}
		}
	}
}

// TestQuorumEpochNotBeforeRestart: the epoch a restarted master is given
// (when its data began, from INFO's uptime) is no earlier than its restart,
// so that it votes no sooner than the restart delay after it. INFO's
// uptime is the difference of two clocks in whole seconds, so it may be
// up to a second more than the real one: a master restarted at k.5 s and
// certified at k+1.03 s reports an uptime of 1 s (found by
// TestInterleavingsQuorum: a restarted master granted the lock 3.2 s into
// a restart delay of 4 s).
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
		// A new Client certifies each master at its first call.
		c := newQuorum(t, rdbs)
		if l, err := c.Mutex("epoch").TryLock(ctx); err == nil {
			_ = l.Unlock(ctx)
		}
		epoch, err := strconv.ParseInt(servers[0].Do(t, "get", "dlock:epoch").(string), 10, 64)
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
