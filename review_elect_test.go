package dlock_test

// Adversarial review of leader election (merge 9e99865): each TestRevElect*
// reproduces one defect as a concrete interleaving on real redis-server
// processes, and failed on the code it was written against.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faults"
	"github.com/dlock-go/dlock/internal/redistest"
)

// nextLeader returns Observe's next report, failing the test if none comes
// within d (or the channel closes).
func nextLeader(t *testing.T, seen <-chan dlock.Leader, d time.Duration, what string) dlock.Leader {
	t.Helper()
	select {
	case l, ok := <-seen:
		if !ok {
			t.Fatalf("Observe's channel closed while waiting for %s", what)
		}
		return l
	case <-time.After(d):
		t.Fatalf("Observe reported nothing within %v while waiting for %s", d, what)
	}
	return dlock.Leader{}
}

// An observer's read that finds the key gone (the leader's lease ran out)
// carries no position, so a message published before that read, but taken
// from the observer's mailbox after it, was applied as news: the observer
// reported the expired leader's last value after reporting nobody, and
// kept it (with nobody leading it reads again only after an hour).
//
// Interleaving: after a0 resigned, the observer reads nobody (the key
// stays); the leader (TTL 400ms, no renewal) proclaims a1; the
// observer reports it and, a new term, reads again, that read sent 800ms
// late (after the lease ran out); meanwhile the leader proclaims a2, whose
// message waits in the mailbox until the read returns "no key".
func TestRevElectObserveOlderMessageAfterGoneRead(t *testing.T) {
	s := redistest.Start(t)
	obs, _ := reviewClient(t, s, 2*time.Second, nil,
		faults.Rule{Script: "leader", Kind: faults.DelaySend, Calls: []int{2}, Min: 800 * time.Millisecond, Max: 800 * time.Millisecond})
	lc, rdb := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	const name = "rev-elect-gone"
	e0 := lc.Election(name)
	if _, err := e0.Campaign(ctx, "a0"); err != nil {
		t.Fatal(err)
	}
	if err := e0.Resign(ctx); err != nil { // the key stays, with its fence: the first read has a position
		t.Fatal(err)
	}
	seen := obs.Election(name).Observe(ctx)
	if l := nextLeader(t, seen, 5*time.Second, "the first report"); l != (dlock.Leader{}) {
		t.Fatalf("first report %+v, want nobody", l)
	}
	base := dlock.ObservedMessages(obs)
	e := lc.Election(name, dlock.TTL(400*time.Millisecond), dlock.NoRenew())
	l, err := e.Campaign(ctx, "a1")
	if err != nil {
		t.Fatal(err)
	}
	if got := nextLeader(t, seen, 5*time.Second, "a1"); got != (dlock.Leader{Value: "a1", Fence: l.Fence()}) {
		t.Fatalf("report %+v, want a1", got)
	}
	waitFor(t, ctx, "the observer to apply a1", func() bool { return dlock.ObservedMessages(obs) >= base+1 })
	// The observer's second read is on its way (late): a2 is heard meanwhile.
	if err := e.Proclaim(ctx, "a2"); err != nil {
		t.Fatal(err)
	}
	<-l.Context().Done()
	waitFor(t, ctx, "the leader's key to expire", func() bool { return rdb.Exists(ctx, electionKey(name)).Val() == 0 })
	waitFor(t, ctx, "the observer to apply a2", func() bool { return dlock.ObservedMessages(obs) >= base+2 })
	if _, _, err := e.Leader(ctx); !errors.Is(err, dlock.ErrNoLeader) {
		t.Fatalf("Leader() after the lease ran out: %v, want ErrNoLeader", err)
	}
	var latest dlock.Leader
	select {
	case latest = <-seen:
	default:
		t.Fatal("the observer reported nothing after a1 although the leader's key expired")
	}
	if latest != (dlock.Leader{}) {
		t.Fatalf("the observer's latest report is %+v although its lease ran out and its key is gone: an older state reported after a newer one", latest)
	}
}

// Observe reads the election once its two channels are subscribed, or
// after subscribeWait (1s) if they are not yet: a subscription confirmed
// after that read, for the first time, comes with no Gap, so what was
// published on that channel between the read and the confirmation was
// never heard, and never read again (until the leader's lease would
// expire: its TTL, here 30s; with nobody leading, an hour).
//
// Interleaving (seed 178679: the observer's Client writes its first two
// SSUBSCRIBEs at once, the third 2.6s late): a candidate of the observer's
// Client waits in line, so the lock's channel and its hand-over channel
// are up; Observe then wants the election's channel, late, and reads at
// 1s (x leads); x proclaims x2 before that channel is up: never reported.
func TestRevElectObserveLateFirstSubscription(t *testing.T) {
	s := redistest.Start(t)
	loadScripts(t, s.Client(t))
	in := faults.New(faults.Config{Seed: 178679, Scripts: faults.EngineScripts(), MaxDelay: 3 * time.Second,
		Sub: faults.SubFaults{Delay: 1, MaxDelay: 3 * time.Second}})
	ordb := s.Client(t)
	injectFaults(t, ordb, in)
	obs := newDlock(t, ordb)
	t.Cleanup(func() { _ = obs.Close() })
	lc, rdb := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	const name = "rev-elect-late-sub"
	x := lc.Election(name, dlock.TTL(30*time.Second))
	l, err := x.Campaign(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	campaign(t, ctx, obs.Election(name, dlock.TTL(30*time.Second)), "w") // waits in line
	waitLine(t, ctx, rdb, electionKey(name), 1)
	seen := obs.Election(name).Observe(ctx)
	if got := nextLeader(t, seen, 5*time.Second, "the first report"); got != (dlock.Leader{Value: "x", Fence: l.Fence()}) {
		t.Fatalf("first report %+v, want x", got)
	}
	if err := x.Proclaim(ctx, "x2"); err != nil {
		t.Fatal(err)
	}
	for _, ev := range in.Events(nil) {
		t.Logf("fault: %v", ev)
	}
	if got := nextLeader(t, seen, 6*time.Second, "x2"); got != (dlock.Leader{Value: "x2", Fence: l.Fence()}) {
		t.Fatalf("report %+v, want x2", got)
	}
}

// A Mutex of the election's name, locked on the same Client with a ctx
// from the leader's lease, re-entered the leadership (heldIn matches the
// lock hash and kind, and an Election is a Fair mutex): the Mutex and the
// Election did not exclude each other. Then Resign only counted the
// Election's lease out of a holding the Mutex lease still held: it
// returned nil, the lock stayed at Redis with the resigned leader's value,
// Leader() kept naming it, and the next candidate was not elected.
func TestRevElectMutexReentersLeadership(t *testing.T) {
	s := redistest.Start(t)
	cs, _ := newClients(t, s, 2)
	ctx := ctxT(t, 20*time.Second)
	const name = "rev-elect-mutex"
	a, b := cs[0].Election(name, dlock.TTL(time.Minute)), cs[1].Election(name, dlock.TTL(time.Minute))
	la, err := a.Campaign(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	wait := campaign(t, ctx, b, "b")
	mctx, cancel := context.WithTimeout(la.Context(), 300*time.Millisecond)
	defer cancel()
	ml, err := cs[0].Mutex(name).Lock(mctx)
	if err == nil {
		t.Errorf("a Mutex of the election's name was locked (fence %d, leader's %d) while the Election leads: they do not exclude each other", ml.Fence(), la.Fence())
		defer func() { _ = ml.Unlock(ctx) }()
	} else if !errors.Is(err, dlock.ErrInvalidArgument) {
		// (Refused at once: it would wait for the leadership, see
		// TestMutexLockUnderLeadershipRefused.)
		t.Fatalf("Mutex.Lock under the leader's lease: %v, want ErrInvalidArgument", err)
	}
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if v, f, err := a.Leader(ctx); err == nil && v == "a" {
		t.Fatalf("after Resign returned nil, Leader() still names the resigned leader (%q, fence %d)", v, f)
	}
	lb, err := wait()
	if err != nil {
		t.Fatal(err)
	}
	wantLeader(t, ctx, a, "b", lb.Fence())
}

// Campaign returned the leadership (nil error) when the reply of its
// publish came after the lease had run out, and another candidate already
// led: Lock refuses a grant whose reply comes past the lease's validity
// (fault 3), Campaign did not check again after its own round trip.
//
// Interleaving: a (TTL 1s, no renewal) is granted the lock; its proclaim
// runs at once at Redis, its reply is held back 1.5s; the lease runs out
// at 1s and b, waiting in line, is elected; then a's Campaign returns.
func TestRevElectCampaignReturnsAnEndedLeadership(t *testing.T) {
	s := redistest.Start(t)
	ca, _ := reviewClient(t, s, 2*time.Second, nil,
		faults.Rule{Script: "proclaim", Kind: faults.DelayReply, Calls: []int{1}, Min: 1500 * time.Millisecond, Max: 1500 * time.Millisecond})
	cb, rdb := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	const name = "rev-elect-late-reply"
	holder, err := cb.Mutex(name, dlock.Fair()).Lock(ctx) // so that a and b wait in line, a first
	if err != nil {
		t.Fatal(err)
	}
	a := ca.Election(name, dlock.TTL(time.Second), dlock.NoRenew())
	b := cb.Election(name, dlock.TTL(time.Minute))
	waitA := campaign(t, ctx, a, "a")
	waitLine(t, ctx, rdb, electionKey(name), 1)
	waitB := campaign(t, ctx, b, "b")
	waitLine(t, ctx, rdb, electionKey(name), 2)
	if err := holder.Unlock(ctx); err != nil { // hands it to a
		t.Fatal(err)
	}
	lb, err := waitB()
	if err != nil {
		t.Fatal(err)
	}
	la, err := waitA()
	if err == nil {
		v, f, lerr := b.Leader(ctx)
		t.Fatalf("a's Campaign returned its leadership (fence %d; its lease context: %v) while b leads (fence %d; Leader() = %q, %d, %v)",
			la.Fence(), context.Cause(la.Context()), lb.Fence(), v, f, lerr)
	}
	if !errors.Is(err, dlock.ErrLockLost) && !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("a's Campaign: %v, want ErrLockLost or ErrNotObtained", err)
	}
	wantLeader(t, ctx, b, "b", lb.Fence())
}

// A leader that resigns hands the lock to the next candidate through Redis
// (release.lua publishes on that candidate's own channel, not on the lock's
// or the election's), and the new holder is no leader until its own
// proclaim: if that never comes (the candidate dies, pauses, or its call
// is slow), observers hear nothing and keep reporting the resigned leader
// until the lease they last read would have run out (here 30s), while
// Leader() already says ErrNoLeader.
//
// Interleaving: a leads (TTL 30s), b waits in line on a Client whose
// proclaim is not sent for 4s (then fails); a resigns: the lock is b's at
// Redis, unproclaimed.
func TestRevElectObserveResignHandedToSilentCandidate(t *testing.T) {
	t.Run("S", func(t *testing.T) { resignToSilentCandidate(t, startS(t)) })
	t.Run("C", func(t *testing.T) { resignToSilentCandidate(t, startC(t)) })
}

func resignToSilentCandidate(t *testing.T, s *site) {
	ca, rdb := s.client(t)
	in := faults.New(faults.Config{Scripts: faults.EngineScripts(), MaxDelay: 5 * time.Second, Rules: []faults.Rule{
		{Script: "proclaim", Kind: faults.FailSend, Calls: []int{1}, Min: 4 * time.Second, Max: 4 * time.Second}}})
	brdb := s.newRedis(t, "silent-candidate", nil)
	injectFaults(t, brdb, in)
	cb := newDlock(t, brdb)
	t.Cleanup(func() { _ = cb.Close() })
	co, _ := s.client(t)
	ctx := ctxT(t, 20*time.Second)
	const name = "rev-elect-silent"
	a := ca.Election(name, dlock.TTL(30*time.Second))
	la, err := a.Campaign(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	seen := co.Election(name).Observe(ctx)
	if got := nextLeader(t, seen, 5*time.Second, "a"); got != (dlock.Leader{Value: "a", Fence: la.Fence()}) {
		t.Fatalf("first report %+v, want a", got)
	}
	campaign(t, ctx, cb.Election(name, dlock.TTL(30*time.Second)), "b")
	waitLine(t, ctx, rdb, electionKey(name), 1)
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.Leader(ctx); !errors.Is(err, dlock.ErrNoLeader) {
		t.Fatalf("Leader() after a resigned to a silent candidate: %v, want ErrNoLeader", err)
	}
	if got := nextLeader(t, seen, 2*time.Second, "a change after a resigned"); got != (dlock.Leader{}) {
		t.Fatalf("report %+v after a resigned to a candidate that has not proclaimed, want nobody", got)
	}
}
