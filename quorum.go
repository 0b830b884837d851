package dlock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/dlock-go/dlock/internal/driver"
	"github.com/dlock-go/dlock/internal/wire"
)

// quorum is a Client's masters in quorum mode (NewQuorum): every grant,
// extension and release goes to all of them at once and counts only with a
// majority.
type quorum struct {
	members []*member
	every   []int // 0 to len(members)-1: every master, for fanOut
	maj     int
	node    time.Duration // per-master timeout of one request
	delay   time.Duration // restart delay (see quorum_acquire.lua)
	epoch   string        // the epoch key
	clock   fenceClock    // what acquires propose as their fence
}

// A fenceClock proposes the fence of a quorum acquire. The masters hand
// out fences above their counters and at least their clocks in µs; each
// takes the proposal where it is above those and not far ahead of its
// clock (acquire.lua, as quorum_acquire.lua runs it), so that the masters
// of a grant mostly hand out one fence, and none needs raising (see
// raise): a round trip saved.
// A proposal only ever makes a fence larger, which the fence argument
// allows (docs/PROTOCOL.md, Fences under quorum).
//
// The proposal is the last fence a master handed out above what it was
// proposed (its clock or its counter then), moved on by the time since on
// our monotonic clock, plus the round trip that brought it (the master's
// clock went on while the reply came). A fence that was the proposal
// itself teaches nothing and is not learnt: learning it, proposals would
// creep ahead of the clocks by a round trip at each grant.
type fenceClock struct {
	mu   sync.Mutex
	base uint64
	at   time.Time     // when base was seen
	lead time.Duration // the round trip that brought it
}

// propose returns the fence to propose now (0: none).
func (fc *fenceClock) propose() uint64 {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if fc.base == 0 {
		return 0
	}
	return fc.base + uint64((time.Since(fc.at)+fc.lead)/time.Microsecond)
}

// saw notes fence f, handed out by a master that was proposed p in a
// request sent at sent (the real send, not sendTime's: a lead counted
// from quorumSlack earlier would put each fence learnt that much ahead,
// and two Clients learning each other's proposals in turn would creep
// ahead of the clocks by it at each grant) for a lease of ttl.
//
// A fence below p is a proposal the master capped at a tenth of ttl ahead
// of its clock (quorum_acquire.lua): what was learnt is too far ahead (a
// counter far ahead on some name), and proposing it would have every
// master cap it at its own clock, so that no grant of any name ever got
// one fence. The clock behind the cap is learnt instead.
func (fc *fenceClock) saw(f, p uint64, sent time.Time, ttl time.Duration) {
	if f == p {
		return
	}
	capped := f < p
	if capped {
		ahead := uint64(ttl / 10 / time.Microsecond)
		if f <= ahead {
			return
		}
		f -= ahead
	}
	fc.mu.Lock()
	defer fc.mu.Unlock()
	now := time.Now()
	if fc.base == 0 || capped || f > fc.base+uint64(now.Sub(fc.at)/time.Microsecond) {
		fc.base, fc.at, fc.lead = f, now, now.Sub(sent)
	}
}

// member is one master of a quorum: a Client of its own over it, for its
// pub/sub and its scripts, that never takes a lock itself.
type member struct {
	c    *Client
	addr string
}

var (
	quorumAcquireScript = loadScript(wire.QuorumAcquire)
	quorumFenceScript   = loadScript(wire.QuorumFence)
)

// Quorum defaults (see WithNodeTimeout and WithRestartDelay).
const (
	DefaultNodeTimeout  = 50 * time.Millisecond
	DefaultRestartDelay = 3 * DefaultTTL
)

// quorumSlack is what a quorum lease's validity loses besides the 1% of
// its TTL for clock rates (validUntil): the masters expire keys with
// millisecond precision, and each may round against us (the Redis
// "Distributed Locks" page adds 2 ms the same way).
const quorumSlack = 2 * time.Millisecond

// quorumOver is what NewQuorum and rueidisdlock.NewQuorum share: who
// names the constructor in its errors; there are n masters, and a
// driver's master(i) returns the address of master i (two masters at one
// address are the same master) or, if it cannot be one, what it is and
// why not; conn(i) makes its driver, once every master passed.
func quorumOver(who string, opts []Option, n int, master func(i int) (addr, not string), conn func(i int) driver.Conn) (*Client, error) {
	cfg := configure(opts)
	switch {
	case n < 3:
		return nil, invalidf("%s: %d masters: quorum mode needs at least 3 independent masters", who, n)
	case cfg.ack.n != 0:
		return nil, invalidf("%s: WithReplicaAck does not apply to quorum mode (a majority of masters stands in for replicas)", who)
	case cfg.quorum.err != nil:
		return nil, cfg.quorum.err
	}
	if err := validPrefix(cfg.prefix); err != nil {
		return nil, err
	}
	addrs := make([]string, n)
	seen := map[string]int{}
	for i := range addrs {
		addr, not := master(i)
		if not != "" {
			return nil, invalidf("%s: master %d is %s", who, i, not)
		}
		if j, dup := seen[addr]; dup {
			return nil, invalidf("%s: masters %d and %d are both %s: the masters must be independent", who, j, i, addr)
		}
		seen[addr], addrs[i] = i, addr
	}
	drvs := make([]driver.Conn, n)
	for i := range drvs {
		drvs[i] = conn(i)
	}
	return newQuorum(cfg, drvs, addrs), nil
}

// newQuorum returns a quorum Client over the masters drvs, named by addrs
// (checked by quorumOver). Each master gets a Client of its own, for its
// pub/sub and its scripts.
func newQuorum(cfg clientConfig, drvs []driver.Conn, addrs []string) *Client {
	q := &quorum{maj: len(drvs)/2 + 1, every: make([]int, len(drvs)), node: cfg.quorum.node, delay: cfg.quorum.delay, epoch: wire.EpochKey(cfg.prefix)}
	for i, addr := range addrs {
		q.members = append(q.members, &member{addr: addr})
		q.every[i] = i
	}
	c := newClient(nil, cfg)
	c.q = q
	memberOpts := []Option{WithPrefix(cfg.prefix), WithLogger(cfg.logger), WithIdleExpiry(cfg.idle), WithAutoPipeline(false)}
	for i, m := range q.members {
		m.c = newOver(drvs[i], configure(memberOpts))
		m.c.parent = c
	}
	return c
}

// WithNodeTimeout bounds each request to one master in quorum mode
// (NewQuorum): a master that has not answered by then counts as not
// granting (its outcome unknown: what it may have granted is given back).
// Keep it far below the TTL: a grant's validity is what is left of the TTL
// after the masters answered. Default DefaultNodeTimeout.
func WithNodeTimeout(d time.Duration) Option {
	return func(c *clientConfig) {
		c.quorum.node, c.quorum.set = d, "WithNodeTimeout"
		if d < time.Millisecond {
			c.quorum.err = invalidf("WithNodeTimeout: %v: must be at least 1ms", d)
		}
	}
}

// WithRestartDelay is how long a quorum master whose process got its data
// recently refuses to vote: after a restart (with or without persistence:
// a snapshot or an AOF without appendfsync always lacks the last writes), a
// failover to a replica (which may lag), or when new. It must be at least
// the longest TTL of any Client of the quorum, which must all use the same
// delay. Leases longer than it are refused. 0 turns the check off, which is
// safe only with appendfsync always on every master and no failovers.
// Default DefaultRestartDelay.
func WithRestartDelay(d time.Duration) Option {
	return func(c *clientConfig) {
		c.quorum.delay, c.quorum.set = d, "WithRestartDelay"
		if d < 0 {
			c.quorum.err = invalidf("WithRestartDelay: %v: must not be negative", d)
		}
	}
}

// quorumConfig holds the quorum-only options.
type quorumConfig struct {
	node, delay time.Duration
	set         string // the name of a quorum option given (refused by New)
	err         error
}

// checkLock reports what a lock of kind with cfg cannot do in quorum mode.
func (q *quorum) checkLock(kind string, cfg lockConfig) error {
	switch {
	case kind == wire.KindRWMutex:
		return fmt.Errorf("RWMutex in quorum mode: %w", errors.ErrUnsupported)
	case kind == wire.KindSemaphore:
		return fmt.Errorf("Semaphore in quorum mode: %w", errors.ErrUnsupported)
	case cfg.fair:
		return fmt.Errorf("a Fair mutex in quorum mode: %w (there is no one line across masters)", errors.ErrUnsupported)
	}
	return q.checkTTL(wholeMillis(cfg.ttl))
}

// checkTTL reports a lease length that quorum mode cannot give: one whose
// lease is never valid (see validUntil and quorumSlack), or one longer
// than the restart delay.
func (q *quorum) checkTTL(ttl time.Duration) error {
	switch {
	case ttl-ttl/100 <= quorumSlack:
		return invalidf("TTL %v: a quorum lease is valid for its TTL less 1%% and %v, which leaves nothing", ttl, quorumSlack)
	case q.delay > 0 && ttl > q.delay:
		return invalidf("TTL %v is above the quorum's restart delay (%v, WithRestartDelay): a restarted master could vote while such a lease is valid", ttl, q.delay)
	}
	return nil
}

// A vote is one master's answer to a request.
type vote struct {
	i   int
	v   any
	err error
}

// fanOut sends f to every master at once, each bounded by the per-master
// timeout (and ctx), and delivers the answers as they come. The channel
// gets exactly one vote per master. Each request runs on its member's
// goroutines, which Close waits for: a caller that returns once the votes
// in decide (ask) leaves the rest running, bounded by the timeout.
func (q *quorum) fanOut(ctx context.Context, f func(ctx context.Context, m *member) (any, error), late func(m *member, v any, err error)) <-chan vote {
	return q.fanOutTo(ctx, q.every, nil, f, late)
}

// fanOutTo is fanOut to the masters listed in to: the channel gets one
// vote for each of them. before (if not nil) runs first, on the member's
// goroutine, outside the per-master timeout; it must return soon.
func (q *quorum) fanOutTo(ctx context.Context, to []int, before func(i int), f func(ctx context.Context, m *member) (any, error), late func(m *member, v any, err error)) <-chan vote {
	out := make(chan vote, len(to))
	for _, i := range to {
		m := q.members[i]
		send := func() {
			if before != nil {
				before(i)
			}
			nctx, cancel := context.WithTimeout(ctx, q.node)
			defer cancel()
			var l func(any, error)
			if late != nil {
				l = func(v any, err error) { late(m, v, err) }
			}
			v, err := m.c.aside(nctx, func(ctx context.Context) (any, error) { return f(ctx, m) }, l)
			out <- vote{i, v, err}
		}
		if !m.c.goBg(send) {
			go send() // the members are closing: a request raced with Close
		}
	}
	return out
}

// all collects every master's vote (in master order).
func (q *quorum) all(votes <-chan vote) []vote {
	out := make([]vote, len(q.members))
	for range q.members {
		v := <-votes
		out[v.i] = v
	}
	return out
}

// acquire asks every master for h's lock. It returns as soon as a majority
// granted (then the fence is raised on them, see raise), or once every
// master answered (or timed out) without one; what a failed attempt took is
// given back. r.left is set when other holders answered: every lease of
// theirs has ended by then. split: no one holder has a majority (contenders
// split the votes, or masters are down), so a retry soon may win without a
// release to wake it.
func (q *quorum) acquire(ctx context.Context, h *holding) (r look, split bool, err error) {
	lk, token := h.lk, h.token
	r.sent = h.c.sendTime()
	delay := formatMillis(q.delay)
	d := &decision{}
	defer func() { d.decide(q, lk, token, r.ok) }()
	proposed := q.clock.propose()
	propArg := formatUint(proposed)
	votes := q.fanOut(ctx, func(ctx context.Context, m *member) (any, error) {
		return quorumAcquireScript.run(ctx, m.c.drv, []string{lk.hash, q.epoch}, token, lk.ttlArg, delay, propArg)
	}, func(m *member, v any, err error) {
		// This master answered after its timeout: give back what it
		// granted (or may have), unless the attempt won and its lease
		// lives on. Renewals go to every master and count its
		// extension: a give-back would take away a master that a
		// renewal counted. Its release, sent after this reply, frees it.
		if granting(v, err) && !d.keep(h, m, err == nil) {
			q.dropLater(lk, m, token, err == nil)
		}
	})
	n := len(q.members)
	granted := make(map[int]uint64, n)
	var doubt, held, refused int // refused: no vote (restarting) or a bad reply
	var unknown []int            // the masters in doubt: their outcome is unknown
	var denials minorityCount    // the masters whose server refused the user (see refused)
	// heldBy counts the held replies by the holder's fence: a holder with
	// a majority has raised its fence on one (see raise), while contenders
	// in the middle of their attempts hold the masters with fences of each
	// master's own. Only a holder with a majority releases, and wakes
	// waiters; contenders give back without a wake-up.
	heldBy := map[int64]int{}
	var top int
	var firstErr error
	var left time.Duration
	got := 0
	answered := make([]bool, n)
	for ; got < n && len(granted) < q.maj; got++ {
		v := <-votes
		answered[v.i] = true
		a, _ := v.v.([]any)
		switch {
		case v.err != nil:
			if isForeign(v.err) {
				q.drain(votes, n-got-1)
				q.dropAll(ctx, lk, token)
				return r, false, lk.kindErr(v.err)
			}
			firstErr = cmp(firstErr, v.err)
			denials.saw(v.err)
			doubt++
			unknown = append(unknown, v.i)
		case len(a) < 2:
			firstErr = cmp(firstErr, fmt.Errorf("unexpected acquire reply %v", v.v))
			refused++
		case a[0] == int64(1):
			f, _ := a[1].(int64)
			granted[v.i] = uint64(f)
			q.clock.saw(uint64(f), proposed, r.sent.Add(quorumSlack), lk.ttl)
		case a[0] == int64(2):
			refused++
		default:
			ms, _ := a[1].(int64)
			if ms < 0 { // no expiry (not set by dlock): look again after a TTL
				ms = lk.ttl.Milliseconds()
			}
			left = max(left, time.Duration(ms)*time.Millisecond)
			held++
			var f int64
			if len(a) > 2 {
				f, _ = a[2].(int64)
			}
			heldBy[f]++
			top = max(top, heldBy[f])
		}
	}
	if doubt > 0 {
		h.acqDoubt = true // it may yet run, with the lock's TTL
	}
	if len(granted) >= q.maj {
		// Masters that answer later keep their grant for the lease (see
		// rest), or give it back if they answer after their timeout.
		fence, ok := q.raise(ctx, lk, token, granted)
		if ok && time.Now().Before(validUntil(r.sent, lk.ttl)) {
			r.ok, r.fence = true, fence
			h.votes = nil
			if got < n {
				h.votes = make([]chan struct{}, n)
				for i, in := range answered {
					if !in {
						h.votes[i] = make(chan struct{})
					}
				}
			}
			q.rest(h, votes, n-got)
			return r, false, nil
		}
		why := "its validity ran out while the masters answered"
		if !ok {
			why = "its fence could not be raised on a majority"
		}
		for _, v := range q.drain(votes, n-got) {
			if v.err != nil {
				unknown = append(unknown, v.i)
			} else if granting(v.v, nil) {
				f, _ := v.v.([]any)[1].(int64)
				granted[v.i] = uint64(f)
			}
		}
		q.giveBack(ctx, lk, token, granted, unknown)
		return r, true, fmt.Errorf("%w: acquire: %d of %d masters granted, but %s (given back)", ErrNotObtained, len(granted), n, why)
	}
	// No majority, and every vote is in (each bounded by the per-master
	// timeout): everything it granted is given back.
	if len(granted)+doubt > 0 {
		q.giveBack(ctx, lk, token, granted, unknown)
	}
	if held > 0 {
		r.left = left
		return r, top < q.maj, nil
	}
	firstErr = denials.curable(firstErr, n-q.maj)
	if doubt == n {
		return r, false, fmt.Errorf("acquire: no master answered: %w", firstErr)
	}
	return r, true, q.shortErr("acquire", len(granted), held, refused, doubt, firstErr)
}

// minorityCount counts the masters of one attempt that refused the user
// (ACL, authentication, certificate).
type minorityCount int

func (m *minorityCount) saw(err error) {
	if refused(err) {
		*m++
	}
}

// curable returns err marked as one that retrying can cure if the masters
// that refused were few enough (at most spare) for the others to make a
// majority: one misconfigured master is one that does not vote, as if it
// were down, not a reason for a Lock to give up.
func (m minorityCount) curable(err error, spare int) error {
	if err == nil || m == 0 || int(m) > spare {
		return err
	}
	return &minorityRefusal{err}
}

// minorityRefusal is an error of a quorum attempt in which some masters
// refused the user, too few to prevent a majority (see curable).
type minorityRefusal struct{ err error }

func (e *minorityRefusal) Error() string { return e.err.Error() }
func (e *minorityRefusal) Unwrap() error { return e.err }

// quorumPermanent is permanent, except for a refusal by a minority of the
// masters: the others may yet make a majority.
func quorumPermanent(err error) bool {
	var m *minorityRefusal
	return permanent(err) && !errors.As(err, &m)
}

// rest follows the last k votes of h's granted attempt, in the background.
// A master that grants after the decision keeps its grant for the lease:
// renewals and the release go to every master. Every release of h waits
// for the master's vote (awaitVote), so it runs after any grant the master
// made and frees it. A vote that timed out has its reply handed to
// acquire's late callback, which gives back a grant that comes once h is
// gone.
func (q *quorum) rest(h *holding, votes <-chan vote, k int) {
	if k == 0 {
		return
	}
	follow := func() {
		for range k {
			close(h.votes[(<-votes).i])
		}
	}
	if !h.c.goBg(follow) {
		follow() // the Client is closing: each vote comes within the per-master timeout
	}
}

// awaitVote waits until master i's acquire vote for h is in, an answer or
// its timeout (so within the acquire's per-master timeout): a release sent
// next runs after any grant the master made.
func (h *holding) awaitVote(i int) {
	if h.votes != nil && h.votes[i] != nil {
		<-h.votes[i]
	}
}

// gone reports whether h's release was sent or h ended otherwise.
func (h *holding) gone() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return !h.relSent.IsZero() || h.st.final()
}

// A decision is an acquire attempt's outcome, for the replies that come
// after their per-master timeout (acquire's late callback).
type decision struct {
	mu   sync.Mutex
	done bool
	won  bool
	late []lateGrant // late grants before the decision
}

// A lateGrant is a master whose acquire reply came after its timeout:
// granted, or an error (it may have).
type lateGrant struct {
	m       *member
	granted bool
}

// keep reports whether m's late grant stays for the attempt's lease: it
// won and h is not gone. Before the decision it is kept aside for decide.
func (d *decision) keep(h *holding, m *member, granted bool) bool {
	d.mu.Lock()
	if !d.done {
		d.late = append(d.late, lateGrant{m, granted})
		d.mu.Unlock()
		return true
	}
	won := d.won
	d.mu.Unlock()
	return won && !h.gone()
}

// decide records the attempt's outcome; a lost one gives back the late
// grants that came before it.
func (d *decision) decide(q *quorum, lk *lock, token string, won bool) {
	d.mu.Lock()
	d.done, d.won = true, won
	late := d.late
	d.late = nil
	d.mu.Unlock()
	if won {
		return
	}
	for _, g := range late {
		q.dropLater(lk, g.m, token, g.granted)
	}
}

// granting reports whether an acquire's reply granted the lock, or might
// have (an error).
func granting(v any, err error) bool {
	a, ok := v.([]any)
	return err != nil || ok && len(a) >= 2 && a[0] == int64(1)
}

// drain waits for the last k votes and returns them.
func (q *quorum) drain(votes <-chan vote, k int) []vote {
	out := make([]vote, 0, k)
	for range k {
		out = append(out, <-votes)
	}
	return out
}

// giveBack gives back what a failed attempt with token got: on the masters
// that granted it at once, waiting for them (as dropAll does); on those
// whose outcome is unknown in the background (dropLater), since they may
// be down and the caller would wait out their timeouts for nothing. A
// master that answered without granting has nothing of the attempt's.
func (q *quorum) giveBack(ctx context.Context, lk *lock, token string, granted map[int]uint64, unknown []int) {
	to := make([]int, 0, len(granted))
	for i := range granted {
		to = append(to, i)
	}
	votes := q.fanOutTo(ctx, to, nil, func(ctx context.Context, m *member) (any, error) {
		return q.releaseOn(ctx, m, lk, token, "0")
	}, nil)
	for range to {
		if v := <-votes; v.err != nil && ctx.Err() != nil {
			q.dropLater(lk, q.members[v.i], token, true)
		}
	}
	for _, i := range unknown {
		q.dropLater(lk, q.members[i], token, false)
	}
}

// shortErr says why a request had no majority: masters that granted, held
// by others, refused (restarting) and did not answer.
func (q *quorum) shortErr(what string, ok, held, refused, unknown int, err error) error {
	msg := fmt.Sprintf("%s: %d of %d masters granted, %d needed (%d held by others, %d not voting yet: restarted, failed over or new, %d did not answer)",
		what, ok, len(q.members), q.maj, held, refused, unknown)
	if err != nil {
		return fmt.Errorf("%s: %w", msg, err)
	}
	return errors.New(msg)
}

func cmp(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// raise makes the grant's fence the largest that the granting masters
// handed out and raises the counter to it on each of them that handed out
// less. It reports whether a majority now has it.
func (q *quorum) raise(ctx context.Context, lk *lock, token string, granted map[int]uint64) (uint64, bool) {
	var fence uint64
	for _, f := range granted {
		fence = max(fence, f)
	}
	// The granting masters that handed out less; a majority then has the
	// fence once enough of them confirm the raise.
	have := 0
	var to []int
	for i, f := range granted {
		if f == fence {
			have++
		} else {
			to = append(to, i)
		}
	}
	fs := formatUint(fence)
	votes := q.fanOutTo(ctx, to, nil, func(ctx context.Context, m *member) (any, error) {
		return quorumFenceScript.run(ctx, m.c.drv, []string{lk.hash}, token, fs)
	}, nil)
	for range to {
		if v := <-votes; v.err == nil && v.v == int64(1) {
			have++
		}
	}
	return fence, have >= q.maj
}

// dropAll releases token's lock on every master without waking waiters
// (the payload 0 is below every fence a waiter saw: see join). It waits for
// the masters while ctx lasts (each within the per-master timeout); one
// that has not answered when ctx ends is sent the release again in the
// background (dropLater), so that a frozen master costs the caller no more
// than its ctx. Masters that cannot be reached keep it until its TTL.
func (q *quorum) dropAll(ctx context.Context, lk *lock, token string) {
	votes := q.all(q.fanOut(ctx, func(ctx context.Context, m *member) (any, error) {
		return q.releaseOn(ctx, m, lk, token, "0")
	}, nil))
	for _, v := range votes {
		if v.err != nil && ctx.Err() != nil {
			q.dropLater(lk, q.members[v.i], token, false)
		}
	}
}

// dropLater releases token's lock on m in the background, within
// min(TTL, 5s). granted: m answered that it granted. Such a grant is given
// back even as the Client closes: in place once no goroutine may start (on
// the member's goroutine, which Close waits for). An unknown outcome, from
// a master that failed to answer and may well be unreachable, is given
// back only while the Client lives: Close would wait for its go-redis
// timeouts.
func (q *quorum) dropLater(lk *lock, m *member, token string, granted bool) {
	parent := lk.c.bg
	if granted {
		parent = context.Background()
	}
	drop := func() {
		ctx, cancel := context.WithTimeout(parent, min(lk.ttl, 5*time.Second))
		defer cancel()
		_, _ = q.releaseOn(ctx, m, lk, token, "0")
	}
	if !lk.c.goBg(drop) && granted {
		drop()
	}
}

// releaseOn runs release.lua for token on m (without a line), publishing
// fence as the released fence.
func (q *quorum) releaseOn(ctx context.Context, m *member, lk *lock, token, fence string) (any, error) {
	// Sent once (see script.do): a resend that go-redis made by itself
	// after a run whose reply was lost would answer "not the owner", and
	// Unlock would take a release that went through for a lost lease.
	args := []any{"evalsha", releaseScript.sha, "1", lk.hash, token, fence, m.c.idleArg, lk.hash, m.pubArg()}
	return releaseScript.do(ctx, m.c.drv, args, true)
}

// release releases h on every master and returns what holding.release
// makes of one master's reply, as soon as the answers in decide it: freed
// once a majority answered and no majority can say the lock was not h's
// (masters that failed keep it until its TTL, and do not make a majority
// that could grant it to someone else more likely than a master down
// would), not the owner once a majority said so, and an error if too few
// answered to tell.
//
// The masters still to answer are not waited for: one that is down would
// cost every Unlock the per-master timeout. Their releases go on in the
// background, apart from ctx (each within the per-master timeout), so a
// caller that returns and cancels ctx does not leave them held until
// their TTL.
func (q *quorum) release(ctx context.Context, h *holding) (any, error) {
	in := q.fanOutTo(context.WithoutCancel(ctx), q.every, h.awaitVote, func(ctx context.Context, m *member) (any, error) {
		return q.releaseOn(ctx, m, h.lk, h.token, h.fenceStr)
	}, nil)
	n := len(q.members)
	var ok, no int
	var firstErr error
	for answered := 1; answered <= n; answered++ {
		var v vote
		select {
		case v = <-in:
		case <-ctx.Done():
			return nil, fmt.Errorf("%d of %d masters answered: %w", ok+no, n, ctx.Err())
		}
		code, _ := v.v.(int64)
		switch {
		case v.err != nil:
			firstErr = cmp(firstErr, v.err)
		case code == wire.ReleaseNotOwner:
			no++
		default:
			ok++
		}
		switch {
		case no >= q.maj:
			return int64(wire.ReleaseNotOwner), nil
		case ok+no >= q.maj && no+n-answered < q.maj:
			return int64(wire.ReleaseFreed), nil
		}
	}
	return nil, fmt.Errorf("%d of %d masters answered: %w", ok+no, n, firstErr)
}

// releaseAll releases hs (at Close) in one pipeline per master, all at
// once: one round trip per master for every lease, where releases one
// after another would take one per lease out of Close's budget.
func (q *quorum) releaseAll(ctx context.Context, hs []*holding) {
	if len(hs) == 0 {
		return
	}
	awaitVotes := func(i int) {
		for _, h := range hs {
			h.awaitVote(i)
		}
	}
	_ = q.all(q.fanOutTo(ctx, q.every, awaitVotes, func(ctx context.Context, m *member) (any, error) {
		pub := m.pubArg()
		calls := make([]call, len(hs))
		for i, h := range hs {
			calls[i] = call{releaseScript, h.lk.keyArr[:1], []any{h.token, h.fenceStr, m.c.idleArg, h.lk.hash, pub}}
		}
		return m.pipe(ctx, calls)
	}, nil))
}

// pipe runs calls, all of one script, on m in one pipeline, and again
// once the script is loaded if m did not have it.
func (m *member) pipe(ctx context.Context, calls []call) ([]driver.Reply, error) {
	lines := make([][]any, len(calls))
	for j, k := range calls {
		lines[j] = k.s.line(k.keys, k.args)
	}
	r := m.c.drv.Pipe(ctx, lines, false)
	if isNoScript(r[0].Err) {
		if err := m.c.drv.LoadScript(ctx, calls[0].s.src); err != nil {
			return nil, err
		}
		r = m.c.drv.Pipe(ctx, lines, false)
	}
	return r, nil
}

// ask runs an extend or pttl call about h on every master and combines
// the answers as ask expects one master's: an extend is 1 with a majority
// that extended, 0 once no majority can have, else an error; a pttl is how
// long a majority still has it (-1: no majority can).
//
// It returns as soon as the answers in decide it: a master that is down
// costs the others nothing (its request ends at the per-master timeout,
// in the background).
func (q *quorum) ask(ctx context.Context, k call) (any, error) {
	in := q.fanOut(ctx, func(ctx context.Context, m *member) (any, error) {
		return k.s.run(ctx, m.c.drv, k.keys, k.args...)
	}, nil)
	votes := q.pending()
	for range q.members {
		v := <-in
		votes[v.i] = v
		if r, err := q.combine(k, votes); err == nil || isForeign(err) {
			return r, err
		}
	}
	return q.combine(k, votes)
}

// errPending stands for a vote not in yet.
var errPending = errors.New("no answer yet")

// pending returns a vote per master, each not in yet.
func (q *quorum) pending() []vote {
	votes := make([]vote, len(q.members))
	for i := range votes {
		votes[i] = vote{i: i, err: errPending}
	}
	return votes
}

func (q *quorum) combine(k call, votes []vote) (any, error) {
	var ms []int64
	var no int
	var firstErr error
	for _, v := range votes {
		n, isInt := v.v.(int64)
		switch {
		case v.err != nil:
			if isForeign(v.err) {
				return nil, v.err
			}
			firstErr = cmp(firstErr, v.err)
		case !isInt:
			firstErr = cmp(firstErr, fmt.Errorf("unexpected reply %v", v.v))
		case k.s == pttlScript && n >= 0, k.s != pttlScript && n == 1:
			ms = append(ms, n)
		default:
			no++
		}
	}
	n := len(q.members)
	switch {
	case len(ms) >= q.maj:
		if k.s != pttlScript {
			return int64(1), nil
		}
		slices.Sort(ms)
		return ms[len(ms)-q.maj], nil // a majority has at least this long
	case no > n-q.maj:
		if k.s != pttlScript {
			return int64(0), nil
		}
		return int64(-1), nil
	}
	what := "extend"
	if k.s == pttlScript {
		what = "pttl"
	}
	return nil, q.shortErr(what, len(ms), no, 0, n-len(ms)-no, firstErr)
}

// extends runs a renewal's extends: one pipeline per master, all at once,
// and combines each call's answers as combine does.
func (q *quorum) extends(ctx context.Context, calls []call) []driver.Reply {
	votes := q.all(q.fanOut(ctx, func(ctx context.Context, m *member) (any, error) {
		return m.pipe(ctx, calls)
	}, nil))
	out := make([]driver.Reply, len(calls))
	for j, k := range calls {
		vs := make([]vote, len(votes))
		for i, v := range votes {
			vs[i].i = i
			if r, ok := v.v.([]driver.Reply); ok && v.err == nil {
				vs[i].v, vs[i].err = r[j].Val, r[j].Err
			} else {
				vs[i].err = cmp(v.err, errors.New("no reply"))
			}
		}
		out[j].Val, out[j].Err = q.combine(k, vs)
	}
	return out
}

// join registers h's Lock as a quorum waiter: woken by a release published
// on any master. ready holds each master's subscription confirmation.
func (q *quorum) join(lk *lock, h *holding) (lc *local, w *waiter, ready []<-chan struct{}) {
	c := lk.c
	// seen 1: a give-back (dropAll, payload 0) wakes nobody; a release does.
	w = &waiter{h: h, box: make(chan mail, 1), look: make(chan struct{}, 1), seen: 1}
	for _, m := range q.members {
		ready = append(ready, m.c.hub.Want(lk.hash))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	lc = c.locals[lk.hash]
	if lc == nil {
		lc = &local{lk: lk}
		c.locals[lk.hash] = lc
	}
	lc.users++
	lc.line = append(lc.line, w)
	return lc, w, ready
}

func (q *quorum) leave(lc *local, w *waiter) {
	c := lc.lk.c
	c.mu.Lock()
	lc.line = remove(lc.line, w)
	lc.users--
	if lc.users == 0 && c.locals[lc.lk.hash] == lc {
		delete(c.locals, lc.lk.hash)
	}
	c.mu.Unlock()
	for _, m := range q.members {
		m.c.hub.Unwant(lc.lk.hash)
	}
}

// try is TryLock in quorum mode.
func (q *quorum) try(ctx context.Context, lk *lock) (*Lease, error) {
	h := lk.newHolding(ctx, 0)
	r, _, err := q.acquire(ctx, h)
	switch {
	case err != nil:
		return nil, lk.fail(ctx, err)
	case !r.ok:
		lk.c.obs.refused(ctx, lk)
		return nil, nameErr(lk.name, ErrNotObtained)
	}
	return lk.obtained(ctx, h, r, nil)
}

// lock is Lock in quorum mode: attempts until one wins, woken by releases
// on any master, each wait bounded by the longest lease a master reported
// (or a short random one after a split vote).
func (q *quorum) lock(ctx context.Context, lk *lock) (*Lease, error) {
	c := lk.c
	h := lk.newHolding(ctx, 0)
	r, split, err := q.acquire(ctx, h)
	switch {
	case err == nil && r.ok:
		return lk.obtained(ctx, h, r, nil)
	case ctx.Err() != nil || err != nil && quorumPermanent(err):
		return nil, lk.fail(ctx, err)
	}
	lc, w, ready := q.join(lk, h)
	defer q.leave(lc, w)
	defer c.obs.waiting(ctx, lk).done()
	// Look again once subscribed (or after subscribeWait: a master down
	// never confirms), or a release before the subscriptions went unheard.
	// One bound for all of them: it fires once.
	bound := time.NewTimer(subscribeWait)
wait:
	for _, ch := range ready {
		select {
		case <-ch:
		case <-bound.C:
			break wait
		case <-ctx.Done():
			break wait
		case <-c.bg.Done():
			break wait
		}
	}
	bound.Stop()
	if ctx.Err() == nil && !c.closed.Load() {
		r, split, err = q.retry(ctx, h)
	}
	backoff := q.node
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		var sleep time.Duration
		switch {
		case err == nil && r.ok:
			return lk.obtained(ctx, h, r, nil)
		case ctx.Err() != nil || err != nil && quorumPermanent(err):
			return nil, lk.fail(ctx, cmp(ctx.Err(), err))
		case err != nil || split:
			// Masters down, restarting or split among contenders: try
			// again after a random wait, growing, so that contenders that
			// split the votes do not meet again.
			c.cfg.logger.Debug("dlock: quorum acquire failed, retrying", "lock", lk.name, "err", err)
			sleep = time.Duration(rand.Int64N(int64(backoff))) + time.Millisecond
			backoff = min(2*backoff, max(lk.ttl/4, q.node))
		default:
			sleep, backoff = r.left, q.node
		}
		timer.Reset(max(sleep, time.Millisecond))
		select {
		case <-w.look:
		case <-timer.C:
		case <-ctx.Done():
			return nil, lk.fail(ctx, ctx.Err())
		case <-c.bg.Done():
			return nil, nameErr(lk.name, ErrClosed)
		}
		r, split, err = q.retry(ctx, h)
	}
}

// retry is a Lock's next attempt, under a token of its own: what gives
// back an earlier attempt by token may still be on its way (a late reply's
// give-back, a release that runs late), and must not release this one's
// grant.
func (q *quorum) retry(ctx context.Context, h *holding) (look, bool, error) {
	h.token = h.c.tokens.next()
	return q.acquire(ctx, h)
}

// quorumProto is a mutex in quorum mode: requests go through the quorum
// (see Client.eval's callers), so only giveBack is its own.
type quorumProto struct{ mutexProto }

func (quorumProto) prepare(*holding, int64) {}

func (quorumProto) giveBack(ctx context.Context, lk *lock, token string) error {
	lk.c.q.dropAll(ctx, lk, token)
	return nil
}

// closeMembers closes the masters' Clients (at Close).
func (q *quorum) closeMembers() {
	for _, m := range q.members {
		_ = m.c.Close()
	}
}

// pubArg is the publish command m's releases use: its server's, once its
// Client knows it (its subscriptions ask), else SPUBLISH, which Redis 7
// has. A release does not wait to ask: a master that is down would cost
// every release the per-master timeout, and a wake-up lost on a server
// without SPUBLISH (the script publishes with pcall) is one master's of
// several, and bounded by the holder's TTL in any case.
func (m *member) pubArg() string {
	if m.c.ps.known.Load() {
		return m.c.ps.arg
	}
	return wire.PublishSharded
}
