package dlock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock/internal/wire"
)

var multiAcquireScript = loadScript(wire.MultiAcquire)

// A MultiLock is several mutex names held as one: one Lease, one owner
// token, a fence per name, renewed, released and lost together. Use it
// where a change spans several locked things (a transfer between two
// accounts) and locking them one by one would risk a deadlock between two
// callers that take the same names in different orders.
//
// Its names are taken in one global order: by the Cluster hash slot of
// each name's key, then by name. The names of one slot (every name, on a
// server that is not a Cluster) are taken together by one script, all or
// none, and only when none of them is held or has a live waiter in its
// line; names in several slots are taken slot by slot in that order. A
// caller that finds a name taken waits for it (notified, as Mutex.Lock
// waits) holding only names before it in the order, so two MultiLocks
// never wait for each other in a circle. What a failed or cancelled call
// took is given back. Each name is an ordinary mutex: a Mutex of the same
// name excludes it, and waits for it, like any other holder.
//
// A MultiLock is cheap, holds nothing at Redis until locked, and may be
// kept and used by several goroutines. It is not available in quorum mode.
type MultiLock struct {
	c      *Client
	parts  []*Mutex // in lock order: by the slot of each name's key, then by name
	groups [][]int  // the parts of one slot (all of them off a Cluster), in order
	label  string   // the names in lock order, for messages
	err    error    // an invalid name, option or list, reported by every call
}

// MultiLock returns the lock of names as one holding, with opts applied to
// every name (TTL, NoRenew, Fair). names must be one or more distinct
// valid lock names (see Mutex); an empty list, a name given twice or an
// invalid name is reported by every call as ErrInvalidArgument, naming
// what is wrong, and so is a Client made by NewQuorum.
func (c *Client) MultiLock(names []string, opts ...LockOption) *MultiLock {
	m := &MultiLock{c: c}
	seen := make(map[string]bool, len(names))
	for _, name := range names {
		p := c.Mutex(name, opts...)
		switch {
		case m.err != nil:
		case p.lk.err != nil:
			m.err = nameErr(name, p.lk.err)
		case seen[name]:
			m.err = nameErr(name, invalidf("given twice to one MultiLock: every name is locked once"))
		}
		seen[name] = true
		m.parts = append(m.parts, p)
	}
	switch {
	case m.err != nil:
	case len(names) == 0:
		m.err = invalidf("MultiLock of no names: give at least one")
	case c.q != nil:
		m.err = invalidf("MultiLock in quorum mode: its names cannot be taken together across the masters (lock them one by one, in one order)")
	}
	slot := func(p *Mutex) int {
		if !c.tr.Slots {
			return 0 // one server: every name in one group
		}
		return int(wire.Slot(p.lk.hash))
	}
	slices.SortFunc(m.parts, func(a, b *Mutex) int {
		if sa, sb := slot(a), slot(b); sa != sb {
			return sa - sb
		}
		return strings.Compare(a.lk.name, b.lk.name)
	})
	sorted := make([]string, len(m.parts))
	for i, p := range m.parts {
		sorted[i] = p.lk.name
		if i == 0 || slot(p) != slot(m.parts[i-1]) {
			m.groups = append(m.groups, nil)
		}
		m.groups[len(m.groups)-1] = append(m.groups[len(m.groups)-1], i)
	}
	m.label = strings.Join(sorted, ", ")
	return m
}

// Names returns the names in the order they are locked.
func (m *MultiLock) Names() []string {
	out := make([]string, len(m.parts))
	for i, p := range m.parts {
		out[i] = p.lk.name
	}
	return out
}

// TryLock makes one attempt at every name, in order. It returns
// ErrNotObtained, naming the name, if any is held by another holder or has
// a live waiter in its line; then it holds none of them (what it took of
// earlier slots is given back before it returns).
func (m *MultiLock) TryLock(ctx context.Context) (*Lease, error) {
	if err := m.start(ctx); err != nil {
		return nil, err
	}
	t := m.newTake(ctx)
	for _, g := range m.groups {
		took, blocked, err := t.group(ctx, g, false)
		if err == nil && !took {
			err = nameErr(m.parts[blocked].lk.name, ErrNotObtained)
		}
		if err != nil {
			t.undo(ctx)
			return nil, err
		}
	}
	return t.lease(), nil
}

// Lock waits until it holds every name or ctx ends; then it returns an
// error that errors.Is ctx.Err(), holding none of them. Waiting is as
// Mutex.Lock's, on the name that blocked, with no retry limit. The
// returned Lease acts on all names: its Context ends when any is lost,
// Extend and TTL ask each (TTL returns the least), and Unlock releases
// them in reverse order (see Lease.Unlock). A Lock with a ctx that
// descends from a lease of one of the names returns ErrInvalidArgument
// (it would wait for itself: a MultiLock re-enters nothing).
func (m *MultiLock) Lock(ctx context.Context) (*Lease, error) {
	if err := m.start(ctx); err != nil {
		return nil, err
	}
	for {
		l, err, again := m.newTake(ctx).lock(ctx)
		if !again {
			return l, err
		}
		if err != nil {
			m.c.cfg.logger.Debug("dlock: multi lock starts over with a new token", "locks", m.label, "err", err)
		}
	}
}

// start checks what every call checks first.
func (m *MultiLock) start(ctx context.Context) error {
	switch {
	case m.err != nil:
		return m.err
	case m.c.closed.Load():
		return nameErr(m.label, ErrClosed)
	case ctx.Err() != nil:
		return (&lock{name: m.label}).fail(ctx, ctx.Err())
	}
	for _, p := range m.parts {
		if m.c.heldIn(ctx, p.lk.hash, wire.KindMutex) != nil || m.c.multiHeldIn(ctx, p.lk.name) {
			return nameErr(p.lk.name, invalidf("MultiLock under a lease of this name would wait for itself: a MultiLock re-enters no lock"))
		}
	}
	return nil
}

// take is one attempt of a Lock or TryLock to hold every part with one
// token: what it holds, and which parts a group acquire of unknown
// outcome may have taken.
type take struct {
	m      *MultiLock
	parent context.Context
	token  string
	held   []*Lease // by part; nil: not held
	doubt  []bool   // by part
}

func (m *MultiLock) newTake(ctx context.Context) *take {
	return &take{m: m, parent: ctx, token: m.c.tokens.next(), held: make([]*Lease, len(m.parts)), doubt: make([]bool, len(m.parts))}
}

// lock takes the groups in order. again: it gave back what it held and
// the caller starts over with a new token (see below).
func (t *take) lock(ctx context.Context) (l *Lease, err error, again bool) {
	for _, g := range t.m.groups {
		for {
			var rest []int
			for _, i := range g {
				if t.held[i] == nil {
					rest = append(rest, i)
				}
			}
			if len(rest) == 0 {
				break
			}
			took, blocked, err := t.group(ctx, rest, true)
			switch {
			case err != nil:
				t.undo(ctx)
				err, again := t.startOver(ctx, err)
				return nil, err, again
			case took:
				continue
			}
			if slices.ContainsFunc(g, func(i int) bool { return i > blocked && t.held[i] != nil }) {
				// A part before one we hold was taken since we looked: to
				// wait for it we would wait out of order. Start over, with
				// a new token: the parts given back must never be taken
				// again with this one (a release of it still on its way
				// would release them).
				t.undo(ctx)
				return nil, nil, true
			}
			if t.held[blocked], err = t.waitFor(ctx, blocked); err != nil {
				// The wait's own end gave the part back with our token,
				// or takes a pass made to it meanwhile and passes it on
				// (lock.quit): a second give-back could release it under
				// the lease it was passed on to.
				t.doubt[blocked] = false
				t.undo(ctx)
				err, again := t.startOver(ctx, err)
				return nil, err, again
			}
		}
	}
	return t.lease(), nil, false
}

// startOver reports whether a take that failed with err, and gave back
// what it held, starts over with a new token rather than fail: err is a
// grant given back because it came too late (its token is spent: see
// spentToken), not one the replicas did not confirm (which fails closed),
// and the call may still wait. If it may not, the call ends as any wait
// does: ErrClosed after Close, or an error that errors.Is ctx.Err(), not
// the spent grant's ErrNotObtained.
func (t *take) startOver(ctx context.Context, err error) (error, bool) {
	switch {
	case !spent(err) || errors.Is(err, ErrNotReplicated):
		return err, false
	case t.m.c.closed.Load():
		return nameErr(t.m.label, ErrClosed), false
	case ctx.Err() != nil:
		return (&lock{name: t.m.label}).fail(ctx, ctx.Err()), false
	}
	return err, true
}

// waitFor waits for part i as Mutex.Lock does, holding only parts before
// it in the order, with the take's token.
func (t *take) waitFor(ctx context.Context, i int) (*Lease, error) {
	lk := &t.m.parts[i].lk
	h := lk.newHolding(t.parent, 0)
	h.token, h.sharedToken = t.token, true
	h.acqDoubt = t.doubt[i] // a group acquire of ours may yet run, setting its TTL again
	return lk.lockHolding(ctx, h)
}

// group runs multi_acquire.lua for the parts idx of one slot: it takes all
// of them, or reports the first that blocked. An unknown outcome is asked
// again with the same token while waiting (wait), as a Mutex's first look
// does; otherwise, and when ctx ends, the parts are given back.
func (t *take) group(ctx context.Context, idx []int, wait bool) (took bool, blocked int, err error) {
	backoff := firstBackoff
	for {
		took, blocked, err = t.attempt(ctx, idx)
		if err == nil || !wait || ctx.Err() != nil || permanent(err) {
			if err != nil {
				t.giveBack(ctx, idx)
				err = t.fail(ctx, idx, err)
			}
			return took, blocked, err
		}
		t.m.c.cfg.logger.Debug("dlock: multi acquire failed, retrying", "locks", t.m.label, "err", err)
		if err := t.m.c.pause(ctx, backoff); err != nil || t.m.c.closed.Load() {
			t.giveBack(ctx, idx)
			if err == nil || err == ErrClosed {
				return false, 0, nameErr(t.m.label, ErrClosed)
			}
			return false, 0, t.fail(ctx, idx, err)
		}
		backoff = nextBackoff(backoff)
	}
}

// fail is the error of a group acquire that failed, named by its parts.
func (t *take) fail(ctx context.Context, idx []int, err error) error {
	if ne := (*nameError)(nil); errors.As(err, &ne) {
		return err // it names its lock already
	}
	names := make([]string, len(idx))
	for j, i := range idx {
		names[j] = t.m.parts[i].lk.name
	}
	return (&lock{name: strings.Join(names, ", ")}).fail(ctx, err)
}

// attempt sends one multi_acquire.lua call (resent after a failure as the
// engine resends an acquire) and makes the parts held if it took them.
func (t *take) attempt(ctx context.Context, idx []int) (took bool, blocked int, err error) {
	c := t.m.c
	if err := c.pubsubReady(ctx); err != nil {
		return false, 0, err // nothing sent
	}
	first := &t.m.parts[idx[0]].lk
	keys := make([]string, 0, 3*len(idx))
	for _, i := range idx {
		keys = append(keys, t.m.parts[i].lk.keyArr[:3]...)
	}
	args := multiAcquireScript.line(keys, []any{t.token, first.ttlArg})
	late := func(v any, err error) {
		// The caller gave up before the reply: give back what it took,
		// or may have taken.
		if a, ok := v.([]any); err != nil || (ok && len(a) > 0 && a[0] == int64(wire.MultiTaken)) {
			for _, i := range idx {
				t.m.parts[i].lk.giveBackLater(context.Background(), t.token)
			}
		}
	}
	sent := time.Now()
	var doubt bool
	var v any
	var short error // see runAcked
	if c.cfg.ack.on() {
		v, short, err = c.runAcked(ctx, multiAcquireScript, first.hash, args, "acquire", &doubt, late)
	} else {
		v, err = c.runLine(ctx, multiAcquireScript, args, false, &doubt, late)
	}
	if doubt || err != nil {
		for _, i := range idx {
			t.doubt[i] = true // it may yet run, with the locks' TTL
		}
	}
	if err != nil {
		c.clusterHint(err)
		return false, 0, err
	}
	a, _ := v.([]any)
	if len(a) < 2 {
		return false, 0, fmt.Errorf("unexpected multi acquire reply %v", v)
	}
	code, _ := a[0].(int64)
	n, _ := a[1].(int64)
	switch {
	case code == wire.MultiTaken && len(a) == len(idx)+1:
	case (code == wire.MultiRefused || code == wire.MultiForeign) && n >= 1 && int(n) <= len(idx):
		p := &t.m.parts[idx[n-1]].lk
		if code == wire.MultiRefused {
			return false, idx[n-1], nil
		}
		what, _ := a[len(a)-1].(string)
		if what == "type" {
			return false, 0, nameErr(p.name, scriptErr(p.hash, p.kind, errors.New("WRONGTYPE")))
		}
		return false, 0, nameErr(p.name, scriptErr(p.hash, p.kind, errors.New(wire.ErrForeign+what)))
	default:
		return false, 0, fmt.Errorf("unexpected multi acquire reply %v", v)
	}
	if short != nil {
		// Fail closed: a failover now could give the locks again.
		t.giveBackNow(ctx, idx)
		return false, 0, spentToken{short}
	}
	if took := time.Since(sent); !time.Now().Before(validUntil(sent, first.ttl)) {
		// The reply came when the leases it granted may have expired.
		t.giveBackNow(ctx, idx)
		return false, 0, spentToken{fmt.Errorf("%w: acquire: granted, but the reply came %v after the request, past the lease's validity (TTL %v): given back", ErrNotObtained, took.Round(time.Millisecond), first.ttl)}
	}
	for j, i := range idx {
		f, _ := a[j+1].(int64)
		if err := t.granted(ctx, i, uint64(f), sent); err != nil {
			t.giveBackNow(ctx, idx[j+1:])
			return false, 0, err
		}
	}
	return true, 0, nil
}

// granted makes part i held by the take, as the engine makes a holding
// held after its own acquire (lock.obtained): a request sent at sent took
// it with fence f.
func (t *take) granted(ctx context.Context, i int, f uint64, sent time.Time) error {
	lk := &t.m.parts[i].lk
	h := lk.newHolding(t.parent, 0)
	h.token = t.token
	h.acqDoubt = t.doubt[i]
	l, err := lk.obtained(ctx, h, look{ok: true, fence: f, sent: sent}, nil)
	t.held[i] = l
	return err
}

// giveBack gives back, in the background (see lock.abandon), the parts of
// idx that an acquire of unknown outcome may have taken.
func (t *take) giveBack(ctx context.Context, idx []int) {
	for _, i := range idx {
		if t.doubt[i] {
			t.m.parts[i].lk.giveBackLater(ctx, t.token)
		}
	}
}

// giveBackNow gives parts idx back before it returns, for a grant that
// does not count (as lock.attempt does), even if ctx has ended, within
// min(TTL, 5s).
func (t *take) giveBackNow(ctx context.Context, idx []int) {
	for _, i := range idx {
		lk := &t.m.parts[i].lk
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), min(lk.ttl, 5*time.Second))
		_ = lk.proto.giveBack(rctx, lk, t.token)
		cancel()
	}
}

// undo releases what the take holds, in reverse order, and gives back the
// parts that an acquire of unknown outcome may have taken.
func (t *take) undo(ctx context.Context) {
	for i := len(t.held) - 1; i >= 0; i-- {
		if l := t.held[i]; l != nil {
			l.h.unlockNow(ctx, context.Canceled)
		} else if t.doubt[i] {
			t.m.parts[i].lk.giveBackLater(ctx, t.token)
		}
	}
}

// lease returns the take's lease, once it holds every part.
func (t *take) lease() *Lease {
	return &Lease{m: &multiHolding{token: t.token, parent: t.parent, parts: t.held}}
}

// multiHolding is what a MultiLock's Lease holds: one ordinary mutex
// holding per name, in lock order, all with one token.
type multiHolding struct {
	token  string
	parent context.Context
	parts  []*Lease

	mu       sync.Mutex
	unlocked bool
	ctx      *multiContext
	cancel   context.CancelCauseFunc
}

func (m *multiHolding) name() string {
	names := make([]string, len(m.parts))
	for i, p := range m.parts {
		names[i] = p.Name()
	}
	return strings.Join(names, ", ")
}

// context returns the lease context, creating it on first use: it ends at
// Unlock, or as soon as any part ends, with that part's cause.
func (m *multiHolding) context() context.Context {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ctx != nil {
		return m.ctx
	}
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(m.parent))
	m.ctx, m.cancel = &multiContext{Context: ctx, m: m}, cancel
	if m.unlocked {
		cancel(context.Canceled)
		return m.ctx
	}
	for _, p := range m.parts {
		pc := p.Context()
		context.AfterFunc(pc, func() { cancel(nameErr(p.Name(), context.Cause(pc))) })
	}
	return m.ctx
}

// check ends the context at once if a part has ended or its deadline has
// passed, so that a holder resuming from a pause sees it ended before any
// timer fired, and one that asks first after a part ended sees it ended
// before the part's AfterFunc ran.
func (m *multiHolding) check() {
	now := time.Now()
	for _, p := range m.parts {
		p.h.expired(now)
		if pc := p.Context(); pc.Err() != nil {
			m.cancel(nameErr(p.Name(), context.Cause(pc)))
		}
	}
}

func (m *multiHolding) extend(ctx context.Context, ttl time.Duration) error {
	var errs []error
	for _, p := range m.parts {
		errs = append(errs, p.Extend(ctx, ttl))
	}
	return errors.Join(errs...)
}

func (m *multiHolding) ttl(ctx context.Context) (time.Duration, error) {
	least := time.Duration(-1)
	for _, p := range m.parts {
		d, err := p.TTL(ctx)
		if err != nil {
			return 0, err
		}
		if least < 0 || d < least {
			least = d
		}
	}
	return least, nil
}

// unlock ends the lease and releases every part, in reverse order, each as
// Lease.Unlock does; it reports every part's failure (an ErrLockLost among
// them if a part had been lost), after releasing the others.
func (m *multiHolding) unlock(ctx context.Context) error {
	m.mu.Lock()
	m.unlocked = true
	if m.cancel != nil {
		m.cancel(context.Canceled) // before the parts' ends: their causes are not the lease's
	}
	m.mu.Unlock()
	var errs []error
	for i := len(m.parts) - 1; i >= 0; i-- {
		errs = append(errs, m.parts[i].Unlock(ctx))
	}
	return errors.Join(errs...)
}

type multiKey struct{}

// multiContext is a MultiLock lease's context: it checks the parts'
// deadlines on every Done and Err, and lets a MultiLock find it (to refuse
// waiting for itself). It hides its parts from a Mutex's Lock: they are
// never re-entered.
type multiContext struct {
	context.Context
	m *multiHolding
}

func (c *multiContext) Done() <-chan struct{} {
	c.m.check()
	return c.Context.Done()
}

func (c *multiContext) Err() error {
	c.m.check()
	return c.Context.Err()
}

func (c *multiContext) Value(key any) any {
	if key == (multiKey{}) {
		return c.m
	}
	return c.Context.Value(key)
}

// multiHeldIn reports whether a MultiLock lease of c that ctx descends from
// holds name.
func (c *Client) multiHeldIn(ctx context.Context, name string) bool {
	for v := ctx.Value(multiKey{}); v != nil; {
		m := v.(*multiHolding)
		for _, p := range m.parts {
			if p.h.c == c && p.Name() == name {
				return true
			}
		}
		v = m.parent.Value(multiKey{})
	}
	return false
}

// Names returns the names the lease holds: a MultiLock's in lock order,
// or the one lock name.
func (l *Lease) Names() []string {
	if l.m == nil {
		return []string{l.Name()}
	}
	out := make([]string, len(l.m.parts))
	for i, p := range l.m.parts {
		out[i] = p.Name()
	}
	return out
}

// FenceOf returns the fence of the lock called name in the lease (see
// Fence), or 0 if the lease does not hold that name. Give each piece of
// storage the fence of the name that guards it.
func (l *Lease) FenceOf(name string) uint64 {
	if l.m == nil {
		if name == l.Name() {
			return l.Fence()
		}
		return 0
	}
	for _, p := range l.m.parts {
		if p.Name() == name {
			return p.Fence()
		}
	}
	return 0
}
