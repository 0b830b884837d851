package dlock

import (
	"fmt"
	"time"
)

// QueuedLocally returns how many of c's default-mode Lock calls wait in c's
// queue for the lock called name, and whether the first of them sleeps in
// line at Redis (so that a holder of c may pass it the lock). Tests wait for
// it rather than for a while.
func QueuedLocally(c *Client, name string) (n int, headAsleep bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, lc := range c.locals {
		if lc.lk.name == name {
			return len(lc.queue), len(lc.queue) > 0 && lc.queue[0].asleep
		}
	}
	return 0, false
}

// Settled reports whether the holding behind l has reached a final state
// (released, passed on, lost or closed): what its Unlock will report is
// decided, though the calls that follow (a release, a give-back) may still
// be on their way to Redis. Tests wait for it rather than for a while.
func Settled(l *Lease) bool {
	h := l.h
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.st.final()
}

// HandOversHeard returns how many hand-over messages reached a waiter of c
// that still waited for them: a waiter woken by message, not found by a
// look of its own.
func HandOversHeard(c *Client) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.heard
}

// SubscriptionsRepaired returns how many times c's subscriptions were
// established again after a fault (a dropped connection, a refusal...) and
// its waiters told to look again: tests wait for it after a fault.
func SubscriptionsRepaired(c *Client) uint64 { return c.gaps.Load() }

// BesideWoken returns how many times a waiter of c that waited beside a
// holder of c (unsubscribed, not in line at Redis) was woken to look again
// by that holder's release, rather than by its own timer.
func BesideWoken(c *Client) uint64 { return c.besideWoken.Load() }

// Pending reports whether l was passed to its holder by another lease of
// its Client and the pass is not yet recorded at Redis: Redis may still name
// the passer's token. A lease is pending only from its grant until its
// record lands, never again.
func Pending(l *Lease) bool {
	h := l.h
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.st == pending
}

// Describe tells what the holding behind l believes, for a test's failure
// message: its state, how long until its deadline, and the request that
// proved it (sent how long ago, with what TTL), and any doubt.
func Describe(l *Lease) string {
	h := l.h
	h.mu.Lock()
	defer h.mu.Unlock()
	now := time.Now()
	return fmt.Sprintf("state %d, deadline in %v, proved by a request sent %v ago with TTL %v, doubt %v, ttl %v, contended %v, acqDoubt %v",
		h.st, h.deadline.Sub(now).Round(time.Millisecond), now.Sub(h.proofAt).Round(time.Millisecond), h.proofTTL, h.doubt, h.ttl, h.contended, h.acqDoubt)
}

// SetSubscribeHook makes c's waiters call f just before they subscribe
// their lock's channels. Set it before c's first lock.
func SetSubscribeHook(c *Client, f func()) { c.subscribeHook = f }

// SetRenewalHook makes c's watchdog call f with the lease of each holding it
// is about to renew, after it read the TTL it will renew to and before the
// renewal is sent. Set it before c's first lock.
func SetRenewalHook(c *Client, f func(*Lease)) {
	c.renewalHook = func(h *holding) { f(&h.first) }
}

// SetPassHook makes c call f with the passer's and the new holder's leases
// each time a holder of c passes a lock to a waiter of c, right after the
// pass is made (the new lease is pending) and before the waiter is woken,
// with c's own lock held: f must not call into c. Set it before c's first
// lock.
func SetPassHook(c *Client, f func(from, to *Lease)) {
	c.passHook = func(from, to *holding) { f(&from.first, &to.first) }
}

// Deadline returns until when l's holder believes it valid (see validUntil).
func Deadline(l *Lease) time.Time {
	h := l.h
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.deadline
}

// ForcePipelined makes every later lock-path call of c that is not urgent
// go through its autopipeliner, as when more than pipelineAbove calls are
// in flight (tests of that path need not make the crowd).
func ForcePipelined(c *Client) { c.inflight.Add(pipelineAbove) }

// ClientID is the id that names c's hand-over channels (PREFIX{NAME}:c:ID).
func ClientID(c *Client) string { return c.id }

// PartOf returns the lease of the part called name of a MultiLock's lease
// l (nil if l holds no such part), to ask what that part's holding believes.
func PartOf(l *Lease, name string) *Lease {
	if l.m == nil {
		return nil
	}
	for _, p := range l.m.parts {
		if p.Name() == name {
			return p
		}
	}
	return nil
}

// Books returns how many locks c keeps waiters' books for, and how many
// tokens of waiters in line it knows: both 0 once no Lock of c waits.
func Books(c *Client) (locals, tokens int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.locals), len(c.byToken)
}
