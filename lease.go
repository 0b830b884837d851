package dlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"
)

type holdState uint8

const (
	stateHeld     holdState = iota
	stateReleased           // Unlock gave it up
	stateLost               // expired, deleted, overwritten, or renewal failed past the deadline
	stateClosed             // the Client closed
)

// holding is one ownership of a lock in Redis. Reentrant Lock calls share it;
// each of them gets its own Lease.
type holding struct {
	c         *Client
	name      string
	key       string
	kind      string   // the primitive: "mutex", "semaphore" or "rwmutex"
	shared    bool     // a read holding of an RWMutex
	semKeys   []string // a semaphore or RWMutex holding: the KEYS of sem.lua
	token     string
	fence     uint64
	fenceStr  string
	renew     bool
	contended bool            // obtained after waiting: its release is likely awaited too
	parent    context.Context // the ctx Lock was called with: values of the lease context come from it
	acq       [17]any         // the acquire command line; never changed once sent
	rel       [10]any         // the release command line; never changed once built
	acqLen    int
	relLen    int
	acqScript *script
	relScript *script
	join      string   // fair: "1" to take a place in line if the lock is busy
	nArg      string   // sem: permits asked for
	relFailed bool     // sem: a release attempt's outcome is unknown (guarded by mu)
	already   bool     // the acquire found the lock already this token's (handed over, or a retry)
	keys      []string // the Mutex's keys (shared)
	turnEnd   uint64   // default mode: the last local waiter of this Client's turn (see pass.go); 0: none
	pending   *pass    // this holding was passed to us: set before it is shared, settled later
	passedOn  *pass    // Unlock passed the lock to a local waiter (guarded by mu)

	mu       sync.Mutex
	ttl      time.Duration
	deadline time.Time // monotonic: valid until then, unless renewed
	state    holdState
	cause    error
	holds    int // leases not yet unlocked
	ctx      *leaseContext
	cancel   context.CancelCauseFunc

	// Watchdog bookkeeping, guarded by c.dog.mu.
	due   time.Time
	idx   int // position in the watchdog heap, -1 when absent
	busy  bool
	first Lease // the outermost lease, allocated with the holding
}

// validity is how long after sending an acquire or extend the holder may
// rely on it: the TTL less 1% for the rate difference of the two clocks.
func validity(ttl time.Duration) time.Duration { return ttl - ttl/100 }

// prepare makes the holding an acquire will fill, with the acquire command
// line built in place (see script.do). n: the permits a semaphore call asks
// for. It does not take a place in line (join "0") until lockFair says so.
func (m *Mutex) prepare(ctx context.Context, n string) *holding {
	h := &holding{
		c: m.c, name: m.name, key: m.keys[0], kind: m.kind, shared: m.shared, token: m.c.tokens.next(),
		renew: m.renew, parent: ctx, ttl: m.ttl, holds: 1, idx: -1, nArg: n, keys: m.keys,
	}
	h.first.h = h
	h.join = "0"
	k := &m.keyArr
	if m.sem {
		h.semKeys = m.keys
		h.acqScript, h.relScript = semScript, semScript
		h.acqLen = copy(h.acq[:], []any{"evalsha", &semScript.sha, "4", m.keyAny, &k[1], &k[2], &k[3],
			"a", &h.token, &m.ttlArg, &m.c.liveArg, &h.join, &m.handover, &h.nArg, &m.sizeArg, &m.kind, &m.c.idleArg})
		h.relLen = copy(h.rel[:], []any{"evalsha", &semScript.sha, "4", m.keyAny, &k[1], &k[2], &k[3],
			"r", &h.token, &m.c.idleArg})
		return h
	}
	// Every release hands the lock to the first live waiter in line.
	h.relScript = releaseScript
	h.relLen = copy(h.rel[:], []any{"evalsha", &releaseScript.sha, "3", m.keyAny, &k[1], &k[2], &h.token, &h.fenceStr, &m.c.idleArg, m.keyAny})
	if !m.fair {
		h.acqScript = acquireScript
		h.acqLen = copy(h.acq[:], []any{"evalsha", &acquireScript.sha, "1", m.keyAny, &h.token, &m.ttlArg})
		return h
	}
	h.acqScript = fairAcquireScript
	h.acqLen = copy(h.acq[:], []any{"evalsha", &fairAcquireScript.sha, "3", m.keyAny, &k[1], &k[2], &h.token, &m.ttlArg, &m.c.liveArg, &h.join, &m.handover})
	return h
}

// joinLine makes h's acquire take (or keep) a place in the lock's line when
// the lock is held: a default-mode waiter at the head of its Client's queue
// is then handed the lock by the release (see acquire.lua). Only between
// attempts: a command line is never changed while it may be in flight.
func (m *Mutex) joinLine(h *holding) {
	h.acqLen = copy(h.acq[:], []any{"evalsha", &acquireScript.sha, "3", m.keyAny, &m.keyArr[1], &m.keyArr[2], &h.token, &m.ttlArg, &m.c.liveArg, &m.handover})
}

// extendCall is the script call that sets h's lease to ttl ms from now.
func (h *holding) extendCall(ttl string) (*script, []string, []any) {
	if h.semKeys != nil {
		return semScript, h.semKeys, []any{"e", h.token, ttl, h.c.idleArg}
	}
	return extendScript, []string{h.key}, []any{h.token, ttl}
}

// pttlCall is the script call that returns h's remaining lease in ms (-1 if lost).
func (h *holding) pttlCall() (*script, []string, []any) {
	if h.semKeys != nil {
		return semScript, h.semKeys, []any{"t", h.token}
	}
	return pttlScript, []string{h.key}, []any{h.token}
}

// activate makes h a held lock, granted fence by an acquire sent at sent.
func (h *holding) activate(fence uint64, sent time.Time) {
	h.fence = fence
	h.fenceStr = strconv.FormatUint(fence, 10)
	h.deadline = sent.Add(validity(h.ttl))
	h.c.dog.add(h, h.nextDue(sent))
}

// raced, called just after h was activated, reports whether Close raced
// with the acquisition; then it releases the lock (Close did not see h).
// Close sets closed before it collects the held leases, so a holding
// activated before that is Close's to release, and one after is seen here.
func (h *holding) raced(ctx context.Context) bool {
	if !h.c.closed.Load() {
		return false
	}
	h.unlockNow(ctx)
	return true
}

// unlockNow unlocks a holding its caller will not return, even if ctx has
// ended, within min(TTL, 5s).
func (h *holding) unlockNow(ctx context.Context) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(h.ttl, 5*time.Second))
	_ = h.first.Unlock(rctx)
	cancel()
}

// nextDue is when the watchdog must next look at h: renew at a third of the
// TTL, or at the deadline when it does not renew. Called with h.mu held or
// before h is shared.
func (h *holding) nextDue(sent time.Time) time.Time {
	if h.renew {
		return sent.Add(h.ttl / 3)
	}
	return h.deadline
}

// end moves a held lock to a final state and ends its context. It reports
// whether this call did it.
func (h *holding) end(st holdState, cause error) bool {
	h.mu.Lock()
	if h.state != stateHeld {
		h.mu.Unlock()
		return false
	}
	h.state, h.cause = st, cause
	cancel := h.cancel
	h.mu.Unlock()
	if cancel != nil {
		cancel(cause)
	}
	h.c.dog.remove(h)
	if st == stateLost {
		h.c.cfg.logger.Warn("dlock: lease lost", "lock", h.name, "fence", h.fence, "cause", cause)
	}
	return true
}

// lose ends the holding with cause ErrLockLost (wrapping why).
func (h *holding) lose(why string) {
	h.end(stateLost, fmt.Errorf("%w: %s", ErrLockLost, why))
}

// checkDeadline ends the holding if its deadline passed, so that a holder
// resuming from a pause sees its lease ended before any timer has fired.
func (h *holding) checkDeadline() {
	h.mu.Lock()
	expired := h.state == stateHeld && !time.Now().Before(h.deadline)
	h.mu.Unlock()
	if expired {
		h.lose("lease deadline passed before renewal")
	}
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
		if h.state != stateHeld {
			cancel(h.cause)
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
	c.h.checkDeadline()
	return c.Context.Done()
}

func (c *leaseContext) Err() error {
	c.h.checkDeadline()
	return c.Context.Err()
}

func (c *leaseContext) Value(key any) any {
	if key == (leaseKey{}) {
		return c.h
	}
	return c.Context.Value(key)
}

// heldIn finds a holding of key by c among the lease contexts ctx descends from.
func (c *Client) heldIn(ctx context.Context, key, kind string) *holding {
	for v := ctx.Value(leaseKey{}); v != nil; {
		h := v.(*holding)
		if h.c == c && h.key == key && h.kind == kind {
			return h
		}
		v = h.parent.Value(leaseKey{})
	}
	return nil
}

// reenter adds one more lease to a holding (a reentrant Lock).
func (h *holding) reenter() (*Lease, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.state != stateHeld {
		return nil, nameErr(h.name, h.cause)
	}
	h.holds++
	return &Lease{h: h}, nil
}

// A Lease is one holding of a lock. Its methods are safe for concurrent use.
type Lease struct {
	h        *holding
	unlocked bool  // guarded by h.mu
	result   error // what the completed Unlock returned, guarded by h.mu
}

// Name returns the lock name.
func (l *Lease) Name() string { return l.h.name }

// Token returns the owner token: 128 bits from crypto/rand, base64url
// encoded. Reentrant leases share the token of the outermost one.
func (l *Lease) Token() string { return l.h.token }

// Fence returns the fencing token: strictly greater than the fence of every
// earlier holding of this lock name, by any client. Pass it to storage that
// rejects writes carrying a fence lower than one it has seen.
func (l *Lease) Fence() uint64 { return l.h.fence }

// Context returns a context that ends when the lease ends: context.Cause is
// ErrLockLost if it was lost (renewal found it gone, or its deadline passed
// without renewal), ErrClosed if the Client closed, context.Canceled after
// Unlock. It carries the values of the ctx the lock was obtained with, and
// a Lock of the same lock with a ctx derived from it re-enters the lock.
func (l *Lease) Context() context.Context { return l.h.context() }

// Extend sets the lease to end ttl from now (at Redis), and makes ttl the
// lease length the watchdog renews to from then on. It returns ErrLockLost if
// the lease is no longer held; it never recreates an expired lock. An error
// from Redis leaves the deadline unchanged: the extension counts as not made.
func (l *Lease) Extend(ctx context.Context, ttl time.Duration) error {
	h := l.h
	if err := validTTL(ttl); err != nil {
		return nameErr(h.name, err)
	}
	if h.c.closed.Load() {
		return nameErr(h.name, ErrClosed)
	}
	if err := h.settle(ctx); err != nil {
		return nameErr(h.name, err)
	}
	if err := l.live(); err != nil {
		return err
	}
	sent := time.Now()
	es, keys, args := h.extendCall(strconv.FormatInt(ttl.Milliseconds(), 10))
	v, err := h.c.eval(ctx, es, keys, args...)
	if err != nil {
		if errors.Is(scriptErr(h.key, err), ErrForeignKey) {
			h.lose("lock key overwritten by another value")
			return nameErr(h.name, h.causeOr(ErrLockLost))
		}
		return nameErr(h.name, err)
	}
	if v.(int64) != 1 {
		h.lose("extend found the lock gone")
		return nameErr(h.name, h.causeOr(ErrLockLost))
	}
	h.mu.Lock()
	if h.state == stateHeld {
		h.ttl = ttl
		h.deadline = sent.Add(validity(ttl))
	}
	due := h.nextDue(sent)
	h.mu.Unlock()
	h.c.dog.reschedule(h, due)
	return nil
}

// live returns nil if the lease is still held, else ErrLockLost (or why it ended).
func (l *Lease) live() error {
	h := l.h
	h.checkDeadline()
	h.mu.Lock()
	defer h.mu.Unlock()
	if l.unlocked {
		return nameErr(h.name, fmt.Errorf("%w: lease already unlocked", ErrLockLost))
	}
	if h.state != stateHeld {
		return nameErr(h.name, h.cause)
	}
	return nil
}

func (h *holding) causeOr(def error) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.cause != nil {
		return h.cause
	}
	return def
}

// TTL returns how long the lease has left at Redis, or ErrLockLost.
func (l *Lease) TTL(ctx context.Context) (time.Duration, error) {
	h := l.h
	if h.c.closed.Load() {
		return 0, nameErr(h.name, ErrClosed)
	}
	if err := h.settle(ctx); err != nil {
		return 0, nameErr(h.name, err)
	}
	if err := l.live(); err != nil {
		return 0, err
	}
	ps, keys, args := h.pttlCall()
	v, err := h.c.eval(ctx, ps, keys, args...)
	if err != nil {
		if errors.Is(scriptErr(h.key, err), ErrForeignKey) {
			h.lose("lock key overwritten by another value")
			return 0, nameErr(h.name, h.causeOr(ErrLockLost))
		}
		return 0, nameErr(h.name, err)
	}
	ms := v.(int64)
	if ms < 0 {
		h.lose("the lock is no longer held by this lease")
		return 0, nameErr(h.name, h.causeOr(ErrLockLost))
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// Unlock ends the lease. The lock is released at Redis when the outermost of
// reentrant leases unlocks. It returns ErrLockLost if the lease had been
// lost before (someone else may have held the lock meanwhile). It is safe to
// call again: after a Redis error it retries the release (which is
// idempotent at Redis); after success or ErrLockLost it returns the same result.
func (l *Lease) Unlock(ctx context.Context) error {
	h := l.h
	h.mu.Lock()
	if l.unlocked {
		err := l.result
		h.mu.Unlock()
		return err
	}
	if h.holds > 1 {
		// An inner reentrant lease: the lock stays held by the outer ones.
		h.holds--
		l.unlocked = true
		if h.state != stateHeld {
			l.result = nameErr(h.name, h.cause)
		}
		err := l.result
		h.mu.Unlock()
		return err
	}
	st, cause, passed := h.state, h.cause, h.passedOn
	h.mu.Unlock()
	if passed != nil {
		return l.passResult(ctx, passed) // a retry: the pass was made
	}
	if st == stateClosed || (st != stateHeld && h.c.closed.Load()) {
		return l.finish(nameErr(h.name, ErrClosed))
	}
	// Held after Close: taken as Close ran (see raced). Release it as usual.
	if h.pending != nil {
		// Passed to us: ours at Redis only once recorded.
		if err := h.settle(ctx); err != nil {
			return nameErr(h.name, fmt.Errorf("release: %w", err))
		}
		h.mu.Lock()
		st, cause = h.state, h.cause
		h.mu.Unlock()
	}

	// Stop renewing and end the lease context before releasing: a lease
	// that is being given up is no longer one to rely on.
	if st == stateHeld {
		if h.end(stateReleased, context.Canceled) {
			// A waiter of ours whose turn it is takes it at once.
			if p := h.c.passOn(h); p != nil {
				h.mu.Lock()
				h.passedOn = p
				h.mu.Unlock()
				return l.passResult(ctx, p)
			}
		}
	}
	var v any
	var err error
	if h.contended {
		v, err = h.c.releaseHandingOver(ctx, h)
	} else {
		v, err = h.c.evalArgs(ctx, h.relScript, h.rel[:h.relLen], false, nil)
	}
	if err != nil {
		if errors.Is(scriptErr(h.key, err), ErrForeignKey) {
			return l.finish(nameErr(h.name, fmt.Errorf("%w: %w", ErrLockLost, scriptErr(h.key, err))))
		}
		// Outcome unknown: the lease stays un-unlocked so a retry runs the
		// (idempotent) release again.
		h.mu.Lock()
		h.relFailed = true
		h.mu.Unlock()
		return nameErr(h.name, fmt.Errorf("release: %w", err))
	}
	if v.(int64) == 0 && h.semKeys != nil && st != stateLost && h.retriedInTime() {
		// sem.lua keeps no record of released tokens: a retry that finds the
		// holding gone before its deadline could have passed means the
		// earlier attempt released it (nothing else removes a live holding
		// but an operator or a lost key).
		v = int64(1)
	}
	switch v.(int64) {
	case 1, 2, 3:
		if v.(int64) != 3 {
			// Freed (not handed over): our own head may take it.
			h.c.wakeLocal(h)
		}
		if st == stateLost {
			return l.finish(nameErr(h.name, cause))
		}
		return l.finish(nil)
	default:
		if st == stateLost {
			return l.finish(nameErr(h.name, cause))
		}
		return l.finish(nameErr(h.name, fmt.Errorf("%w: the lock was no longer held by this lease", ErrLockLost)))
	}
}

// passResult is the result of an Unlock that passed the lock on: nil once
// the pass is recorded at Redis, ErrLockLost if our lease turned out to have
// been lost before it; if ctx ends first the outcome is unknown and Unlock
// may be called again.
func (l *Lease) passResult(ctx context.Context, p *pass) error {
	settled, err := p.result(ctx)
	if !settled {
		return nameErr(l.h.name, fmt.Errorf("release: the lock was passed to another waiter of this Client, not yet recorded at Redis: %w", err))
	}
	if err != nil {
		return l.finish(nameErr(l.h.name, err))
	}
	return l.finish(nil)
}

// retriedInTime reports whether an earlier release attempt failed with an
// unknown outcome and the lease deadline has not passed since.
func (h *holding) retriedInTime() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.relFailed && time.Now().Before(h.deadline)
}

func (l *Lease) finish(err error) error {
	h := l.h
	h.mu.Lock()
	if !l.unlocked {
		l.unlocked, l.result = true, err
		h.holds--
	}
	err = l.result
	h.mu.Unlock()
	return err
}
