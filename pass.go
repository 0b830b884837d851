package dlock

import (
	"context"
	"fmt"
	"time"

	"github.com/dlock-go/dlock/internal/wire"
)

// A pass hands a default-mode mutex from a holder to the head waiter of the
// same Client without waiting for Redis: the waiter's Lock returns at once,
// and pass.lua records the new owner and fence at Redis a round trip later.
//
// Why it is safe:
//   - Until the record lands the lock at Redis is still the passer's token,
//     so no other Client can take it in between.
//   - The new lease is pending until then. It lives on the passer's
//     deadline, and no later than its own TTL after the record was first
//     sent (the record, if it ran, set that expiry). Its Unlock, Extend
//     and TTL wait for the record (the record holds its one request slot),
//     so passes and releases of one lock are recorded one at a time. Its
//     Unlock may pass the lock on before (pass.ahead): that record then
//     waits for this one to settle (not for the slot, which a concurrent
//     Unlock of the passer may hold while it waits for that pass), so it
//     is still sent after this one settles.
//   - If the record finds the passer no longer owning the lock (its lease
//     had been lost unnoticed), both leases are lost: the passer's Unlock
//     and the new lease say so, and the new lease's place in line is left
//     (a hand-over from Redis to it meanwhile is given back).
//   - The new fence is the old one plus one: above every fence granted
//     before, and below every fence granted after, since acquire.lua grants
//     max(f + 1, server clock in µs) and records land one at a time.
//
// Why it is worth it: a hand-off through Redis costs the releaser's
// message to Redis and Redis's message to the next holder's process, each
// waking an idle process; a pass costs a goroutine wake-up. Turns keep it
// fair between Clients (see Client.passOn).
type pass struct {
	from, to *holding
	fence    uint64    // from.fence + 1
	deadline time.Time // the passer's: the lock is its token's until the record lands
	turnEnd  uint64
	records  int           // this record, and those ahead of it that may be in flight
	ahead    bool          // made before from's own record landed: this record waits for it
	done     chan struct{} // closed once both holdings are settled
}

// record makes the pass known at Redis, retrying an unknown outcome until
// the passer's deadline; then it settles both holdings.
func (c *Client) record(p *pass) {
	from, to := p.from, p.to
	defer close(p.done)
	defer to.endOp() // after its state is settled: its waiting calls then see it
	ctx, cancel := context.WithDeadline(c.bg, p.deadline)
	defer cancel()
	keys := from.lk.scriptKeys()
	backoff := time.Millisecond
	var slot error // ahead: waiting for from's record failed (ctx ended)
	if p.ahead {
		// Ours goes once from's record has landed (or failed, when this
		// one finds the lock not from's), never before. Not from's slot:
		// a concurrent Unlock of from may take it after that record, only
		// to wait for this pass.
		slot = from.awaitRecord(ctx)
	}
	for {
		sent := time.Now()
		var v any
		err := slot
		if err == nil {
			v, err = c.eval(ctx, call{passScript, keys, []any{from.token, from.fenceStr, to.token, to.fenceStr, to.lk.ttlArg}})
		}
		switch {
		case err == nil && (v == int64(wire.PassRecorded) || v == int64(wire.PassAlone)):
			c.noteFence(to, p.fence, sent) // a grant at Redis, as far as fences go
			if v == int64(wire.PassAlone) {
				c.extendTurn(to)
			}
			from.settle(passed, nil)
			if !to.recorded(sent) {
				// Lost or closed meanwhile: nobody else will release it.
				c.giveBackAsync(to)
			}
			return
		case err == nil || isForeign(err):
			for q := to.passMade(); q != nil; {
				// to passed on ahead of this record (and so on, maybe):
				// those leases never held the lock either (their own
				// records, next, clean up).
				next := q.to.passMade()
				q.to.lose("the lock was no longer held when it was passed on")
				q = next
			}
			from.settle(lost, fmt.Errorf("%w: the lock was no longer held when it was passed on", ErrLockLost))
			to.lose("the lock was no longer held when it was passed on")
			c.giveBackAsync(to) // its place in line, and a hand-over from Redis to it
			return
		case ctx.Err() != nil:
			// Whether it landed is unknown: whichever token owns the
			// lock, nobody else would release it before its TTL. The old
			// token first: a record still in flight that runs after that
			// finds it not the passer's; one that ran before made it the
			// new token's, given back next. The passer gave the lock up
			// before its deadline: its Unlock reports the failure (or
			// Close), not a loss, as a release of unknown outcome does.
			if c.closed.Load() {
				from.settle(closed, ErrClosed)
			} else {
				from.settle(released, fmt.Errorf("release: the lock was passed to another waiter of this Client, and the pass could not be recorded at Redis before this lease's deadline (%w); it is given back in the background", err))
			}
			to.lose(fmt.Sprintf("the pass could not be recorded at Redis in time: %v", err))
			release := func() {
				rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
				defer cancel()
				_, _ = c.releaseCallAt(rctx, from)
				_ = to.lk.proto.giveBack(rctx, to.lk, to.token)
			}
			if !c.goBg(release) {
				release()
			}
			return
		}
		// Unknown: it may have run, with the new holder's TTL.
		to.doubted(sent, to.lk.ttl)
		c.cfg.logger.Debug("dlock: recording a pass failed, retrying", "lock", from.lk.name, "err", err)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 100*time.Millisecond)
	}
}

// giveBackAsync leaves the line for h's token and releases the lock if the
// token owns it, in the background.
func (c *Client) giveBackAsync(h *holding) {
	h.lk.abandon(c.bg, h.token, ErrLockLost)
}

// releaseCallAt releases h's token with its fence (a pass that could not be
// recorded), whatever h's state.
func (c *Client) releaseCallAt(ctx context.Context, h *holding) (any, error) {
	return h.cmd.relScript.do(ctx, c.drv, h.cmd.release(), false)
}
