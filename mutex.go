package dlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// A Mutex is a distributed exclusive lock on one name. It is cheap: create
// one per use or keep it; it holds no state at Redis until locked. Every
// successful Lock or TryLock returns its own Lease.
type Mutex struct {
	c        *Client
	name     string
	kind     string    // what the name is used as: "mutex", "semaphore" or "rwmutex"
	keys     []string  // the lock key, its line and its waiters (a semaphore's four keys), shared by every call
	keyArr   [4]string // backs keys
	keyAny   any       // &keyArr[0], for prepared command lines
	ttl      time.Duration
	ttlArg   string
	renew    bool
	fair     bool   // waiters wait in a line at Redis and are handed the lock
	sem      bool   // a semaphore (sem.lua); also each side of an RWMutex
	shared   bool   // the read side of an RWMutex
	nArg     string // sem: the permits every call of this lock takes ("" if per call)
	sizeArg  string // sem: the size
	handover string // this Client's hand-over channel for the lock
	err      error  // invalid name or option, reported by every call
}

// Mutex returns the lock called name. The name is any non-empty string of
// at most MaxNameLen bytes; it becomes part of the Redis key
// prefix + "{" + name + "}". Invalid names and options are reported by the
// Mutex's methods as ErrInvalidArgument.
func (c *Client) Mutex(name string, opts ...LockOption) *Mutex {
	m := &Mutex{}
	c.initLock(m, name, "mutex", opts)
	return m
}

// initLock fills in what every primitive has: its keys, lease options and
// the hand-over channel of a lock whose waiters wait in line at Redis.
func (c *Client) initLock(m *Mutex, name, kind string, opts []LockOption) {
	cfg := lockConfig{ttl: DefaultTTL}
	for _, o := range opts {
		o(&cfg)
	}
	m.c, m.name, m.kind, m.ttl, m.renew = c, name, kind, cfg.ttl, !cfg.noRenew
	m.fair = cfg.fair || kind != "mutex"
	m.sem = kind != "mutex"
	m.keyArr[0], m.keyArr[1], m.keyArr[2], m.handover = c.lockKeys(name)
	m.keys, m.keyAny = m.keyArr[:3], &m.keyArr[0]
	if m.sem {
		// sem.lua's keys: the hash, holders, line, waiters.
		m.keyArr[3], m.keyArr[2] = m.keyArr[2], m.keyArr[1]
		m.keyArr[1] = m.keyArr[0] + ":h"
		m.keys = m.keyArr[:4]
	}
	if cfg.ttl == DefaultTTL {
		m.ttlArg = c.ttlArg
	} else {
		m.ttlArg = strconv.FormatInt(cfg.ttl.Milliseconds(), 10)
	}
	if err := validName(name); err != nil {
		m.err = err
	} else if err := validTTL(cfg.ttl); err != nil {
		m.err = err
	}
}

// Name returns the lock name.
func (m *Mutex) Name() string { return m.name }

// TryLock makes one attempt. It returns ErrNotObtained if another holder has
// the lock. If ctx descends from a lease context of this lock (same Client),
// it re-enters the lock instead (see Lock).
func (m *Mutex) TryLock(ctx context.Context) (*Lease, error) {
	if l, err, done := m.start(ctx); done {
		return l, err
	}
	return m.try(ctx, m.nArg)
}

// try is TryLock after its checks, for n permits of a semaphore.
func (m *Mutex) try(ctx context.Context, n string) (*Lease, error) {
	h := m.prepare(ctx, n)
	l, _, _, err := m.attempt(ctx, h, false)
	if err != nil {
		m.abandon(ctx, h.token, err)
		return nil, m.fail(ctx, err)
	}
	if l == nil {
		return nil, nameErr(m.name, ErrNotObtained)
	}
	return l, nil
}

// Lock waits until it holds the lock or ctx ends; then it returns an error
// that errors.Is ctx.Err(). There is no retry limit and no polling: it is woken
// by the holder's release (or by the holder's TTL running out). Waiters of
// one Client are served in arrival order; the first of them waits in the
// lock's line at Redis and is handed the lock by the release.
//
// Reentrancy: if ctx descends from the Context of a Lease of this lock on this
// Client, Lock returns a new Lease on the same holding at once (a hold count).
// The lock is released when every one of those leases has unlocked.
func (m *Mutex) Lock(ctx context.Context) (*Lease, error) {
	if l, err, done := m.start(ctx); done {
		return l, err
	}
	if m.fair {
		return m.lockFair(ctx, m.prepare(ctx, m.nArg))
	}
	h := m.prepare(ctx, m.nArg)
	if !m.c.queued(m.keys[0]) {
		// Nobody of ours waits for this lock: try it at once.
		if l, err, done := m.firstLook(ctx, h); done {
			return l, err
		}
	}
	return m.wait(ctx, h)
}

// firstLook is a Lock's attempt before it waits, without a place in line.
// done: Lock returns (l, err); otherwise it goes on to wait.
func (m *Mutex) firstLook(ctx context.Context, h *holding) (l *Lease, err error, done bool) {
	l, _, _, err = m.attempt(ctx, h, false)
	switch {
	case l != nil:
		return l, nil, true
	case err != nil && (ctx.Err() != nil || permanent(err)):
		m.abandon(ctx, h.token, err)
		return nil, m.fail(ctx, err), true
	}
	return nil, nil, false
}

// look is one attempt of a waiter in line (wait, lockFair). done: the
// waiter returns (l, err). Otherwise it sleeps until a wake-up or for left
// at most; seen is the fence of the holder found (0 if unknown), and
// backoff grows while Redis cannot be reached.
func (m *Mutex) look(ctx context.Context, h *holding, grant chan uint64, backoff *time.Duration) (l *Lease, left time.Duration, seen uint64, err error, done bool) {
	l, left, seen, err = m.attempt(ctx, h, true)
	switch {
	case l != nil:
		m.c.checkGrant(h, grant)
		return l, 0, 0, nil, true
	case err != nil && (ctx.Err() != nil || permanent(err)):
		return nil, 0, 0, m.giveUp(ctx, h, err), true
	case err != nil:
		// Unknown outcome or unreachable server: retry with the same
		// token (an applied acquire is then recognised as ours).
		m.c.cfg.logger.Debug("dlock: acquire failed, retrying", "lock", m.name, "err", err)
		left, seen = *backoff, 0
		*backoff = min(2**backoff, 500*time.Millisecond)
	default:
		*backoff = time.Millisecond
	}
	return nil, left, seen, nil, false
}

// Do locks, runs fn with the lease's context (which ends if the lease is
// lost), and unlocks. It returns fn's error; if fn succeeded but the lease was
// lost while it ran, it returns ErrLockLost.
func (m *Mutex) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	l, err := m.Lock(ctx)
	if err != nil {
		return err
	}
	ferr := fn(l.Context())
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.ttl)
	uerr := l.Unlock(uctx)
	cancel()
	if ferr != nil {
		return ferr
	}
	return uerr
}

// start checks what every call checks first, and handles reentrancy.
func (m *Mutex) start(ctx context.Context) (l *Lease, err error, done bool) {
	switch {
	case m.err != nil:
		return nil, nameErr(m.name, m.err), true
	case m.c.closed.Load():
		return nil, nameErr(m.name, ErrClosed), true
	case ctx.Err() != nil:
		return nil, m.fail(ctx, ctx.Err()), true
	}
	if m.kind == "semaphore" {
		return nil, nil, false // permits are counted, not re-entered
	}
	if h := m.c.heldIn(ctx, m.keys[0], m.kind); h != nil {
		if m.kind == "rwmutex" && !m.shared && h.shared {
			return nil, nameErr(m.name, invalidf("Lock under a read lease of the same RWMutex would wait for itself: unlock the read lease first (no upgrades)")), true
		}
		l, err := h.reenter()
		return l, err, true
	}
	return nil, nil, false
}

// attempt runs the acquire script once. It returns the lease, or how long
// the current holder has left and its fence, or an error (whose outcome may
// be unknown).
func (m *Mutex) attempt(ctx context.Context, h *holding, waited bool) (*Lease, time.Duration, uint64, error) {
	sent := time.Now()
	h.contended = waited
	v, err := m.c.evalArgs(ctx, h.acqScript, h.acq[:h.acqLen], waited, func(v any, err error) {
		// The caller gave up before the reply: if it was a grant (or may
		// have been), give the lock back rather than leave it to its TTL.
		if r, ok := v.([]any); err != nil || (ok && len(r) == 2 && r[0] == int64(1)) {
			m.abandon(context.Background(), h.token, ErrLockLost)
		}
	})
	if err != nil {
		return nil, 0, 0, m.kindErr(err)
	}
	r, ok := v.([]any)
	if !ok || len(r) < 2 {
		return nil, 0, 0, fmt.Errorf("dlock: unexpected acquire reply %v", v)
	}
	ok1, _ := r[0].(int64)
	n, _ := r[1].(int64)
	if ok1 != 1 {
		left := time.Duration(n) * time.Millisecond
		if n < 0 { // no expiry on the key (not set by dlock): look again after a TTL
			left = m.ttl
		}
		var f int64
		if len(r) > 2 {
			f, _ = r[2].(int64)
		}
		return nil, left, uint64(f), nil
	}
	h.already = len(r) > 2 && r[2] == int64(1)
	h.activate(uint64(n), sent)
	if h.raced(ctx) {
		return nil, 0, 0, ErrClosed
	}
	return &h.first, 0, 0, nil
}

// kindErr maps a script's error reply to a dlock error that names what the
// key holds and what this call wanted it to be.
func (m *Mutex) kindErr(err error) error {
	e := scriptErr(m.keys[0], err)
	switch {
	case errors.Is(e, ErrForeignKey):
		return fmt.Errorf("%w, not a %s", e, m.kind)
	case strings.HasPrefix(err.Error(), "DLOCK_SIZE "):
		return invalidf("semaphore %q is in use with size %s, not %s: every client must give it the same size",
			m.name, strings.TrimPrefix(err.Error(), "DLOCK_SIZE "), m.sizeArg)
	}
	return e
}

// permanent reports errors that retrying cannot cure.
func permanent(err error) bool {
	return errors.Is(err, ErrForeignKey) || errors.Is(err, ErrClosed) || errors.Is(err, ErrInvalidArgument)
}

// fail wraps err for the caller; a ctx error comes out so that it errors.Is ctx.Err().
func (m *Mutex) fail(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		if cause := context.Cause(ctx); cause != nil && cause != cerr {
			return fmt.Errorf("dlock: lock %q: %w (%w)", m.name, cerr, cause)
		}
		return nameErr(m.name, cerr)
	}
	return nameErr(m.name, err)
}

// abandon releases, in the background, an acquire whose reply was lost: it
// may have been applied, and then nobody would unlock it before its TTL.
func (m *Mutex) abandon(ctx context.Context, token string, err error) {
	if err == nil || errors.Is(err, ErrForeignKey) || errors.Is(err, ErrInvalidArgument) {
		return
	}
	c := m.c
	release := func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(m.ttl, 5*time.Second))
		defer cancel()
		var v any
		var err error
		if m.sem {
			v, err = semScript.run(rctx, c.rdb, m.keys, "l", token, c.idleArg)
		} else {
			v, err = releaseScript.run(rctx, c.rdb, m.keys, token, "", c.idleArg, m.keys[0])
		}
		if err == nil && v.(int64) != 0 {
			c.cfg.logger.Debug("dlock: released an acquire whose reply was lost", "lock", m.name)
		}
	}
	if !c.goBg(release) {
		release() // the Client is closing: no goroutine may start
	}
}

// wait queues behind this Client's earlier waiters for the lock. At the head
// of that queue it takes a place in the lock's line at Redis, so that a
// release hands the lock straight to it (one head per Client: the lock goes
// round the Clients in turn, and each serves its own waiters in order). It
// sleeps until handed the lock, a free-lock release is published, or the
// holder's TTL runs out, refreshing its place meanwhile.
func (m *Mutex) wait(ctx context.Context, h *holding) (*Lease, error) {
	c := m.c
	q, w := c.enqueue(m.keys[0], m.handover)
	defer c.dequeue(q, w)
	select {
	case <-w.turn:
	case <-ctx.Done():
		return nil, m.fail(ctx, ctx.Err())
	case <-c.bg.Done():
		return nil, nameErr(m.name, ErrClosed)
	}
	grant := c.expectGrant(h.token)
	defer c.forgetGrant(h.token)
	timer := time.NewTimer(time.Second)
	defer timer.Stop()
	// The subscriptions must be live before we look at the lock, or a
	// release (or hand-over) between our attempt and the subscription would
	// go unheard until the TTL (or our next refresh). If they cannot be
	// confirmed soon we go on, bounded by the TTL as ever.
	for _, ready := range [2]chan struct{}{q.ready, q.hand.ready} {
		select {
		case <-ready:
		case <-timer.C:
		case <-ctx.Done():
			return nil, m.fail(ctx, ctx.Err())
		case <-c.bg.Done():
			return nil, nameErr(m.name, ErrClosed)
		}
	}
	m.joinLine(h)
	backoff := time.Millisecond
	for {
		if p := c.claimed(w); p != nil {
			<-grant // passed to us (see pass.go) just before we looked
			return m.takePass(h, p)
		}
		sent := time.Now()
		l, left, seen, err, done := m.look(ctx, h, grant, &backoff)
		if done {
			if l != nil {
				h.turnEnd = c.turnFrom(q)
			}
			return l, err
		}
		// seen is the fence of the holder we wait for: a published release
		// of an older fence is stale and does not send us to Redis again.
		// Look again when the holder's lease runs out, and keep our place
		// in line alive.
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
		timer.Reset(max(min(left, fairLiveness/3), time.Millisecond))
		c.readyFor(w, h.token, m.ttlArg)
	sleep:
		select {
		case f := <-grant:
			// No pass may be made to us from here on. A 0 is a pass
			// (passOn sends one only into an empty channel): then p is it.
			p := c.claimed(w)
			if f == 0 {
				return m.takePass(h, p) // passed to us by a holder of this Client
			}
			l, err := m.granted(ctx, h, f, sent)
			if l != nil {
				h.turnEnd = c.turnFrom(q)
			}
			return l, err
		case <-q.notify:
			if !c.released(q, seen) {
				goto sleep
			}
		case <-timer.C:
		case <-ctx.Done():
			return nil, m.quit(ctx, h, w, grant, ctx.Err())
		case <-c.bg.Done():
			return nil, m.quit(ctx, h, w, grant, ErrClosed)
		}
	}
}

// quit ends a wait that ctx or Close cut short. A lock passed to the waiter
// at that moment is passed on or released rather than kept.
func (m *Mutex) quit(ctx context.Context, h *holding, w *waiter, grant chan uint64, cause error) error {
	p := m.c.claimed(w)
	if p == nil {
		return m.giveUp(ctx, h, cause)
	}
	<-grant
	if m.c.takePass(h, p) {
		h.unlockNow(ctx)
	}
	return m.stopped(ctx, cause)
}

// takePass returns the lease of a waiter the lock was passed to.
func (m *Mutex) takePass(h *holding, p *pass) (*Lease, error) {
	if !m.c.takePass(h, p) {
		return nil, nameErr(m.name, ErrClosed)
	}
	return &h.first, nil
}

// stopped is the error of a wait that ctx or Close (cause ErrClosed) ended.
func (m *Mutex) stopped(ctx context.Context, cause error) error {
	if errors.Is(cause, ErrClosed) {
		return nameErr(m.name, ErrClosed)
	}
	return m.fail(ctx, cause)
}
