package dlock

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// state is where a holding is in its life. Every change of state is a
// method of holding below, made under holding.mu:
//
//	waiting ──granted──▶ held ◀──recorded── pending ◀──passed to us── waiting
//	                      │                   │
//	                      ├──Unlock──▶ ending ◀┘ (Unlock while pending)
//	                      │              ├──pass to a local waiter──▶ passing ──▶ passed | lost
//	                      │              └──release at Redis──▶ released | lost
//	                      └──renewal refused, deadline passed, record refused──▶ lost
//	pending, held ──Client.Close──▶ closed
//
// pending and held are live: the holder may rely on the lock until the
// deadline. ending and passing are on their way out: the holder gave the
// lock up, Redis may still name our token. The rest are final.
type state uint8

const (
	waiting  state = iota // Lock is trying to obtain it
	pending               // passed to us by a holder of this Client; recorded at Redis a round trip later
	held                  // ours at Redis
	ending                // given up by Unlock; not yet released or passed on
	passing               // passed to a local waiter; its record is in flight
	passed                // final: the record landed, the waiter holds it
	released              // final: released at Redis
	lost                  // final: it may be someone else's (cause says why)
	closed                // final: the Client closed
)

func (s state) live() bool  { return s == pending || s == held }
func (s state) final() bool { return s >= passed }

// validUntil is the one rule that dates a lease. A request sent at sent that
// made the lock expire ttl after Redis ran it proves the lock ours until
// sent + ttl on our monotonic clock, less 1% of ttl for the rate difference
// of the two clocks. Nothing else computes a deadline.
func validUntil(sent time.Time, ttl time.Duration) time.Time { return sent.Add(ttl - ttl/100) }

// sendTime is the time a request about to be sent counts as sent at: now,
// or in quorum mode quorumSlack earlier.
func (c *Client) sendTime() time.Time {
	if c.q != nil {
		return time.Now().Add(-quorumSlack)
	}
	return time.Now()
}

// holding is one ownership of a lock at Redis, shared by the reentrant
// leases on it. Requests to Redis about it are made one at a time, between
// beginOp and endOp, so their replies apply in the order they were sent.
type holding struct {
	c      *Client
	lk     *lock
	token  string
	parent context.Context // the ctx Lock was called with: the lease context's values come from it
	n      int64           // the permits it takes (a semaphore's; see proto.prepare)
	cmd    cmdline         // its prepared acquire and release command lines

	mu       sync.Mutex
	st       state
	fence    uint64
	fenceStr string
	ttl      time.Duration // the lease length renewals ask for
	deadline time.Time     // valid until then (see validUntil)
	proofAt  time.Time     // when the request behind the deadline was sent
	proofTTL time.Duration // and the TTL the deadline counts from it
	doubt    time.Duration // the shortest TTL of a request whose outcome is unknown; 0: none
	cause    error         // why it ended, in a final state (nil: released or passed; released: a pass that was given back)
	holds    int           // leases on it not yet unlocked
	busy     bool          // a request about it is in flight
	inRecord bool          // that request is the record of the pass that made it (pass.go)
	idle     chan struct{} // closed when busy clears, if someone waits for that
	pass     *pass         // passing: the pass Unlock made
	relSent  time.Time     // when its first release was sent (zero: none yet)
	ctx      *leaseContext
	cancel   context.CancelCauseFunc
	// Default mode: the last local waiter of this Client's turn (see
	// queue.go); 0: none. Set before the holding is shared or by the pass
	// to it, raised by extendTurn.
	turnEnd uint64
	// Pending: how many pass records, the one of the pass that made it
	// included, may land before its own (set by that pass; see passOn).
	records int

	// Set before the holding is shared.
	contended bool // obtained after waiting: its release is likely awaited
	acqDoubt  bool // an acquire of it had an unknown outcome
	// Its token is a MultiLock take's, shared with the take's other parts:
	// never replaced (see spent).
	sharedToken bool
	votes       []chan struct{} // quorum: per master, closed once the acquire vote is in; nil: in when it won (see rest)

	tried time.Time // when the last renewal was sent
	obsAt time.Time // when it became live, if observed (observe.go)

	// Watchdog bookkeeping, guarded by c.dog.mu.
	due   time.Time
	slack time.Duration // how much before due it may be renewed
	idx   int           // position in the watchdog heap, -1 when absent

	first Lease // the outermost lease, allocated with the holding
}

func (l *lock) newHolding(ctx context.Context, n int64) *holding {
	h := &holding{c: l.c, lk: l, token: l.c.tokens.next(), parent: ctx, n: n, ttl: l.ttl, holds: 1, idx: -1}
	h.first.h = h
	l.proto.prepare(h, n)
	return h
}

// beginOp waits until no other request about h is in flight, or ctx ends.
func (h *holding) beginOp(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.waitWhile(ctx, func() bool { return h.busy }); err != nil {
		return err
	}
	h.busy = true
	return nil
}

// awaitRecord waits until the record of the pass that made h is no longer
// in flight, or ctx ends.
func (h *holding) awaitRecord(ctx context.Context) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.waitWhile(ctx, func() bool { return h.inRecord })
}

// waitWhile waits, with h.mu held (released while it sleeps), until cond
// is false or ctx ends; endOp wakes it.
func (h *holding) waitWhile(ctx context.Context, cond func() bool) error {
	for cond() {
		if h.idle == nil {
			h.idle = make(chan struct{})
		}
		idle := h.idle
		h.mu.Unlock()
		select {
		case <-idle:
		case <-ctx.Done():
			h.mu.Lock()
			return ctx.Err()
		}
		h.mu.Lock()
	}
	return nil
}

func (h *holding) endOp() {
	h.mu.Lock()
	h.busy, h.inRecord = false, false
	if h.idle != nil {
		close(h.idle)
		h.idle = nil
	}
	h.mu.Unlock()
	h.c.dog.schedule(h) // renewals wait while a request is in flight
}

// granted makes a waiting holding held: a request sent at sent, carrying
// ttl, obtained the lock with fence.
func (h *holding) granted(fence uint64, sent time.Time, ttl time.Duration) {
	h.c.noteFence(h, fence, sent)
	h.mu.Lock()
	h.st = held
	h.setFence(fence)
	if h.acqDoubt {
		// That acquire may still run, setting the lock's TTL again.
		h.doubt = h.lk.ttl
	}
	h.proveLocked(sent, ttl)
	h.mu.Unlock()
	h.c.obs.held(h) // before the watchdog (or Close) can end it
	h.c.dog.schedule(h)
}

// passedIn makes a waiting holding pending: p passes the lock to it. The
// record goroutine owns its one request slot until the record settles.
// Called by the passer, under c.mu, before the waiter can see the pass:
// the waiter observes the lease held when it takes the pass (passedTo),
// for no instrument may be called under c.mu (see obsNote).
func (h *holding) passedIn(p *pass, now time.Time) {
	h.mu.Lock()
	h.st = pending
	h.busy, h.inRecord = true, true
	h.setFence(p.fence)
	h.turnEnd = p.turnEnd
	h.records = p.records
	h.contended = true
	// Until the record lands the lock expires when the passer's would;
	// once it runs, ttl after it: whichever comes first. (Only the
	// deadline: the record is not in doubt until one of its calls is.)
	h.deadline, h.proofAt = minTime(p.deadline, validUntil(now, h.ttl)), now
	h.mu.Unlock()
	h.c.dog.schedule(h)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func (h *holding) setFence(f uint64) {
	h.fence = f
	h.fenceStr = formatUint(f)
}

// proved applies a reply that showed the lock ours: the request, sent at
// sent, set it to expire ttl after Redis ran it.
func (h *holding) proved(sent time.Time, ttl time.Duration) {
	h.mu.Lock()
	if h.st.live() || h.st == ending {
		h.proveLocked(sent, ttl)
	}
	h.mu.Unlock()
	h.c.dog.schedule(h)
}

// extended applies a successful Extend: ttl is the lease length from now on.
func (h *holding) extended(sent time.Time, ttl time.Duration) {
	h.mu.Lock()
	h.ttl = ttl
	if h.st.live() || h.st == ending {
		h.proveLocked(sent, ttl)
	}
	h.mu.Unlock()
	h.c.dog.schedule(h)
}

func (h *holding) proveLocked(sent time.Time, ttl time.Duration) {
	// A request whose outcome stayed unknown may yet run after this one,
	// with its own TTL: the lock then expires that long after sent.
	if h.doubt > 0 {
		ttl = min(ttl, h.doubt)
	}
	h.deadline, h.proofAt, h.proofTTL = validUntil(sent, ttl), sent, ttl
}

// sending applies a request carrying ttl, sent at sent, before its reply:
// if Redis runs it, the lock expires ttl after it, perhaps earlier than
// believed so far (an Extend to a shorter TTL). Its reply dates the lease
// again (proved, extended) or leaves it in doubt (doubted).
func (h *holding) sending(sent time.Time, ttl time.Duration) {
	h.mu.Lock()
	h.deadline = minTime(h.deadline, validUntil(sent, ttl))
	h.mu.Unlock()
	h.c.dog.schedule(h)
}

// doubted applies a request, sent at sent with ttl, whose outcome is
// unknown: if it ran, the lock expires ttl after it, perhaps earlier than
// believed so far.
func (h *holding) doubted(sent time.Time, ttl time.Duration) {
	h.mu.Lock()
	h.doubtLocked(sent, ttl)
	h.mu.Unlock()
	h.c.dog.schedule(h)
}

func (h *holding) doubtLocked(sent time.Time, ttl time.Duration) {
	h.deadline = minTime(h.deadline, validUntil(sent, ttl))
	if h.doubt == 0 || ttl < h.doubt {
		h.doubt = ttl
	}
}

// recorded applies a landed pass record to the holding it made: pending
// becomes held, dated from the record's send. It reports whether the
// holding still wants the lock (false: it was lost or closed meanwhile, and
// the record's owner must release it).
func (h *holding) recorded(sent time.Time) bool {
	h.mu.Lock()
	if h.st == pending {
		h.st = held
	}
	// passing: it passed the lock on before this record landed; the record
	// of that pass, next, settles it.
	live := h.st == held || h.st == ending || h.st == passing
	if live {
		h.proveLocked(sent, h.ttl)
	}
	h.mu.Unlock()
	h.c.dog.schedule(h)
	return live
}

// end moves a live holding (or, for lose, one on its way out) to a final
// or ending state and ends its context. It reports whether it did.
func (h *holding) end(to state, cause error) bool {
	ok, n := h.endNoted(to, cause)
	h.c.obs.record(n)
	return ok
}

// endNoted is end, leaving what it observed for the caller to record: the
// metrics of a lease's end follow its context's end (the goroutine that
// ended it records them next), not under h.mu (see obsNote).
func (h *holding) endNoted(to state, cause error) (bool, obsNote) {
	h.mu.Lock()
	from := h.st
	ok := from.live() || (to == lost && (from == ending || from == passing))
	if !ok {
		h.mu.Unlock()
		return false, obsNote{}
	}
	h.st = to
	n := h.c.obs.ended(h, from, to, cause)
	if to.final() {
		h.cause = cause
	}
	if h.cancel != nil && from.live() {
		// Under h.mu: whoever sees the state not live sees the context
		// ended too (Err never reports a live lease that is not).
		h.cancel(cause)
	}
	h.mu.Unlock()
	h.c.dog.remove(h)
	if to == lost && from.live() {
		h.c.cfg.logger.Warn("dlock: lease lost", "lock", h.lk.name, "fence", h.fence, "cause", cause)
	}
	return true, n
}

// lose ends the holding with cause ErrLockLost (wrapping why).
func (h *holding) lose(why string) bool {
	return h.end(lost, lostErr(why))
}

func lostErr(why string) error { return fmt.Errorf("%w: %s", ErrLockLost, why) }

// giveUp is the start of the last Unlock: the lease ends for its holder
// (context canceled, no more renewals) before anything is sent.
func (h *holding) giveUp() { h.end(ending, context.Canceled) }

// startPass moves an ending holding to passing, with p its pass.
func (h *holding) startPass(p *pass) {
	h.mu.Lock()
	h.st, h.pass = passing, p
	turnEnd := h.turnEnd // raised since passOn read it, perhaps (extendTurn)
	h.mu.Unlock()
	p.to.raiseTurn(turnEnd)
}

// raiseTurn makes h's turn end no earlier than at the waiter numbered
// seq, unless h is final or has no turn; it returns the holding h passed
// the lock to, if it has.
func (h *holding) raiseTurn(seq uint64) (next *holding) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.st.final() {
		return nil
	}
	if h.turnEnd != 0 {
		h.turnEnd = max(h.turnEnd, seq)
	}
	if h.pass != nil {
		return h.pass.to
	}
	return nil
}

// settle makes an ending or passing holding final.
func (h *holding) settle(to state, cause error) {
	var n obsNote
	h.mu.Lock()
	if h.st == ending || h.st == passing {
		h.st, h.cause = to, cause
		n = h.c.obs.settled(h, to)
	}
	h.mu.Unlock()
	h.c.obs.record(n)
}

// closeDown ends a live holding as its Client closes; it reports whether
// the lock must be released now (a pending one is released by its record).
func (h *holding) closeDown() (release bool) {
	h.mu.Lock()
	st := h.st
	h.mu.Unlock()
	return h.end(closed, ErrClosed) && st == held
}

// passMade returns the pass h made, if it is passing.
func (h *holding) passMade() *pass {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.st != passing {
		return nil
	}
	return h.pass
}

// live reports whether the holding is pending or held.
func (h *holding) live() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.st.live()
}

// snapshot returns the state and why it ended.
func (h *holding) snapshot() (state, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.st, h.cause
}

// expired ends a live holding whose deadline has passed, so that a holder
// resuming from a pause sees its lease ended before any timer has fired.
func (h *holding) expired(now time.Time) bool {
	gone, n := h.expiredNoted(now)
	h.c.obs.record(n)
	return gone
}

// expiredNoted is expired, leaving what it observed for the caller to
// record (the watchdog records it aside: see Client.watch).
func (h *holding) expiredNoted(now time.Time) (bool, obsNote) {
	h.mu.Lock()
	gone := h.st.live() && !now.Before(h.deadline)
	h.mu.Unlock()
	if !gone {
		return false, obsNote{}
	}
	return h.endNoted(lost, lostErr("lease deadline passed before renewal"))
}

// startRenewal takes h's request slot for a renewal if h is held, renewed
// and has no request in flight, and returns the TTL to renew to. Both under
// one lock: an Extend between reading the TTL and taking the slot would
// leave the renewal carrying a TTL older than the lease's proof.
func (h *holding) startRenewal() (time.Duration, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.st != held || !h.lk.renew || h.busy {
		return 0, false
	}
	h.busy = true
	return h.ttl, true
}

// context returns the lease context, creating it on first use (most leases
// never need one).
func (h *holding) context() context.Context {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ctx == nil {
		ctx, cancel := context.WithCancelCause(context.WithoutCancel(h.parent))
		h.ctx = &leaseContext{Context: ctx, h: h}
		h.cancel = cancel
		if !h.st.live() {
			cause := h.cause
			if cause == nil {
				cause = context.Canceled
			}
			cancel(cause)
		}
	}
	return h.ctx
}

type leaseKey struct{}

// leaseContext is the context of a holding. It checks the lease deadline on
// every Done and Err, and lets Lock find the holding for reentrancy.
type leaseContext struct {
	context.Context
	h *holding
}

func (c *leaseContext) Done() <-chan struct{} {
	c.h.expired(time.Now())
	return c.Context.Done()
}

func (c *leaseContext) Err() error {
	c.h.expired(time.Now())
	return c.Context.Err()
}

func (c *leaseContext) Value(key any) any {
	if key == (leaseKey{}) {
		return c.h
	}
	return c.Context.Value(key)
}

// reenter adds one more lease to a live holding (a reentrant Lock).
func (h *holding) reenter() (*Lease, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.st.live() {
		return nil, nameErr(h.lk.name, h.endCause())
	}
	h.holds++
	return &Lease{h: h}, nil
}

// endCause is why a holding that is not live ended. Called with h.mu held.
func (h *holding) endCause() error {
	if h.cause != nil {
		return h.cause
	}
	return fmt.Errorf("%w: lease already unlocked", ErrLockLost)
}
