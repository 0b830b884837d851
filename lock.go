package dlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dlock-go/dlock/internal/wire"
)

// lock is what every primitive is made of: a name at Redis, the lease
// options, and the protocol of its kind. It does not change once made.
type lock struct {
	c        *Client
	name     string
	kind     string    // wire.KindMutex, KindSemaphore or KindRWMutex
	keyArr   [4]string // the KEYS of its scripts (scriptKeys); [0] is the lock hash
	hash     string    // the lock hash: its key, and its wake-up channel
	handover string    // this Client's hand-over channel for the lock
	ttl      time.Duration
	ttlArg   string
	renew    bool
	fair     bool   // waiters wait in the line at Redis; false: default mode (see Mutex.Lock)
	election bool   // an Election's: its holdings are never re-entered (see heldIn)
	readSide bool   // the read side of an RWMutex
	sizeArg  string // a semaphore's size
	nArg     string // the permits every call takes (the sides of an RWMutex)
	proto    proto
	err      error // an invalid name or option, reported by every call
}

// proto is what one kind of lock does at Redis: its scripts and arguments.
type proto interface {
	// prepare builds h's acquire and release command lines (n: permits).
	prepare(h *holding, n int64)
	// joinLine makes h's acquire take, or keep alive, a place in the line.
	joinLine(h *holding)
	extend(h *holding, ttlMillis string) call
	pttl(h *holding) call
	// giveBack leaves the line and releases the lock if it had been handed
	// to token meanwhile (or if an acquire whose reply was lost took it).
	giveBack(ctx context.Context, lk *lock, token string) error
}

// call is one script call made with script.run.
type call struct {
	s    *script
	keys []string
	args []any
}

// initLock makes l the lock called name, of kind, with opts (in place: the
// prepared command lines of its holdings point into it).
func (c *Client) initLock(l *lock, name, kind string, opts []LockOption) {
	cfg := lockOptions(opts)
	k, handover := wire.KeysAndHandOver(c.cfg.prefix, name, c.id)
	*l = lock{
		c: c, name: name, kind: kind, hash: k.Hash, handover: handover, ttl: wholeMillis(cfg.ttl), renew: !cfg.noRenew,
		fair: cfg.fair || kind != wire.KindMutex, ttlArg: c.ttlArgOf(cfg.ttl),
	}
	if kind == wire.KindMutex {
		l.keyArr = [4]string{k.Hash, k.Line, k.Waiters}
		l.proto = mutexProto{}
	} else {
		l.keyArr = [4]string{k.Hash, k.Holders, k.Line, k.Waiters} // sem.lua's order
		l.proto = semProto{}
	}
	if err := validName(name); err != nil {
		l.err = err
	} else if err := validPrefix(c.cfg.prefix); err != nil {
		l.err = err
	} else if err := validTTL(cfg.ttl); err != nil {
		l.err = err
	} else if err := c.cfg.ack.err; err != nil {
		l.err = err
	} else if err := c.cfg.quorum.err; err != nil {
		l.err = err
	} else if c.q != nil {
		l.err = c.q.checkLock(kind, cfg)
	}
	if c.q != nil {
		l.proto = quorumProto{}
	}
}

// lockOptions applies opts to the defaults.
func lockOptions(opts []LockOption) lockConfig {
	cfg := lockConfig{ttl: DefaultTTL}
	for _, o := range opts {
		o(&cfg)
	}
	return cfg
}

// ttlArgOf is the TTL argument of the scripts for ttl (the Client's own
// for the default).
func (c *Client) ttlArgOf(ttl time.Duration) string {
	if ttl == DefaultTTL {
		return c.ttlArg
	}
	return formatMillis(ttl)
}

// scriptKeys are the KEYS of the lock's scripts.
func (lk *lock) scriptKeys() []string {
	switch lk.kind {
	case wire.KindMutex:
		return lk.keyArr[:3]
	case wire.KindString:
		return lk.keyArr[:2]
	}
	return lk.keyArr[:4]
}

// start checks what every call checks first, and handles reentrancy: done
// means the call returns (l, err).
func (lk *lock) start(ctx context.Context) (l *Lease, err error, done bool) {
	switch {
	case lk.err != nil:
		return nil, nameErr(lk.name, lk.err), true
	case lk.c.closed.Load():
		return nil, nameErr(lk.name, ErrClosed), true
	case ctx.Err() != nil:
		return nil, lk.fail(ctx, ctx.Err()), true
	case lk.kind == wire.KindSemaphore:
		return nil, nil, false // permits are counted, not re-entered
	}
	h := lk.c.heldIn(ctx, lk.hash, lk.kind)
	if h == nil {
		return nil, nil, false
	}
	if lk.kind == wire.KindRWMutex && !lk.readSide && h.lk.readSide {
		return nil, nameErr(lk.name, invalidf("Lock under a read lease of the same RWMutex would wait for itself: unlock the read lease first (no upgrades)")), true
	}
	l, err = h.reenter()
	return l, err, true
}

// heldIn finds a holding of key by c among the lease contexts ctx descends
// from. A leadership is not one: a Mutex of the election's name must not
// share it (the Election's Resign would then leave the lock held).
func (c *Client) heldIn(ctx context.Context, key, kind string) *holding {
	for v := ctx.Value(leaseKey{}); v != nil; {
		h := v.(*holding)
		if h.c == c && h.lk.hash == key && h.lk.kind == kind {
			if h.lk.election {
				return nil // see above
			}
			return h
		}
		v = h.parent.Value(leaseKey{})
	}
	return nil
}

// leadsIn reports whether ctx descends from the lease context of a
// leadership by c of the election keyed key: a Lock of that name would
// wait for the leadership, which it does not re-enter (see heldIn).
func (c *Client) leadsIn(ctx context.Context, key string) bool {
	for v := ctx.Value(leaseKey{}); v != nil; {
		h := v.(*holding)
		if h.c == c && h.lk.hash == key && h.lk.election {
			return true
		}
		v = h.parent.Value(leaseKey{})
	}
	return false
}

// try is TryLock after its checks: one attempt without a place in line.
func (lk *lock) try(ctx context.Context, n int64) (*Lease, error) {
	h := lk.newHolding(ctx, n)
	r, err := lk.attempt(ctx, h, false)
	switch {
	case err != nil:
		lk.abandon(ctx, h.token, err)
		return nil, lk.fail(ctx, err)
	case !r.ok:
		lk.c.obs.refused(ctx, lk)
		return nil, nameErr(lk.name, ErrNotObtained)
	}
	return lk.obtained(ctx, h, r, nil)
}

// firstLook is a Lock's attempt before it waits, without a place in line.
// done: Lock returns (l, err); otherwise it goes on to wait for the holder
// with fence holder.
func (lk *lock) firstLook(ctx context.Context, h *holding) (l *Lease, err error, done bool, holder uint64) {
	backoff := firstBackoff
	for {
		r, err := lk.attempt(ctx, h, false)
		switch {
		case err == nil && r.ok:
			l, err = lk.obtained(ctx, h, r, nil)
			return l, err, true, 0
		case err == nil:
			return nil, nil, false, r.fence // held: wait for it
		case h.renewable(err) && ctx.Err() == nil:
			// A give-back still on its way may release a grant to this
			// token: go on with a fresh one (nothing has recorded
			// the token yet: no place in line, no local waiter). The old
			// one is given back again in the background. (A grant the
			// replicas did not confirm fails the call closed instead.)
			lk.abandon(ctx, h.token, err)
			h.token = lk.c.tokens.next()
		case ctx.Err() != nil || permanent(err):
			lk.abandon(ctx, h.token, err)
			return nil, lk.fail(ctx, err), true, 0
		}
		// The outcome is unknown: the lock may be ours. Ask again with the
		// same token before waiting, or this Client's own next waiter
		// would wait for a lock that nobody renews or releases.
		lk.c.cfg.logger.Debug("dlock: acquire failed, retrying", "lock", lk.name, "err", err)
		if perr := lk.pause(ctx, backoff); perr != nil {
			lk.abandon(ctx, h.token, err)
			return nil, perr, true, 0
		}
		backoff = nextBackoff(backoff)
	}
}

// Retries back off from firstBackoff, doubling (nextBackoff) up to
// maxBackoff.
const (
	firstBackoff = time.Millisecond
	maxBackoff   = 500 * time.Millisecond
)

func nextBackoff(d time.Duration) time.Duration { return min(2*d, maxBackoff) }

// pause waits d, or until ctx ends or the Client closes (then the error
// the call returns: ErrClosed, or one that errors.Is ctx.Err()).
func (lk *lock) pause(ctx context.Context, d time.Duration) error {
	switch err := lk.c.pause(ctx, d); {
	case err == nil:
		return nil
	case err == ErrClosed:
		return nameErr(lk.name, ErrClosed)
	default:
		return lk.fail(ctx, err)
	}
}

// pause waits d, or until ctx ends (ctx.Err()) or c closes (ErrClosed):
// every retry of a call backs off through it, so that Close ends the
// call's wait at once.
func (c *Client) pause(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-c.bg.Done():
		return ErrClosed
	}
}

// look is the reply of one acquire.
type look struct {
	ok      bool          // obtained, with fence
	fence   uint64        // obtained: the fence; not: the holder's
	already bool          // the token already held it (handed over while in line, or a retry)
	sent    time.Time     // when the acquire was sent
	left    time.Duration // not obtained: how long the holder's lease has left
}

// attempt runs h's acquire (resent after a failure as go-redis would: see
// runLine). An error may leave the outcome unknown.
func (lk *lock) attempt(ctx context.Context, h *holding, waited bool) (look, error) {
	if err := lk.c.pubsubReady(ctx); err != nil {
		return look{}, err // nothing sent
	}
	r := look{sent: time.Now()}
	h.contended = waited
	token := h.token // firstLook may replace h's after this attempt (see spent)
	late := func(v any, err error) {
		// The caller gave up before the reply: if it was a grant (or may
		// have been), give the lock back rather than leave it to its TTL.
		// A waiting acquire took a place in line, which is left: the
		// caller's own give-back may have run before it at Redis (it does
		// not wait for a call still queued in a pipeliner).
		if a, ok := v.([]any); err != nil || waited || (ok && len(a) >= 2 && a[0] == int64(1)) {
			lk.abandon(context.Background(), token, ErrLockLost)
		}
	}
	var v any
	var short, err error // short: see runAcked
	if lk.c.cfg.ack.on() {
		v, short, err = lk.c.runAcked(ctx, h.cmd.acqScript, lk.hash, h.cmd.acquire(), "acquire", &h.acqDoubt, late)
	} else {
		v, err = lk.c.runLine(ctx, h.cmd.acqScript, h.cmd.acquire(), waited, &h.acqDoubt, late)
	}
	if err != nil {
		h.acqDoubt = true // it may yet run, with the lock's TTL
		lk.c.clusterHint(err)
		return r, lk.kindErr(err)
	}
	a, ok := v.([]any)
	if !ok || len(a) < 2 {
		return r, fmt.Errorf("unexpected acquire reply %v", v)
	}
	got, _ := a[0].(int64)
	n, _ := a[1].(int64)
	var third int64
	if len(a) > 2 {
		third, _ = a[2].(int64)
	}
	if got == 1 {
		if short != nil {
			// Fail closed: a failover now could give the lock again.
			_ = lk.proto.giveBack(ctx, lk, h.token)
			return r, spentToken{short}
		}
		if took := time.Since(r.sent); !time.Now().Before(validUntil(r.sent, lk.ttl)) {
			// The grant's reply came when the lease it granted may already
			// have expired (fault 3): not obtained, and given back.
			_ = lk.proto.giveBack(ctx, lk, h.token)
			return r, spentToken{fmt.Errorf("%w: acquire: granted, but the reply came %v after the request, past the lease's validity (TTL %v): given back", ErrNotObtained, took.Round(time.Millisecond), lk.ttl)}
		}
		r.ok, r.fence, r.already = true, uint64(n), third == 1
		return r, nil
	}
	r.left, r.fence = time.Duration(n)*time.Millisecond, uint64(third)
	if n < 0 { // no expiry on the key (not set by dlock): look again after a TTL
		r.left = lk.ttl
	}
	if lk.isString() {
		r.left = lk.c.stringLeft(lk, r.left) // no release may be heard: poll
	}
	return r, nil
}

// obtained makes h held after its acquire r succeeded (lc: the waiter's
// books, if it waited), or releases it again if Close raced with it.
func (lk *lock) obtained(ctx context.Context, h *holding, r look, lc *local) (*Lease, error) {
	if lc != nil {
		h.turnEnd = lk.c.turnFrom(lc)
	}
	h.granted(r.fence, r.sent, h.ttl)
	if h.raced(ctx) {
		return nil, nameErr(lk.name, ErrClosed)
	}
	return &h.first, nil
}

// raced, called just after h became live, reports whether Close raced with
// it; then it releases the lock (Close did not see h). Close sets closed
// before it collects the live holdings, so a holding made live before that
// is Close's to release, and one after is seen here.
func (h *holding) raced(ctx context.Context) bool {
	if !h.c.closed.Load() {
		return false
	}
	h.unlockNow(ctx, ErrClosed)
	return true
}

// kindErr maps a script's error reply to a dlock error that names what the
// key holds and what this call wanted it to be.
func (lk *lock) kindErr(err error) error {
	if strings.HasPrefix(err.Error(), wire.ErrSize) {
		return invalidf("the semaphore is in use with size %s, not %s: every client must give it the same size",
			strings.TrimPrefix(err.Error(), wire.ErrSize), lk.sizeArg)
	}
	return scriptErr(lk.hash, lk.kind, err)
}

// spentToken is the error of an attempt whose grant was given back: a copy
// of that give-back may still be on its way to Redis even when one was
// answered (a release resent after a lost reply: see script.run), and it
// would release a later grant to the same token (a retry finds the lock
// already the token's, or takes it afresh with the same token) under a live
// lease. So the token must not be tried again.
type spentToken struct{ err error }

func (e spentToken) Error() string {
	return e.err.Error() + " (its token is not tried again: a give-back of it may still be on its way)"
}
func (e spentToken) Unwrap() error { return e.err }

// renewable reports whether h may go on with a fresh token after err: its
// token is spent (see spentToken), by a grant given back because it came
// too late, not one the replicas did not confirm (which fails closed), and
// the token is h's own (a MultiLock part's is its take's, which starts
// over as a whole).
func (h *holding) renewable(err error) bool {
	return spent(err) && !errors.Is(err, ErrNotReplicated) && !h.sharedToken
}

// spent reports an error after which the attempt's token must not be
// tried again (see spentToken).
func spent(err error) bool {
	var s spentToken
	return errors.As(err, &s)
}

// permanent reports errors that retrying cannot cure, a refusal by the
// server's ACL or authentication among them (a Lock would otherwise wait
// for its ctx, forever with WaitForever-style contexts, saying nothing).
func permanent(err error) bool {
	return errors.Is(err, ErrForeignKey) || errors.Is(err, ErrClosed) || errors.Is(err, ErrInvalidArgument) || errors.Is(err, ErrNotReplicated) || refused(err) || spent(err)
}

// fail wraps err for the caller; a ctx error comes out so that it errors.Is ctx.Err().
func (lk *lock) fail(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		if cause := context.Cause(ctx); cause != nil && cause != cerr {
			return &nameError{name: lk.name, err: cerr, cause: cause}
		}
		return nameErr(lk.name, cerr)
	}
	return nameErr(lk.name, explainRefusal(err))
}

// stopped is the error of a wait that ctx or Close (cause ErrClosed) ended.
func (lk *lock) stopped(ctx context.Context, cause error) error {
	if errors.Is(cause, ErrClosed) {
		return nameErr(lk.name, ErrClosed)
	}
	return lk.fail(ctx, cause)
}

// abandon gives back, in the background, what an acquire whose outcome is
// unknown may have taken: nobody else would release it before its TTL.
func (lk *lock) abandon(ctx context.Context, token string, err error) {
	if err == nil || errors.Is(err, ErrForeignKey) || errors.Is(err, ErrInvalidArgument) {
		return
	}
	lk.giveBackLater(ctx, token)
}

// giveBackLater leaves the line for token and releases the lock if it had
// been handed to token, in the background, within min(TTL, 5s).
func (lk *lock) giveBackLater(ctx context.Context, token string) {
	release := func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(lk.ttl, 5*time.Second))
		defer cancel()
		_ = lk.proto.giveBack(rctx, lk, token)
	}
	if !lk.c.goBg(release) {
		release() // the Client is closing: no goroutine may start
	}
}
