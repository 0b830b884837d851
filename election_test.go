package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// electionKey is the lock hash of the election called name (docs/PROTOCOL.md).
func electionKey(name string) string { return "dlock:{" + name + "}" }

// campaign starts e.Campaign(ctx, value) in the background.
func campaign(t *testing.T, ctx context.Context, e *dlock.Election, value string) func() (*dlock.Lease, error) {
	t.Helper()
	return async(t, ctx, func(ctx context.Context) (*dlock.Lease, error) { return e.Campaign(ctx, value) })
}

// wantLeader fails the test unless e's leader is value with fence.
func wantLeader(t *testing.T, ctx context.Context, e *dlock.Election, value string, fence uint64) {
	t.Helper()
	v, f, err := e.Leader(ctx)
	if err != nil || v != value || f != fence {
		t.Fatalf("Leader() = %q, %d, %v; want %q, %d", v, f, err, value, fence)
	}
}

// wantExpiryReported fails the test unless Observe's next report (on
// seen) is the zero Leader, as it is once the leader's lock expired.
func wantExpiryReported(t *testing.T, ctx context.Context, seen <-chan dlock.Leader) {
	t.Helper()
	select {
	case got := <-seen:
		if got != (dlock.Leader{}) {
			t.Fatalf("report %+v, want the zero Leader once the lock expired", got)
		}
	case <-ctx.Done():
		t.Fatal("the expiry of the leader's lock was never reported")
	}
}

// Candidates of three Clients lead in arrival order, each term's fence
// above the last, and Leader names each leader in turn.
func TestElectionFencesIncrease(t *testing.T) {
	s := redistest.Start(t)
	cs, rdb := newClients(t, s, 3)
	ctx := ctxT(t, 20*time.Second)
	const name = "elect-order"
	var es []*dlock.Election
	for _, c := range cs {
		es = append(es, c.Election(name, dlock.TTL(time.Minute)))
	}
	if _, _, err := es[0].Leader(ctx); !errors.Is(err, dlock.ErrNoLeader) {
		t.Fatalf("Leader() before any Campaign: %v, want ErrNoLeader", err)
	}
	first, err := es[0].Campaign(ctx, "c0")
	if err != nil {
		t.Fatal(err)
	}
	wantLeader(t, ctx, es[2], "c0", first.Fence())
	var waits []func() (*dlock.Lease, error)
	for i := 1; i < 3; i++ {
		waits = append(waits, campaign(t, ctx, es[i], fmt.Sprintf("c%d", i)))
		waitLine(t, ctx, rdb, electionKey(name), int64(i)) // arrival order
	}
	prev := first.Fence()
	for i, wait := range waits {
		if err := es[i].Resign(ctx); err != nil {
			t.Fatalf("Resign of c%d: %v", i, err)
		}
		l, err := wait()
		if err != nil {
			t.Fatalf("Campaign of c%d: %v", i+1, err)
		}
		if l.Fence() <= prev {
			t.Fatalf("term of c%d is %d, not above the last leader's %d", i+1, l.Fence(), prev)
		}
		prev = l.Fence()
		wantLeader(t, ctx, es[0], fmt.Sprintf("c%d", i+1), l.Fence())
	}
	if err := es[2].Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if _, _, err := es[1].Leader(ctx); !errors.Is(err, dlock.ErrNoLeader) {
		t.Fatalf("Leader() after the last Resign: %v, want ErrNoLeader", err)
	}
	// A new term after the election was left empty is above them all.
	l, err := es[0].Campaign(ctx, "c0 again")
	if err != nil {
		t.Fatal(err)
	}
	if l.Fence() <= prev {
		t.Fatalf("term %d after an empty election, not above %d", l.Fence(), prev)
	}
}

// Resign hands leadership over in its own round trip: when it returns, the
// lock is the next candidate's at Redis already, and that candidate's
// Client was told by message (it did not find it by looking).
func TestElectionResignHandsOver(t *testing.T) {
	s := redistest.Start(t)
	cs, rdb := newClients(t, s, 2)
	ctx := ctxT(t, 20*time.Second)
	const name = "elect-resign"
	a, b := cs[0].Election(name, dlock.TTL(time.Minute)), cs[1].Election(name, dlock.TTL(time.Minute))
	la, err := a.Campaign(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	wait := campaign(t, ctx, b, "b")
	waitLine(t, ctx, rdb, electionKey(name), 1)
	heard := dlock.HandOversHeard(cs[1])
	start := time.Now()
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	resigned := time.Since(start)
	owner := rdb.HGet(ctx, electionKey(name), "o").Val()
	lb, err := wait()
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	if owner != lb.Token() {
		t.Fatalf("when Resign returned the lock's owner was %q, not the next candidate: no hand-over", owner)
	}
	if got := dlock.HandOversHeard(cs[1]); got != heard+1 {
		t.Fatalf("the next candidate's Client heard %d hand-over messages, want %d", got-heard, 1)
	}
	if la.Context().Err() == nil {
		t.Fatal("the resigned leader's lease context did not end")
	}
	wantLeader(t, ctx, a, "b", lb.Fence())
	rtt := pingTime(t, ctx, s)
	t.Logf("Resign took %v, the next leader's Campaign returned %v after it began (a PING round trip: %v)", resigned, took, rtt)
}

// pingTime is the shortest of a few PING round trips to s.
func pingTime(t *testing.T, ctx context.Context, s *redistest.Server) time.Duration {
	t.Helper()
	rdb := s.Client(t)
	best := time.Hour
	for range 20 {
		start := time.Now()
		if err := rdb.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		best = min(best, time.Since(start))
	}
	return best
}

// A leader deposed while its lease still believes itself valid (its key
// deleted, the next candidate elected) cannot publish: Redis refuses
// Proclaim by the owner token, the successor's value stays, and the
// deposed lease ends.
func TestElectionDeposedProclaim(t *testing.T) {
	s := redistest.Start(t)
	cs, rdb := newClients(t, s, 2)
	ctx := ctxT(t, 20*time.Second)
	const name = "elect-deposed"
	a, b := cs[0].Election(name, dlock.TTL(time.Minute)), cs[1].Election(name, dlock.TTL(time.Minute))
	if err := a.Proclaim(ctx, "never elected"); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Proclaim before any Campaign: %v, want ErrLockLost", err)
	}
	la, err := a.Campaign(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Proclaim(ctx, "a2"); err != nil {
		t.Fatal(err)
	}
	wantLeader(t, ctx, b, "a2", la.Fence())
	if err := rdb.Del(ctx, electionKey(name)).Err(); err != nil {
		t.Fatal(err)
	}
	lb, err := b.Campaign(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	if err := la.Context().Err(); err != nil {
		t.Fatalf("the deposed lease ended before Proclaim (%v): the test would not reach Redis's check", err)
	}
	err = a.Proclaim(ctx, "a3")
	if !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Proclaim by the deposed leader: %v, want ErrLockLost", err)
	}
	wantLeader(t, ctx, a, "b", lb.Fence())
	if v := rdb.HGet(ctx, electionKey(name), "v").Val(); v != "b" {
		t.Fatalf("the value at Redis is %q, want the new leader's", v)
	}
	if !errors.Is(context.Cause(la.Context()), dlock.ErrLockLost) {
		t.Fatalf("the deposed lease's context: %v, want it ended with ErrLockLost", context.Cause(la.Context()))
	}
	if err := a.Resign(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Resign of the deposed leader: %v, want ErrLockLost", err)
	}
	wantLeader(t, ctx, a, "b", lb.Fence())
}

// A leader whose lease ran out (not renewed) leads no more: Leader says
// ErrNoLeader, Proclaim is refused.
func TestElectionExpiredLeader(t *testing.T) {
	s := redistest.Start(t)
	c, _ := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	e := c.Election("elect-expired", dlock.TTL(200*time.Millisecond), dlock.NoRenew())
	l, err := e.Campaign(ctx, "short")
	if err != nil {
		t.Fatal(err)
	}
	<-l.Context().Done()
	waitFor(t, ctx, "the leader's key to expire", func() bool {
		_, _, err := e.Leader(ctx)
		return errors.Is(err, dlock.ErrNoLeader)
	})
	if err := e.Proclaim(ctx, "late"); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Proclaim after expiry: %v, want ErrLockLost", err)
	}
}

// Observe reports the current leader, then every change in order: values
// of one leader, a new leader, nobody. Reported while the reader keeps up.
func TestElectionObserveOrder(t *testing.T) {
	s := redistest.Start(t)
	cs, rdb := newClients(t, s, 3)
	ctx := ctxT(t, 20*time.Second)
	const name = "elect-observe"
	a, b := cs[0].Election(name, dlock.TTL(time.Minute)), cs[1].Election(name, dlock.TTL(time.Minute))
	octx, stop := context.WithCancel(ctx)
	defer stop()
	seen := cs[2].Election(name).Observe(octx)
	next := func(what string) dlock.Leader {
		t.Helper()
		return nextLeader(t, seen, 10*time.Second, what)
	}
	if l := next("the first report"); l != (dlock.Leader{}) {
		t.Fatalf("first report %+v, want the zero Leader (nobody leads)", l)
	}
	la, err := a.Campaign(ctx, "a0")
	if err != nil {
		t.Fatal(err)
	}
	if l := next("a0"); l != (dlock.Leader{Value: "a0", Fence: la.Fence()}) {
		t.Fatalf("report %+v, want a0 with fence %d", l, la.Fence())
	}
	for i := 1; i <= 20; i++ {
		v := fmt.Sprintf("a%d", i)
		if err := a.Proclaim(ctx, v); err != nil {
			t.Fatal(err)
		}
		if l := next(v); l != (dlock.Leader{Value: v, Fence: la.Fence()}) {
			t.Fatalf("report %+v, want %s with fence %d", l, v, la.Fence())
		}
	}
	wait := campaign(t, ctx, b, "b")
	waitLine(t, ctx, rdb, electionKey(name), 1)
	if err := a.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	lb, err := wait()
	if err != nil {
		t.Fatal(err)
	}
	// The hand-over is published (nobody leads until b's value is), and
	// may be reported before b's value is.
	l := next("b")
	if l == (dlock.Leader{}) {
		l = next("b, after nobody during the hand-over")
	}
	if l != (dlock.Leader{Value: "b", Fence: lb.Fence()}) {
		t.Fatalf("report %+v, want b with fence %d", l, lb.Fence())
	}
	if err := b.Resign(ctx); err != nil {
		t.Fatal(err)
	}
	if l := next("nobody"); l != (dlock.Leader{}) {
		t.Fatalf("report %+v after the last Resign, want the zero Leader", l)
	}
	stop()
	for range seen { // closed once its ctx ended
	}
}

// A reader that does not keep up finds the latest report, never an older
// one after it: the channel holds one, and a newer replaces it unread.
func TestElectionObserveLatestWins(t *testing.T) {
	s := redistest.Start(t)
	cs, _ := newClients(t, s, 2)
	ctx := ctxT(t, 20*time.Second)
	const name = "elect-latest"
	a := cs[0].Election(name, dlock.TTL(time.Minute))
	la, err := a.Campaign(ctx, "v0")
	if err != nil {
		t.Fatal(err)
	}
	seen := cs[1].Election(name).Observe(ctx)
	if l := <-seen; l != (dlock.Leader{Value: "v0", Fence: la.Fence()}) {
		t.Fatalf("first report %+v, want v0", l)
	}
	applied := dlock.ObservedMessages(cs[1])
	const n = 30
	for i := 1; i <= n; i++ {
		if err := a.Proclaim(ctx, fmt.Sprintf("v%d", i)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, ctx, "the observer to apply every message", func() bool { return dlock.ObservedMessages(cs[1]) >= applied+n })
	if l := <-seen; l.Value != fmt.Sprintf("v%d", n) {
		t.Fatalf("the slow reader found %+v, want the latest, v%d", l, n)
	}
	select {
	case l := <-seen:
		t.Fatalf("a second report %+v waited behind the latest", l)
	default:
	}
}

// Observe's first report is a fresh read, on Cluster too, and a leader that
// dies (its lock expires unrenewed) is reported gone without a message.
func TestElectionObserveExpiry(t *testing.T) {
	s := redistest.Start(t)
	cs, _ := newClients(t, s, 2)
	ctx := ctxT(t, 20*time.Second)
	e := cs[0].Election("elect-observe-expiry", dlock.TTL(300*time.Millisecond), dlock.NoRenew())
	l, err := e.Campaign(ctx, "brief")
	if err != nil {
		t.Fatal(err)
	}
	seen := cs[1].Election("elect-observe-expiry").Observe(ctx)
	if got := <-seen; got != (dlock.Leader{Value: "brief", Fence: l.Fence()}) {
		t.Fatalf("first report %+v", got)
	}
	wantExpiryReported(t, ctx, seen)
}

// A leader first heard of by its message (the observer started with nobody
// leading) that then dies is reported gone too: its lock's expiry is read.
func TestElectionObserveExpiryOfALeaderHeardOf(t *testing.T) {
	s := redistest.Start(t)
	cs, _ := newClients(t, s, 2)
	ctx := ctxT(t, 20*time.Second)
	const name = "elect-observe-heard"
	seen := cs[1].Election(name).Observe(ctx)
	if got := <-seen; got != (dlock.Leader{}) {
		t.Fatalf("first report %+v, want the zero Leader", got)
	}
	l, err := cs[0].Election(name, dlock.TTL(300*time.Millisecond), dlock.NoRenew()).Campaign(ctx, "brief")
	if err != nil {
		t.Fatal(err)
	}
	if got := <-seen; got != (dlock.Leader{Value: "brief", Fence: l.Fence()}) {
		t.Fatalf("report %+v, want the new leader", got)
	}
	wantExpiryReported(t, ctx, seen)
}

// Bad input is refused with ErrInvalidArgument, saying what is wrong.
func TestElectionBadInput(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 10*time.Second)
	bad := []struct {
		name, value, says string
	}{
		{"", "v", "name is empty"},
		{"}x", "v", "begins with '}'"},
		{"ok", "", "value is empty"},
		{"ok", strings.Repeat("x", dlock.MaxValueLen+1), "longer than MaxValueLen"},
	}
	for _, b := range bad {
		e := c.Election(b.name)
		_, err := e.Campaign(ctx, b.value)
		if !errors.Is(err, dlock.ErrInvalidArgument) || !strings.Contains(err.Error(), b.says) {
			t.Errorf("Campaign(%q) of %q: %v, want ErrInvalidArgument saying %q", b.value, b.name, err, b.says)
		}
		if err := e.Proclaim(ctx, b.value); !errors.Is(err, dlock.ErrInvalidArgument) {
			t.Errorf("Proclaim(%q) of %q: %v, want ErrInvalidArgument", b.value, b.name, err)
		}
	}
	if _, _, err := c.Election("").Leader(ctx); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Errorf("Leader of an empty name: %v", err)
	}
	if _, ok := <-c.Election("").Observe(ctx); ok {
		t.Error("Observe of an empty name reported something")
	}
	if _, err := c.Election("ok").Campaign(ctx, strings.Repeat("x", dlock.MaxValueLen)); err != nil {
		t.Errorf("a value of MaxValueLen bytes: %v", err)
	}
	// One Election is one candidate.
	e := c.Election("one-candidate")
	if _, err := e.Campaign(ctx, "me"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.Campaign(ctx, "me again"); !errors.Is(err, dlock.ErrInvalidArgument) || !strings.Contains(err.Error(), "leads") {
		t.Errorf("a second Campaign of a leading Election: %v", err)
	}
	// A key that is not an election is refused by name.
	if err := rdb.Set(ctx, electionKey("a-string"), "x", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Election("a-string").Leader(ctx); !errors.Is(err, dlock.ErrForeignKey) {
		t.Errorf("Leader of a string key: %v, want ErrForeignKey", err)
	}
	if _, ok := <-c.Election("a-string").Observe(ctx); ok {
		t.Error("Observe of a string key reported something")
	}
	if _, err := c.Semaphore("a-sem", 2).Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Election("a-sem").Leader(ctx); !errors.Is(err, dlock.ErrForeignKey) {
		t.Errorf("Leader of a semaphore: %v, want ErrForeignKey", err)
	}
	// Quorum mode has no one line across masters.
	_, rdbs := quorumMasters(t, 3)
	qe := newQuorum(t, rdbs).Election("q")
	if _, err := qe.Campaign(ctx, "v"); !errors.Is(err, dlock.ErrInvalidArgument) || !strings.Contains(err.Error(), "quorum") {
		t.Errorf("Campaign in quorum mode: %v", err)
	}
	if _, _, err := qe.Leader(ctx); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Errorf("Leader in quorum mode: %v", err)
	}
}

// TestMutexLockUnderLeadershipRefused: a Mutex of the election's name,
// locked under the leadership's context on the same Client, would wait for
// the leadership (which it does not re-enter): it is refused at once.
func TestMutexLockUnderLeadershipRefused(t *testing.T) {
	s := redistest.Start(t)
	c, _ := newClient(t, s)
	ctx := ctxT(t, 10*time.Second)
	l, err := c.Election("lead-self").Campaign(ctx, "me")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Unlock(ctx) }()
	wctx, cancel := context.WithTimeout(l.Context(), 2*time.Second)
	defer cancel()
	if _, err := c.Mutex("lead-self").Lock(wctx); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Fatalf("Lock under the leadership: %v, want ErrInvalidArgument", err)
	}
	if _, err := c.Mutex("lead-self").TryLock(wctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock under the leadership: %v, want ErrNotObtained", err)
	}
}
