package dlock

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// A pass hands a default-mode mutex from a holder to the head waiter of the
// same Client without waiting for Redis: the waiter's Lock returns at once,
// and pass.lua records the new owner and fence at Redis a round trip later.
//
// Why it is safe: until the record lands, the lock at Redis is still owned
// by the old holder's token, so no other Client can take it; the new lease
// inherits the old one's deadline (that token's validity, measured on the
// monotonic clock) and gets its own only once the record is confirmed. If
// the record finds the old holder no longer owning the lock (its lease had
// been lost unnoticed), the new lease ends with ErrLockLost, as the old one
// would have. The new fence is the old one plus one: above every fence
// granted before, and below every fence granted after, since acquire.lua
// grants max(f + 1, server clock in µs) and passes are recorded one at a
// time (a holder that was passed the lock waits for its record before it
// passes or releases it in turn).
//
// Why it is worth it: a hand-off through Redis costs the releaser's message
// to Redis and Redis's message to the next holder's process, each waking an
// idle process (about 0.25 ms here, where the hot PING round trip is
// 25 µs); a pass costs one goroutine wake-up. Turns keep it fair between
// Clients: a holder that got the lock through Redis starts its Client's turn,
// and the lock is passed only to waiters that were queued when the turn
// began; then it goes back to the line at Redis, to the next Client.
type pass struct {
	fromToken, fromFence string // the old holding's
	toToken, toFence     string // the waiter's token, and fromFence + 1
	fence                uint64 // fromFence + 1
	ttlArg               string // the waiter's TTL in ms
	keys                 []string
	deadline             time.Time // the old lease's: the new one's until recorded
	turnEnd              uint64
	done                 chan struct{} // closed once settled (and applied to the holding, if taken)

	mu      sync.Mutex
	to      *holding // the waiter's holding, once it took the pass
	settled bool
	err     error     // nil if recorded, else why the new lease was lost
	why     string    // with err
	sent    time.Time // when the record that landed was sent
}

// passMargin is the least an old holder's lease must have left for it to be
// passed on: the new holder relies on it until the pass is recorded.
const passMargin = 50 * time.Millisecond

// passOn gives h's lock (being unlocked) to this Client's head waiter for
// it, if that waiter is asleep in line and was queued before h's turn ended.
// It returns nil if there is no such waiter; otherwise the waiter is woken,
// takes the pass (takePass) and its Lock returns, while the pass is recorded
// at Redis in the background.
func (c *Client) passOn(h *holding) *pass {
	if h.acqScript != acquireScript || h.turnEnd == 0 {
		return nil // Fair, semaphore and RWMutex holders keep the line's order
	}
	h.mu.Lock()
	deadline := h.deadline
	h.mu.Unlock()
	if time.Until(deadline) < passMargin {
		return nil
	}
	c.mu.Lock()
	q := c.queues[h.key]
	if q == nil || len(q.waiters) == 0 {
		c.mu.Unlock()
		return nil
	}
	w := q.waiters[0]
	if !w.ready || w.seq > h.turnEnd || c.closed.Load() {
		c.mu.Unlock()
		return nil
	}
	grant := c.grants[w.token]
	if grant == nil || len(grant) != 0 {
		// A hand-over from Redis is already waiting for it: the lock at
		// Redis is not ours any more. Release as usual (and learn so).
		c.mu.Unlock()
		return nil
	}
	p := &pass{
		fromToken: h.token, fromFence: h.fenceStr, toToken: w.token, fence: h.fence + 1,
		ttlArg: w.ttlArg, keys: h.keys, deadline: deadline, turnEnd: h.turnEnd, done: make(chan struct{}),
	}
	p.toFence = strconv.FormatUint(p.fence, 10)
	// Start the record before waking the waiter: the goroutine woken last
	// runs next on this P, and the waiter's Lock should return first.
	if !c.goBg(func() { c.record(p) }) {
		c.mu.Unlock()
		return nil // closing: release as usual
	}
	w.ready, w.pass = false, p
	// Every send on a grant channel holds c.mu, and this one is empty with
	// room for one: the send cannot block. Only a pass sends 0 (fences
	// start far above it).
	grant <- 0
	c.mu.Unlock()
	return p
}

// takePass makes h, the holding of a waiter that was passed the lock, held:
// fence + 1 and the old lease's deadline until the record lands. It reports
// false if the Client closed meanwhile, after releasing the lock (raced).
func (c *Client) takePass(h *holding, p *pass) bool {
	h.fence, h.fenceStr = p.fence, p.toFence
	h.deadline = p.deadline
	h.turnEnd = p.turnEnd
	h.contended = true
	h.pending = p
	c.dog.addPending(h)
	p.mu.Lock()
	p.to = h
	settled := p.settled
	p.mu.Unlock()
	if settled {
		p.apply(h)
	}
	return !h.raced(context.Background())
}

// record makes the pass known at Redis, retrying an unknown outcome until
// the inherited deadline.
func (c *Client) record(p *pass) {
	ctx, cancel := context.WithDeadline(c.bg, p.deadline)
	defer cancel()
	backoff := time.Millisecond
	for {
		sent := time.Now()
		v, err := passScript.run(ctx, c.rdb, p.keys, p.fromToken, p.fromFence, p.toToken, p.toFence, p.ttlArg)
		switch {
		case err == nil && v == int64(1):
			p.finish(nil, "", sent)
			return
		case err == nil || isForeign(p.keys[0], err):
			// The old lease had been lost. If the lock came round to the
			// waiter's token through Redis meanwhile (that hand-over found
			// the pass on its grant channel and was dropped), give it back:
			// the waiter holds a lost lease, not that grant.
			c.releasePassed(ctx, p)
			p.finish(ErrLockLost, "the lock was no longer held when it was passed on", sent)
			return
		case ctx.Err() != nil:
			// Whether it landed is unknown: whichever token owns the lock,
			// nobody else would release it before its TTL.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			c.releasePassed(rctx, p)
			cancel()
			p.finish(ErrLockLost, fmt.Sprintf("the pass could not be recorded at Redis in time: %v", err), sent)
			return
		}
		c.cfg.logger.Debug("dlock: recording a pass failed, retrying", "lock", p.keys[0], "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 100*time.Millisecond)
	}
}

// releasePassed releases p's lock, if either of its tokens owns it (each
// release compares the owner first).
func (c *Client) releasePassed(ctx context.Context, p *pass) {
	// The old token first: a record still in flight that runs after it
	// finds the lock not the old holder's and changes nothing; one that ran
	// before it made the new token the owner, released next.
	_, _ = releaseScript.run(ctx, c.rdb, p.keys, p.fromToken, p.fromFence, c.idleArg, p.keys[0])
	_, _ = releaseScript.run(ctx, c.rdb, p.keys, p.toToken, p.toFence, c.idleArg, p.keys[0])
}

// finish settles the pass and applies the outcome to the waiter's holding
// if it has taken the pass (else takePass will).
func (p *pass) finish(err error, why string, sent time.Time) {
	p.mu.Lock()
	p.settled, p.why, p.sent = true, why, sent
	if err != nil {
		p.err = fmt.Errorf("%w: %s", err, why)
	}
	to := p.to
	p.mu.Unlock()
	if to != nil {
		p.apply(to)
	}
	close(p.done)
}

// apply gives a recorded pass's holding its own deadline and renewal, or
// ends it if the pass failed; it runs once, after both the record settled
// and the waiter took the pass.
func (p *pass) apply(h *holding) {
	if p.err != nil {
		h.lose(p.why)
		return
	}
	h.mu.Lock()
	if h.state == stateHeld {
		h.deadline = p.sent.Add(validity(h.ttl))
	}
	due := h.nextDue(p.sent)
	h.mu.Unlock()
	h.c.dog.reschedule(h, due)
}

// settle waits until a lease passed to h is recorded at Redis (or lost);
// everything that talks to Redis about h waits for it first.
func (h *holding) settle(ctx context.Context) error {
	p := h.pending
	if p == nil {
		return nil
	}
	select {
	case <-p.done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("the lock passed to this lease is not yet recorded at Redis: %w", ctx.Err())
	}
}

// result waits for the pass to settle, for the Unlock that made it:
// settled reports whether it did before ctx ended.
func (p *pass) result(ctx context.Context) (settled bool, err error) {
	select {
	case <-p.done:
		return true, p.err
	case <-ctx.Done():
		return false, ctx.Err()
	}
}
