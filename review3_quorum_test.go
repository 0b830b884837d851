package dlock_test

// Third review of quorum mode, after Unlock at a majority, the proposed
// fence and the release that waits for a slow master's vote. Each test
// reproduces one defect on real redis-server processes and failed on the
// code it was written against (3b8a638); the interleaving is in its comment.

import (
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faults"
	"github.com/redis/go-redis/v9"
)

// masterMicros is s's clock (TIME) in µs.
func masterMicros(t *testing.T, rdb redis.UniversalClient) uint64 {
	t.Helper()
	now, err := rdb.Time(ctxT(t, 5*time.Second)).Result()
	if err != nil {
		t.Fatal(err)
	}
	return uint64(now.UnixMicro())
}

// TestReview3QuorumProposalsDoNotCreep: a Client learns a fence a master
// handed out above its proposal, and proposes it moved on by the time
// since and the round trip that brought it. The round trip was measured
// from the acquire's send time less quorumSlack (2 ms, for the lease's
// validity), so each fence learnt came out 2 ms ahead of what the master
// could have reached. Two Clients whose acquires are sent at about the
// same time, the one's run at the masters after the other's grant and
// release (a slow path), learn each other's proposals in turn, each time
// 2 ms further ahead: here Y's acquire is sent beside X's and written
// 20 ms late, then the roles swap, 60 times. The proposals crept ahead of
// the masters' clocks by 2 ms a round (to 140 ms and on, up to a tenth
// of the TTL), where each Client's lead should stay about the slow path's
// round trip.
func TestReview3QuorumProposalsDoNotCreep(t *testing.T) {
	ctx := ctxT(t, 60*time.Second)
	servers, rdbs := quorumMasters(t, 3)
	const delay = 20 * time.Millisecond
	type side struct {
		c   *dlock.Client
		ins []*faults.Injector
	}
	mk := func() side {
		var s side
		view := make([]redis.UniversalClient, len(servers))
		for i, srv := range servers {
			rdb, in := faultyMaster(t, srv, faults.Rule{Script: "quorum_acquire", Kind: faults.DelayWrite, P: 1, Min: delay, Max: delay})
			in.SetEnabled(false)
			view[i], s.ins = rdb, append(s.ins, in)
		}
		s.c = patientQuorum(t, view)
		return s
	}
	slow := func(s side, on bool) {
		for _, in := range s.ins {
			in.SetEnabled(on)
		}
	}
	x, y := mk(), mk()
	const ttl = 10 * time.Second // proposals are taken up to 1 s ahead of a master's clock
	cycle := func(s side) {
		l, err := s.c.Mutex("creep", dlock.TTL(ttl)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	cycle(x)
	cycle(y)
	early, late := x, y
	for range 60 {
		slow(early, false)
		slow(late, true)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); cycle(late) }()
		cycle(early)
		wg.Wait()
		early, late = late, early
	}
	slow(x, false)
	slow(y, false)
	for _, s := range []side{x, y} {
		l, err := s.c.Mutex("creep-after", dlock.TTL(ttl)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ahead := time.Duration(int64(l.Fence())-int64(masterMicros(t, rdbs[0]))) * time.Microsecond
		_ = l.Unlock(ctx)
		// A Client's lead is about the longest round trip it saw (the
		// 20 ms write delay); creeping, it grew by 2 ms a round.
		if ahead > delay+50*time.Millisecond {
			t.Errorf("after 60 rounds a fresh name's fence is %v ahead of the masters' clock; the slow path's round trip is about %v", ahead, delay)
		} else {
			t.Logf("fence %v ahead of the masters' clock", ahead)
		}
	}
}

// TestReview3QuorumFarCounterDoesNotStick: a Client that once learnt a
// fence far ahead of the clocks (one name's counter, handed out by a master
// whose clock ran fast) proposed it, moved on, for every name from then on.
// The masters cap a proposal at a tenth of the TTL ahead of their clocks,
// so each hands out its own clock plus that: the fences of a grant differ
// (the masters ran it at different µs), and every grant of every name
// needed the raise the proposal is there to save, for the Client's
// lifetime, its fences a tenth of the TTL ahead of the clocks. A proposal
// beyond the cap now teaches the Client the clock behind the capped fence.
func TestReview3QuorumFarCounterDoesNotStick(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	servers, rdbs := quorumMasters(t, 5)
	var raises raiseCounter
	for _, r := range rdbs {
		r.AddHook(&raises)
	}
	c := patientQuorum(t, rdbs)
	ahead := time.Now().Add(time.Hour).UnixMicro()
	for _, s := range servers {
		s.Do(t, "hset", "dlock:{far}", "f", ahead)
	}
	l, err := c.Mutex("far").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Unlock(ctx)
	const grants = 20
	raised := 0 // grants (each of a fresh name) that needed a raise
	for i := range grants {
		before := raises.n.Load()
		l, err := c.Mutex("near"+strconv.Itoa(i), dlock.TTL(10*time.Second)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if raises.n.Load() > before {
			raised++
		}
		if i == grants-1 {
			if d := time.Duration(int64(l.Fence())-int64(masterMicros(t, rdbs[0]))) * time.Microsecond; d > 100*time.Millisecond {
				t.Errorf("a fresh name's fence is %v ahead of the masters' clock", d)
			}
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The first name's grant meets the cap; the others' take the proposal.
	if raised > 2+grants/8 {
		t.Errorf("%d of %d grants of another name needed a raise after one name's counter was far ahead", raised, grants)
	}
}
