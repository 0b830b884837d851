package dlock

import (
	"context"
	"time"
)

// fairLiveness is how long a Fair waiter's place in line holds without the
// waiter refreshing it (it refreshes every third of it). A waiter that died
// or gave up is skipped within this bound, and a lock handed to a waiter that
// died a moment before lives on for at most about three times it.
const fairLiveness = time.Second

// lockFair waits in the lock's line at Redis until the holder before it
// hands the lock over (or the lock is free and nobody alive is ahead). Fair
// mutexes, semaphores and RWMutexes all wait this way.
func (m *Mutex) lockFair(ctx context.Context, h *holding) (*Lease, error) {
	c := m.c
	// First one look without a place in line (a free lock with nobody in
	// line is granted; a busy one is not jumped): an uncontended Lock then
	// costs one round trip, with no hand-over subscription.
	if l, err, done := m.firstLook(ctx, h); done {
		return l, err
	}
	h.join = "1" // the acquire has completed: its command line may change
	q, grant := c.joinFair(m.handover, h.token)
	defer c.leaveFair(q, h.token)
	ready := q.ready // nil once seen closed
	subscribed := isClosed(ready)
	if subscribed {
		ready = nil
	}
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	backoff := time.Millisecond
	for {
		sent := time.Now()
		l, left, _, err, done := m.look(ctx, h, grant, &backoff)
		if done {
			return l, err
		}
		// Keep the place alive; look again when the holder's lease runs out.
		wait := min(left, fairLiveness/3)
		if !subscribed {
			// A hand-over published before the subscription was live would be
			// missed: once it is, look again at once.
			wait = min(wait, time.Second)
		}
		timer.Reset(max(wait, time.Millisecond))
		for waiting := true; waiting; {
			select {
			case f := <-grant:
				// Handed over: the lock is ours. Its expiry was set at the
				// hand-over, after our last refresh was sent, to at least
				// min(TTL, 1s); the watchdog renews it to the full TTL soon.
				return m.granted(ctx, h, f, sent)
			case <-ready:
				subscribed, ready, waiting = true, nil, false
			case <-q.notify: // the subscription was interrupted: look
				waiting = false
			case <-timer.C:
				waiting = false
			case <-ctx.Done():
				return nil, m.giveUp(ctx, h, ctx.Err())
			case <-c.bg.Done():
				return nil, m.giveUp(ctx, h, ErrClosed)
			}
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// granted activates a holding handed over to us with fence f. The lock's
// expiry at Redis is at least min(TTL, fairLiveness) after sent (see
// fair_release.lua); the watchdog renews it to the full TTL a third of that
// later (not at once: the new holder's work should not share the CPU with a
// renewal the moment it starts), and without the watchdog we extend once here.
func (m *Mutex) granted(ctx context.Context, h *holding, f uint64, sent time.Time) (*Lease, error) {
	ttl := h.ttl
	h.ttl = min(ttl, fairLiveness)
	h.activate(f, sent)
	h.mu.Lock()
	h.ttl = ttl
	h.mu.Unlock()
	if h.raced(ctx) {
		return nil, nameErr(m.name, ErrClosed)
	}
	if h.renew {
		return &h.first, nil // activate scheduled the renewal at sent + min(TTL, fairLiveness)/3
	}
	if ttl > fairLiveness {
		if err := h.first.Extend(ctx, ttl); err != nil {
			// Pass the lock on rather than leave it to its short expiry.
			uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), fairLiveness)
			_ = h.first.Unlock(uctx)
			cancel()
			return nil, err
		}
	}
	return &h.first, nil
}

// giveUp leaves the line; if the lock was handed to us meanwhile, it is
// passed on to the next waiter at once.
func (m *Mutex) giveUp(ctx context.Context, h *holding, cause error) error {
	c := m.c
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(m.ttl, 5*time.Second))
	defer cancel()
	if m.sem {
		// sem.lua's leave releases the permits if they had been handed over.
		_, _ = semScript.run(lctx, c.rdb, m.keys, "l", h.token, c.idleArg)
	} else if v, err := fairLeaveScript.run(lctx, c.rdb, m.keys, h.token); err == nil {
		if r, ok := v.([]any); ok && len(r) == 2 && r[0] == int64(1) {
			f, _ := r[1].(int64)
			h.activate(uint64(f), time.Now())
			_ = h.first.Unlock(lctx)
		}
	}
	return m.stopped(ctx, cause)
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// joinFair registers a Fair waiter: its token gets the hand-over message,
// and this Client's hand-over channel for the lock is subscribed while it
// waits. (Not the lock's own channel: a hand-over wakes only the Client it
// concerns. A lock freed with nobody alive in line, e.g. by expiry, is seen
// at the waiter's next refresh, within a third of a second.)
func (c *Client) joinFair(channel, token string) (*queue, chan uint64) {
	ch := make(chan uint64, 1)
	c.mu.Lock()
	defer c.mu.Unlock()
	q := c.queueFor(channel)
	q.users++
	c.grants[token] = ch
	return q, ch
}

func (c *Client) leaveFair(q *queue, token string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.grants, token)
	q.users--
	c.dropIfIdle(q)
}

// expectGrant registers a waiter's token for the hand-over message.
func (c *Client) expectGrant(token string) chan uint64 {
	ch := make(chan uint64, 1)
	c.mu.Lock()
	c.grants[token] = ch
	c.mu.Unlock()
	return ch
}

// checkGrant runs when a waiter's own acquire found the lock already
// handed to it: if the hand-over message does not follow soon, this Client's
// subscriptions are not hearing their channels (e.g. still connected to a
// server that a failover demoted), and they are made again.
func (c *Client) checkGrant(h *holding, grant chan uint64) {
	if !h.already {
		return
	}
	c.mu.Lock()
	if len(grant) > 0 {
		c.mu.Unlock()
		return
	}
	c.late[h.token] = true
	c.mu.Unlock()
	c.goBg(func() {
		t := time.NewTimer(lateGrant)
		defer t.Stop()
		select {
		case <-c.bg.Done():
			return
		case <-t.C:
		}
		c.mu.Lock()
		missed := c.late[h.token]
		delete(c.late, h.token)
		c.mu.Unlock()
		if missed {
			c.missedWake()
		}
	})
}

// lateGrant is how long after its waiter found it a hand-over message may
// still come before it counts as missed.
const lateGrant = 200 * time.Millisecond

func (c *Client) forgetGrant(token string) {
	c.mu.Lock()
	delete(c.grants, token)
	c.mu.Unlock()
}
