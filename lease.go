package dlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dlock-go/dlock/internal/driver"
	"github.com/dlock-go/dlock/internal/wire"
)

// A Lease is one holding of a lock. Its methods are safe for concurrent use.
type Lease struct {
	h *holding
	m *multiHolding // a MultiLock's lease (h is nil): every method acts on its parts (multilock.go)

	// Guarded by h.mu.
	done   bool  // Unlock was called: the lease no longer counts in h.holds
	inner  bool  // its Unlock left other leases on the holding: nothing to do at Redis
	result error // an inner lease's result
}

// Name returns the lock name; a MultiLock's lease: its names in the order
// they were locked, joined by ", " (for messages: see Names).
func (l *Lease) Name() string {
	if l.m != nil {
		return l.m.name()
	}
	return l.h.lk.name
}

// Token returns the owner token: 128 bits from crypto/rand, base64url
// encoded. Reentrant leases share the token of the outermost one, and the
// locks of a MultiLock's lease share one token.
func (l *Lease) Token() string {
	if l.m != nil {
		return l.m.token
	}
	return l.h.token
}

// Fence returns the fencing token: strictly greater than the fence of every
// earlier holding of this lock name, by any client. Pass it to storage that
// rejects writes carrying a fence lower than one it has seen. A MultiLock's
// lease has a fence per name (FenceOf); its Fence is 0, which storage that
// checks fences refuses.
func (l *Lease) Fence() uint64 {
	if l.m != nil {
		return 0
	}
	l.h.mu.Lock()
	defer l.h.mu.Unlock()
	return l.h.fence
}

// Context returns a context that ends when the lease ends: context.Cause is
// ErrLockLost if it was lost (renewal found it gone, or its deadline passed
// without renewal), ErrClosed if the Client closed, context.Canceled once
// Unlock is called. It carries the values of the ctx the lock was obtained
// with, and a Lock of the same lock with a ctx derived from it re-enters
// the lock. A MultiLock's lease context ends when any of its locks is lost
// (the cause names that lock); a Lock with a ctx derived from it re-enters
// none of them.
func (l *Lease) Context() context.Context {
	if l.m != nil {
		return l.m.context()
	}
	return l.h.context()
}

// live returns nil if the lease is still held, else why not.
func (l *Lease) live() error {
	h := l.h
	h.expired(time.Now())
	h.mu.Lock()
	defer h.mu.Unlock()
	switch {
	case l.done:
		return nameErr(h.lk.name, fmt.Errorf("%w: lease already unlocked", ErrLockLost))
	case !h.st.live():
		return nameErr(h.lk.name, h.endCause())
	}
	return nil
}

// Extend sets the lease to end ttl from now (at Redis), and makes ttl the
// lease length the watchdog renews to from then on. It returns ErrLockLost if
// the lease is no longer held; it never recreates an expired lock. If the
// outcome is unknown (an error from Redis), the extension counts as not
// made, and the lease is believed to end no later than ttl from now.
func (l *Lease) Extend(ctx context.Context, ttl time.Duration) error {
	if l.m != nil {
		return l.m.extend(ctx, ttl)
	}
	return l.extend(ctx, ttl, "extend")
}

// extend is Extend; what names it in an ErrNotReplicated (a hand-over
// confirmed by an extension, see handedOver).
func (l *Lease) extend(ctx context.Context, ttl time.Duration, what string) error {
	h := l.h
	if err := validTTL(ttl); err != nil {
		return nameErr(h.lk.name, err)
	}
	ttl = wholeMillis(ttl)
	if q := h.c.q; q != nil {
		if err := q.checkTTL(ttl); err != nil {
			return nameErr(h.lk.name, err)
		}
	}
	v, err := l.ask(ctx, ttl, h.lk.proto.extend(h, formatMillis(ttl)), what)
	if err != nil {
		return err
	}
	if v != 1 {
		h.lose("extend found the lock gone")
		return nameErr(h.lk.name, h.causeOr(ErrLockLost))
	}
	// The lease may have run out while the reply was on its way.
	return l.live()
}

// TTL returns how long the lease has left at Redis, or ErrLockLost.
func (l *Lease) TTL(ctx context.Context) (time.Duration, error) {
	if l.m != nil {
		return l.m.ttl(ctx)
	}
	h := l.h
	ms, err := l.ask(ctx, 0, h.lk.proto.pttl(h), "")
	if err != nil {
		return 0, err
	}
	if ms < 0 {
		h.lose("the lock is no longer held by this lease")
		return 0, nameErr(h.lk.name, h.causeOr(ErrLockLost))
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// ask sends one request about a live lease (extend, or pttl when ttl is 0)
// and returns its integer reply. An extend that succeeds dates the lease
// from its send; one whose outcome is unknown may have shortened it.
func (l *Lease) ask(ctx context.Context, ttl time.Duration, c call, what string) (int64, error) {
	h := l.h
	if h.c.closed.Load() {
		return 0, nameErr(h.lk.name, ErrClosed)
	}
	if err := l.live(); err != nil {
		return 0, err
	}
	// A lease passed to us waits here for its record at Redis.
	if err := h.beginOp(ctx); err != nil {
		return 0, nameErr(h.lk.name, err)
	}
	defer h.endOp()
	if err := l.live(); err != nil {
		return 0, err
	}
	sent := h.c.sendTime()
	if ttl > 0 {
		// Redis may run it before its reply comes, or without one: from
		// now on the lock may expire ttl after sent.
		h.sending(sent, ttl)
	}
	var v any
	var short, err error // short: see runAcked
	if q := h.c.q; q != nil {
		v, err = q.ask(ctx, c)
	} else if ttl > 0 && h.c.cfg.ack.on() {
		v, short, err = h.c.evalAcked(ctx, c, what)
	} else {
		v, err = h.c.eval(ctx, c)
	}
	switch {
	case isForeign(err):
		h.lose("lock key overwritten by another value")
		return 0, nameErr(h.lk.name, h.causeOr(ErrLockLost))
	case err != nil:
		if ttl > 0 {
			h.doubted(sent, ttl)
		}
		h.c.clusterHint(err)
		return 0, nameErr(h.lk.name, explainRefusal(err))
	}
	n, _ := v.(int64)
	if ttl > 0 && n == 1 {
		if short != nil {
			// It ran, but a failover now could lose it: it does not count.
			h.doubted(sent, ttl)
			return 0, nameErr(h.lk.name, short)
		}
		h.extended(sent, ttl)
	}
	return n, nil
}

func (h *holding) causeOr(def error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cause != nil {
		return h.cause
	}
	return def
}

// Unlock ends the lease. The lock is released at Redis (or passed to the
// next waiter of this Client) when the outermost of reentrant leases
// unlocks. It returns ErrLockLost if the lease had been lost before (someone
// else may have held the lock meanwhile). The lease context ends as Unlock
// is called, whatever happens next.
//
// It is safe to call again and from several goroutines: calls on one lease
// are served one at a time, and a call after a final outcome returns it.
// If ctx ends first (or had ended), Unlock returns ctx's error and the
// release is finished in the background, within the lease's TTL; a later
// call reports how it went. A retry after an unknown outcome that finds the
// lock no longer this lease's returns nil: the earlier attempt released it
// (or, were it an operator's removal at that very moment, the lease still
// held for as long as it was used, since Unlock was called before its
// deadline).
func (l *Lease) Unlock(ctx context.Context) (result error) {
	if l.m != nil {
		return l.m.unlock(ctx)
	}
	defer l.h.c.obs.release(ctx, l).end(&result)
	return l.unlock(ctx)
}

// unlock is Unlock unobserved: dlock's own unlock of a lease it could not
// return (unlockNow) is no call of the user's, and records no release (the
// hold's end is recorded as always).
func (l *Lease) unlock(ctx context.Context) error {
	h := l.h
	if err, inner := l.countOut(); inner {
		return err
	}
	h.expired(time.Now())
	h.giveUp()
	if h.recordInFlight() {
		// Passed to us and not yet recorded: pass it on now rather than
		// after our record (the next holder's critical section would wait
		// for that round trip); the new pass's record follows ours.
		if p := h.c.passOn(h, true); p != nil {
			return h.awaitPass(ctx, p)
		}
	}
	if err := h.beginOp(ctx); err != nil {
		h.finishLater()
		return nameErr(h.lk.name, fmt.Errorf("release: waiting for another call on this lease: %w (released in the background)", err))
	}
	err := h.finish(ctx)
	h.endOp()
	if err != nil && ctx.Err() != nil {
		if st, _ := h.snapshot(); st == ending {
			h.finishLater()
		}
	}
	return err
}

// recordInFlight reports whether h is ending with the record of the pass
// that made it still in flight (it holds h's request slot).
func (h *holding) recordInFlight() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.st == ending && h.inRecord && h.relSent.IsZero() && h.pass == nil
}

// countOut takes the lease out of its holding's count. inner: other leases
// still hold it, so Unlock returns err without touching Redis.
func (l *Lease) countOut() (err error, inner bool) {
	h := l.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if l.inner {
		return l.result, true
	}
	if !l.done {
		l.done = true
		h.holds--
		if h.holds > 0 {
			l.inner = true
			if !h.st.live() {
				l.result = nameErr(h.lk.name, h.endCause())
			}
			return l.result, true
		}
	}
	return nil, false
}

// finish takes an ending holding to a final state: it passes the lock to a
// waiter of this Client whose turn it is, or releases it at Redis. Called
// between beginOp and endOp.
func (h *holding) finish(ctx context.Context) error {
	h.mu.Lock()
	st, cause, p, tried := h.st, h.cause, h.pass, !h.relSent.IsZero()
	h.mu.Unlock()
	switch st {
	case ending:
		if !tried {
			if p := h.c.passOn(h, false); p != nil {
				return h.awaitPass(ctx, p)
			}
		}
		return h.release(ctx)
	case passing:
		return h.awaitPass(ctx, p)
	case passed, released:
		return nil
	case closed:
		return nameErr(h.lk.name, ErrClosed)
	default: // lost
		if !tried {
			// Its deadline may have passed while Redis still had it (renewals
			// failed): give it back rather than leave it to its expiry.
			_ = h.release(ctx)
		}
		return nameErr(h.lk.name, cause)
	}
}

// release releases an ending holding at Redis. A release that failed is
// sent again, a few times while ctx lasts; the driver does not resend it by
// itself (it is sent once, see script.do), so a reply of "not the owner" is
// known to be the answer to a resend, which may follow our own earlier run.
func (h *holding) release(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return nameErr(h.lk.name, fmt.Errorf("release: %w", err)) // not sent: the next attempt is the first
	}
	h.mu.Lock()
	retry := !h.relSent.IsZero()
	if !retry {
		h.relSent = time.Now()
	}
	h.mu.Unlock()
	v, err := h.c.releaseCall(ctx, h)
	v, err = resend(ctx, v, err, func(err error) {
		// A failed connection may have followed a run; a refusal to run
		// did not.
		var reply driver.ReplyError
		retry = retry || !errors.As(err, &reply)
		h.c.clusterHint(err)
	}, func() (any, error) { return h.c.releaseCall(ctx, h) })
	if isForeign(err) {
		err = &lostError{scriptErr(h.lk.hash, h.lk.kind, err)}
		h.settle(lost, err)
		return nameErr(h.lk.name, err)
	}
	if err != nil {
		return nameErr(h.lk.name, fmt.Errorf("release: %w", explainRefusal(err)))
	}
	code, _ := v.(int64)
	if code == wire.ReleaseNotOwner && retry {
		code = wire.ReleaseAgain // the earlier attempt released it (see Unlock)
	}
	switch code {
	case wire.ReleaseFreed, wire.ReleaseAgain, wire.ReleaseHandedOver:
		if code != wire.ReleaseHandedOver {
			h.c.wakeLocal(h.lk.hash, h.fence) // our own head may take it at once
		} else {
			h.c.handedAway(h.lk.hash) // our head beside us was not in line: it looks again
		}
		h.settle(released, nil)
		return nil
	}
	err = fmt.Errorf("%w: the lock was no longer held by this lease", ErrLockLost)
	h.settle(lost, err)
	return nameErr(h.lk.name, err)
}

// releaseResends bounds how often a failed call that go-redis does not
// resend by itself (a release; any call through the autopipeliner) is sent
// again (as go-redis would have, by default).
const releaseResends = 3

// resend sends a call again with send after a failure that resendable
// allows, up to releaseResends times with growing waits while ctx lasts,
// and returns the last reply; failed (if not nil) sees each failure it
// resends after.
func resend(ctx context.Context, v any, err error, failed func(error), send func() (any, error)) (any, error) {
	for i, wait := 0, 10*time.Millisecond; i < releaseResends && resendable(err) && sleepCtx(ctx, wait); i, wait = i+1, 4*wait {
		if failed != nil {
			failed(err)
		}
		v, err = send()
	}
	return v, err
}

// resendable reports a failure after which a release may be sent again
// (as go-redis would): a connection that failed, or a refusal that means
// the script did not run (the server is loading or read-only, or refuses
// writes or the slot for now). Any other error reply may come from a
// script that stopped halfway, and is reported; ErrClosed is an acquire
// that Close ended (runLine), which is not sent again.
func resendable(err error) bool {
	if err == nil || errors.Is(err, ErrClosed) || isForeign(err) {
		return false
	}
	var reply driver.ReplyError // declared here: it escapes, and a nil err needs none
	if !errors.As(err, &reply) {
		return true
	}
	msg := err.Error()
	for _, p := range []string{"LOADING ", "READONLY ", "MASTERDOWN ", "NOREPLICAS ", "CLUSTERDOWN ", "TRYAGAIN ", "ERR max number of clients"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// sleepCtx waits d, or until ctx ends; it reports whether ctx is still live.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// awaitPass waits for the record of the pass that Unlock made.
func (h *holding) awaitPass(ctx context.Context, p *pass) error {
	select {
	case <-p.done:
	case <-ctx.Done():
		return nameErr(h.lk.name, fmt.Errorf("release: the lock was passed to another waiter of this Client, not yet recorded at Redis: %w", ctx.Err()))
	}
	st, cause := h.snapshot()
	if st == passed {
		return nil
	}
	return nameErr(h.lk.name, cause)
}

// finishLater finishes an ending holding in the background, for an Unlock
// whose ctx ended first. Nothing renews the lock meanwhile. It waits for
// the request in flight about the holding, if any (every one of them ends:
// a renewal or a pass record by the lease's deadline, an Extend with its
// caller's ctx or the client's timeouts), then releases or passes the lock
// within min(TTL, 5s).
func (h *holding) finishLater() {
	run := func() {
		_ = h.beginOp(context.Background())
		ctx, cancel := context.WithTimeout(context.WithoutCancel(h.parent), min(h.lk.ttl, 5*time.Second))
		defer cancel()
		_ = h.finish(ctx)
		h.endOp()
	}
	if !h.c.goBg(run) {
		run() // the Client is closing: no goroutine may start
	}
}

// unlockNow unlocks a holding its caller will not return, even if ctx has
// ended, within min(TTL, 5s). cause is why: ErrClosed (Close raced with
// the grant) ends the hold as closed.
func (h *holding) unlockNow(ctx context.Context, cause error) {
	h.end(ending, cause) // the holding is given up as its lease ends (see giveUp)
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(h.lk.ttl, 5*time.Second))
	_ = h.first.unlock(rctx)
	cancel()
}
