package dlock

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// fairLiveness is how long a waiter's place in the line at Redis holds
// without the waiter refreshing it (it refreshes every third of it). A
// waiter that died or gave up is skipped within this bound, and a lock
// handed to a waiter that died a moment before lives on for at most about
// three times it.
const fairLiveness = time.Second

// subscribeWait bounds how long a waiter waits for its subscriptions to be
// confirmed before it looks at the lock anyway (bounded by the holder's TTL
// as ever, and by its refreshes).
const subscribeWait = time.Second

// wait is Lock after its first look: h waits in the lock's line at Redis
// until a release hands it the lock, a holder of this Client passes it the
// lock (default mode), a look finds the lock free for it, or ctx ends.
//
// In default mode the Client's waiters for a lock queue locally in arrival
// order and only the head waits in the line at Redis: the lock goes round
// the Clients in turn, and each serves its own waiters in order. Fair,
// semaphore and RWMutex waiters all wait in the line themselves.
//
// holder is the fence of the holder that the caller's look found, if it
// looked (0: it did not).
//
// A grant that reaches the waiter too late to be valid (its look's reply,
// a hand-over or a pass: see attempt, handedOver, passedTo) is given back,
// and its token is spent: the wait goes on with a fresh holding, keeping
// its place in this Client's queue (see startOver). A MultiLock's part
// cannot: its token is the take's, which starts over as a whole.
func (lk *lock) wait(ctx context.Context, h *holding, holder uint64) (*Lease, error) {
	c := lk.c
	defer c.obs.waiting(ctx, lk).done()
	lc, w := c.join(lk, h)
	defer c.leave(lc, w)
	backoff := firstBackoff
	for {
		l, err := lk.waitOnce(ctx, lc, w, holder)
		if err == nil {
			return l, nil
		}
		again, err := lk.startOver(ctx, w.h, err)
		if !again {
			return nil, err
		}
		c.cfg.logger.Debug("dlock: a grant came too late and was given back; waiting on with a new token", "lock", lk.name, "err", err)
		c.obs.startedOver(ctx, lk)
		if c.rejoin(lc, w, lk.newHolding(w.h.parent, w.h.n)) {
			// A look of the spent holding found the lock held, answered
			// in time: not a run of late grants, whatever came before.
			backoff = firstBackoff
		}
		holder = 0 // no look of the new holding yet
		// Grants that keep coming late (replies slower than the TTL) must
		// not make the wait look again at the pace of the round trip,
		// each time with a new token and give-backs: it backs off as the
		// first look's retries do, from the start again once a look found
		// the lock held (as the line's retries do). Out of the line
		// meanwhile, it is neither handed nor passed the lock.
		if err := lk.pause(ctx, backoff); err != nil {
			return nil, err
		}
		backoff = nextBackoff(backoff)
	}
}

// startOver reports whether a wait that failed with err goes on with a
// fresh holding (see holding.renewable) and the call may still wait. If
// it may not, the call ends as any wait does: ErrClosed after Close, or an
// error that errors.Is ctx.Err(), not the spent grant's ErrNotObtained.
func (lk *lock) startOver(ctx context.Context, h *holding, err error) (bool, error) {
	switch {
	case !h.renewable(err):
		return false, err
	case lk.c.closed.Load():
		return false, nameErr(lk.name, ErrClosed)
	case ctx.Err() != nil:
		return false, lk.fail(ctx, ctx.Err())
	}
	return true, err
}

// waitOnce is one wait of w, with its holding w.h, until it obtains the
// lock or fails.
func (lk *lock) waitOnce(ctx context.Context, lc *local, w *waiter, holder uint64) (*Lease, error) {
	c, h := lk.c, w.h
	if !lk.fair {
		select {
		case <-w.turn:
		case <-ctx.Done():
			return nil, lk.fail(ctx, ctx.Err())
		case <-c.bg.Done():
			return nil, nameErr(lk.name, ErrClosed)
		}
	}
	if !lk.fair {
		c.enterLine(lc, w) // before the first look: a release after it wakes us
		// Beside only a holder of ours (the first look's, if any), and not
		// when the channels are wanted anyway: another Client's holder
		// was seen lately, and the line serves as well.
		ours := holder == 0 || c.fences.ours(lk.hash, holder)
		if ours && c.goBeside(lc, w) {
			if l, err, done := lk.beside(ctx, h, lc, w); done {
				return l, err
			}
		}
	}
	// The subscriptions must be live before we take a place, or a
	// hand-over (or release) between our look and the subscription would
	// go unheard until our next refresh. If they cannot be confirmed soon
	// we go on: the refreshes bound the wait.
	if c.subscribeHook != nil {
		c.subscribeHook()
	}
	c.subscribe(lc)
	subscribed, err := lk.awaitSubscribed(ctx, lc)
	if err != nil {
		return nil, err
	}
	lk.proto.joinLine(h)
	if lk.fair {
		c.enterLine(lc, w)
	} else {
		// A wake-up for the looks beside: the look inLine starts with
		// covers whatever it said.
		drain(w.look)
	}
	return lk.inLine(ctx, h, lc, w, subscribed)
}

// beside is a default-mode head's wait while the lock is held by a holding
// of this Client (the look's holder fence is one this Client was granted):
// it sleeps without a subscription and without a place in the line at
// Redis, since that holding tells it all it would hear. Its Unlock passes
// the lock to it (as to a head in line), or releases it and wakes it
// (wakeLocal), or hands it to a waiter in the line at Redis and tells it to
// look again (handedAway). A holder lost without unlocking tells it
// nothing: it looks again within the holder's remaining TTL and at least
// every third of the liveness, as a waiter in line refreshes its place. It
// was registered (enterLine) before its first look here, so a release that
// follows a look wakes it.
//
// It reports done=false, leaving its wakeups behind, once a look finds
// the lock held by another Client's holding (or fails with an outcome that
// the line's loop retries): the caller then waits subscribed and in line.
func (lk *lock) beside(ctx context.Context, h *holding, lc *local, w *waiter) (l *Lease, err error, done bool) {
	c := lk.c
	defer c.leaveBeside(w)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	first, behind := c.asleepBehind(lc, w)
	for {
		if behind {
			// The waiter before us holds the lock in a turn that includes
			// us: no look needed to wait for its pass or release.
			behind = false
			timer.Reset(max(first, time.Millisecond))
		} else if l, err, done, asleep := lk.besideLook(ctx, h, lc, w, timer); !asleep {
			return l, err, done
		}
		var m mail
		select {
		case m = <-w.box:
		case <-w.look:
			c.besideWoken.Add(1)
		case <-timer.C:
		case <-ctx.Done():
			return nil, lk.quit(ctx, h, w, ctx.Err()), true
		case <-c.bg.Done():
			return nil, lk.quit(ctx, h, w, ErrClosed), true
		}
		if m == (mail{}) {
			m = c.awake(w)
		} else {
			c.awake(w)
		}
		if m.pass != nil {
			l, err := lk.passedTo(ctx, h)
			return l, err, true
		}
		// No hand-over can come (no place in line): look again.
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// besideLook is one look of a waiter beside a holder of ours: asleep, it
// found the lock held by such a holder and is set to sleep (timer reset);
// otherwise beside returns (l, err, done).
func (lk *lock) besideLook(ctx context.Context, h *holding, lc *local, w *waiter, timer *time.Timer) (l *Lease, err error, done, asleep bool) {
	c := lk.c
	r, err := lk.attempt(ctx, h, true)
	switch {
	case err == nil && r.ok:
		l, err := lk.obtained(ctx, h, r, lc)
		return l, err, true, false
	case err != nil && (ctx.Err() != nil || permanent(err)):
		return nil, lk.quit(ctx, h, w, err), true, false
	case err != nil || !c.fences.ours(lk.hash, r.fence):
		return nil, nil, false, false // the line's loop retries with the same token
	}
	c.asleep(lc, w, r.fence)
	timer.Reset(max(min(r.left, fairLiveness/3), time.Millisecond))
	return nil, nil, false, true
}

func drain(ch chan struct{}) {
	select {
	case <-ch:
	default:
	}
}

// awaitSubscribed waits until both channels of lc are subscribed, for at
// most subscribeWait (stringSubscribeWait) in all (one bound for both: a slot that is briefly
// unserved must not hold a waiter beyond it). It reports whether they are.
func (lk *lock) awaitSubscribed(ctx context.Context, lc *local) (bool, error) {
	d := subscribeWait
	if lk.isString() {
		d = stringSubscribeWait
	}
	bound := time.NewTimer(d)
	defer bound.Stop()
	for _, ready := range lc.ready {
		select {
		case <-ready:
		case <-bound.C:
			return false, nil // look now: the refreshes bound the wait
		case <-ctx.Done():
			return false, lk.fail(ctx, ctx.Err())
		case <-lk.c.bg.Done():
			return false, nameErr(lk.name, ErrClosed)
		}
	}
	return true, nil
}

// inLine is the loop of a waiter in the line: look (refreshing its place),
// sleep until something happens, look again.
func (lk *lock) inLine(ctx context.Context, h *holding, lc *local, w *waiter, subscribed bool) (*Lease, error) {
	c := lk.c
	var placed time.Time // when the last look that put us in line was sent
	var seen uint64      // the fence of the holder that look found
	inDoubt := false     // the last look's outcome is unknown
	backoff := firstBackoff
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		r, err := lk.attempt(ctx, h, true)
		var sleep time.Duration
		switch {
		case err == nil && r.ok:
			if r.already && subscribed && !inDoubt && !placed.IsZero() {
				c.expectHandOver(lk, w) // its message should follow
			}
			if r.already && !inDoubt && !placed.IsZero() {
				c.obs.handedOver(ctx, lk) // found by its look before the message
			}
			return lk.obtained(ctx, h, r, lc)
		case err != nil && (ctx.Err() != nil || permanent(err)):
			return nil, lk.quit(ctx, h, w, err)
		case err != nil:
			// Unknown outcome or unreachable server: retry with the same
			// token (an applied acquire is then recognised as ours).
			c.cfg.logger.Debug("dlock: acquire failed, retrying", "lock", lk.name, "err", err)
			sleep, inDoubt = backoff, true
			backoff = nextBackoff(backoff)
		default:
			placed, seen, inDoubt, backoff = r.sent, r.fence, false, firstBackoff
			// Look again when the holder's lease runs out, and keep our
			// place alive meanwhile.
			sleep = min(r.left, fairLiveness/3)
			c.asleep(lc, w, r.fence)
		}
		timer.Reset(max(sleep, time.Millisecond))
		var m mail
		select {
		case m = <-w.box:
		case <-w.look:
		case <-timer.C:
		case <-ctx.Done():
			return nil, lk.quit(ctx, h, w, ctx.Err())
		case <-c.bg.Done():
			return nil, lk.quit(ctx, h, w, ErrClosed)
		}
		if m == (mail{}) {
			m = c.awake(w)
		} else {
			c.awake(w)
		}
		switch {
		case m.pass != nil:
			return lk.passedTo(ctx, h)
		case m.fence > seen && !placed.IsZero():
			return lk.handedOver(ctx, h, lc, m.fence, placed)
		}
		// A hand-over without a look that proved our place (only after
		// errors), or older than the holder our last look found (a message
		// that came late): the next look finds the lock ours, or not.
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// handedOver makes h held: a release handed it the lock with fence f. Its
// expiry was set at the hand-over to at least min(TTL, fairLiveness) after
// our place was last refreshed, which was after placed (see release.lua).
// The watchdog renews it to the full TTL a third of that later (not at
// once: the new holder's work should not share the CPU with a renewal the
// moment it starts); without the watchdog we extend once here.
func (lk *lock) handedOver(ctx context.Context, h *holding, lc *local, f uint64, placed time.Time) (*Lease, error) {
	lk.c.obs.handedOver(ctx, lk)
	if !lk.fair {
		h.turnEnd = lk.c.turnFrom(lc)
	}
	from, ttl := placed, min(h.ttl, fairLiveness)
	if !time.Now().Before(validUntil(from, ttl)) {
		// Heard only past the validity it is dated with (the reply of our
		// last look came late): the lock may have expired at Redis and
		// been taken. An extension sent now must confirm it, as an
		// acquire's reply would; else it is given back, and the token is
		// spent (see spentToken): the wait goes on with a fresh one.
		sent := time.Now()
		v, err := lk.c.eval(ctx, lk.proto.extend(h, lk.ttlArg))
		if n, _ := v.(int64); err != nil || n != 1 {
			lk.giveBackLater(ctx, h.token)
			if lk.c.closed.Load() {
				return nil, nameErr(lk.name, ErrClosed)
			}
			return nil, lk.fail(ctx, spentToken{fmt.Errorf("%w: handed over, but heard %v after our place was last proved, past the lease's validity, and not confirmed (%v): given back",
				ErrNotObtained, sent.Sub(placed).Round(time.Millisecond), cmp(err, errors.New("the lock is no longer ours")))})
		}
		from, ttl = sent, h.ttl
	}
	h.granted(f, from, ttl)
	if h.raced(ctx) {
		return nil, nameErr(lk.name, ErrClosed)
	}
	if lk.c.cfg.ack.on() || (!lk.renew && h.ttl > fairLiveness) {
		// The releaser's connection wrote the hand-over: an extension of
		// our own, acknowledged after it, confirms it (see
		// WithReplicaAck).
		if err := h.first.extend(ctx, h.ttl, "hand-over"); err != nil {
			// Pass the lock on rather than leave it to its short expiry.
			h.unlockNow(ctx, context.Canceled)
			return nil, err
		}
	}
	return &h.first, nil
}

// passedTo returns the lease of a waiter a holder of this Client passed the
// lock to (it is pending: see pass.go).
func (lk *lock) passedTo(ctx context.Context, h *holding) (*Lease, error) {
	lk.c.obs.held(h) // not by the passer, under c.mu (see holding.passedIn)
	lk.c.obs.passedTo(ctx, lk)
	if h.raced(ctx) {
		return nil, nameErr(lk.name, ErrClosed)
	}
	if err := h.first.live(); err != nil {
		// Taken past the passer's deadline, which it lives on until its
		// record lands (and the record cannot land after it): it is not
		// ours, and the record's failure gives it back (see record). The
		// token is spent: the wait goes on with a fresh one.
		return nil, lk.fail(ctx, spentToken{fmt.Errorf("%w: passed by a holder of this Client, but taken past that lease's deadline (%v): given back", ErrNotObtained, err)})
	}
	return &h.first, nil
}

// quit ends a wait that ctx, Close or an error cut short: it leaves the
// line, and a lock handed or passed to the waiter at that moment is passed
// on or released rather than kept.
func (lk *lock) quit(ctx context.Context, h *holding, w *waiter, cause error) error {
	if m := lk.c.awake(w); m.pass != nil {
		lk.c.obs.held(h) // it was held, if only until now (see holding.passedIn)
		h.giveUp()
		h.finishLater() // once the pass is recorded, pass it on or release it
		return lk.stopped(ctx, cause)
	}
	// Leave the line (and give back a lock handed over meanwhile) in the
	// background: a server that does not answer must not hold the caller
	// past its ctx.
	lk.giveBackLater(ctx, h.token)
	if permanent(cause) {
		return lk.fail(ctx, cause)
	}
	return lk.stopped(ctx, cause)
}
