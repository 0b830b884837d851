package dlock

import (
	"context"
	"fmt"
	"strconv"
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
	from, to *holding
	done     chan struct{} // closed once settled
	err      error         // set before done closes: nil if recorded, else why the new lease was lost
}

// passMargin is the least an old holder's lease must have left for it to be
// passed on: the new holder relies on it until the pass is recorded.
const passMargin = 50 * time.Millisecond

// passOn gives h's lock (being unlocked) to this Client's head waiter for
// it, if that waiter is asleep waiting and was queued before h's turn began.
// h's lease is valid until deadline. It returns nil if there is no such
// waiter; otherwise the waiter's Lock is returning and the record is being
// made in the background.
func (c *Client) passOn(h *holding, deadline time.Time) *pass {
	if h.acqScript != acquireScript || h.turnEnd == 0 || time.Until(deadline) < passMargin {
		return nil // Fair, semaphore and RWMutex holders keep the line's order
	}
	c.mu.Lock()
	q := c.queues[h.key]
	if q == nil || len(q.waiters) == 0 {
		c.mu.Unlock()
		return nil
	}
	w := q.waiters[0]
	to := w.ready
	if to == nil || w.seq > h.turnEnd {
		c.mu.Unlock()
		return nil
	}
	w.ready, w.passed = nil, true
	grant := c.grants[to.token]
	c.mu.Unlock()

	p := &pass{from: h, to: to, done: make(chan struct{})}
	to.fence = h.fence + 1
	to.fenceStr = strconv.FormatUint(to.fence, 10)
	to.deadline = deadline
	to.turnEnd = h.turnEnd
	to.contended = true
	to.pending = p
	c.dog.addPending(to)
	if !c.goBg(func() { c.record(p) }) {
		p.settle(nil, "the Client closed before the pass was recorded")
	}
	grant <- 0 // buffered, and only a pass sends 0 (fences start above it)
	return p
}

// record makes the pass known at Redis, retrying an unknown outcome until
// the new holder's inherited deadline.
func (c *Client) record(p *pass) {
	to, from := p.to, p.from
	ttl := strconv.FormatInt(to.ttl.Milliseconds(), 10)
	ctx, cancel := context.WithDeadline(c.bg, to.deadline)
	defer cancel()
	backoff := time.Millisecond
	for {
		sent := time.Now()
		v, err := passScript.run(ctx, c.rdb, to.keys, from.token, from.fenceStr, to.token, to.fenceStr, ttl)
		switch {
		case err == nil && v == int64(1):
			to.mu.Lock()
			if to.state == stateHeld {
				to.deadline = sent.Add(validity(to.ttl))
			}
			due := to.nextDue(sent)
			to.mu.Unlock()
			c.dog.reschedule(to, due)
			p.settle(nil, "")
			return
		case err == nil || isForeign(to.key, err):
			p.settle(ErrLockLost, "the lock was no longer held when it was passed on")
			return
		case ctx.Err() != nil:
			// It may have landed: then the new token owns the lock, which
			// nobody would release before its TTL.
			c.abandonHolding(to)
			p.settle(ErrLockLost, fmt.Sprintf("the pass could not be recorded at Redis in time: %v", err))
			return
		}
		c.cfg.logger.Debug("dlock: recording a pass failed, retrying", "lock", to.name, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 100*time.Millisecond)
	}
}

// settle ends the pass: with err, the new lease is lost (why says how).
func (p *pass) settle(err error, why string) {
	if err != nil {
		p.err = fmt.Errorf("%w: %s", err, why)
		p.to.lose(why)
	}
	close(p.done)
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

// abandonHolding releases, with a fresh deadline, a holding whose state at
// Redis is unknown.
func (c *Client) abandonHolding(h *holding) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.bg), min(h.ttl, 5*time.Second))
	defer cancel()
	_, _ = h.relScript.do(ctx, c.rdb, h.rel[:h.relLen])
}
