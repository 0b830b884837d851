package dlock

import (
	"context"
	"time"

	"github.com/dlock-go/dlock/internal/wire"
)

// A Mutex is a distributed exclusive lock on one name. It is cheap: create
// one per use or keep it; it holds no state at Redis until locked. Every
// successful Lock or TryLock returns its own Lease.
type Mutex struct {
	lk lock
}

// Mutex returns the lock called name. The name is any non-empty string of
// at most MaxNameLen bytes that does not begin with '}'; it becomes part of
// the Redis key prefix + "{" + name + "}". Invalid names and options are
// reported by the Mutex's methods as ErrInvalidArgument.
func (c *Client) Mutex(name string, opts ...LockOption) *Mutex {
	m := &Mutex{}
	c.initLock(&m.lk, name, wire.KindMutex, opts)
	return m
}

// Name returns the lock name.
func (m *Mutex) Name() string { return m.lk.name }

// TryLock makes one attempt. It returns ErrNotObtained if another holder has
// the lock. If ctx descends from a lease context of this lock (same Client),
// it re-enters the lock instead (see Lock).
func (m *Mutex) TryLock(ctx context.Context) (l *Lease, err error) {
	defer m.lk.c.obs.acquire(&ctx, &m.lk, callTry).end(&l, &err)
	if l, err, done := m.lk.start(ctx); done {
		return l, err
	}
	if q := m.lk.c.q; q != nil {
		return q.try(ctx, &m.lk)
	}
	return m.lk.try(ctx, 0)
}

// Lock waits until it holds the lock or ctx ends; then it returns an error
// that errors.Is ctx.Err(). There is no retry limit and no polling: it is
// woken by the holder's release (or by the holder's TTL running out).
//
// Default mode: waiters of one Client are served in arrival order; the
// first of them waits in the lock's line at Redis and is handed the lock by
// the release, and a holder of this Client passes the lock straight to the
// next of its own waiters while its Client's turn lasts (see Fair for the
// strict mode).
//
// Reentrancy: if ctx descends from the Context of a Lease of this lock on this
// Client, Lock returns a new Lease on the same holding at once (a hold count).
// The lock is released when every one of those leases has unlocked. Under
// a MultiLock lease that holds the name (same Client) Lock returns
// ErrInvalidArgument: that lease is not re-entered, and Lock would wait for
// it. So does a Lock under the leadership of an Election of the same name.
func (m *Mutex) Lock(ctx context.Context) (l *Lease, err error) {
	lk := &m.lk
	defer lk.c.obs.acquire(&ctx, lk, callLock).end(&l, &err)
	if l, err, done := lk.start(ctx); done {
		return l, err
	}
	if lk.c.multiHeldIn(ctx, lk.name) {
		// Its lease re-enters none of its names: this would wait for it.
		return nil, nameErr(lk.name, invalidf("Lock under a MultiLock lease of this name would wait for itself: a MultiLock's names are not re-entered"))
	}
	if !lk.election && lk.c.leadsIn(ctx, lk.hash) {
		return nil, nameErr(lk.name, invalidf("Lock under the leadership of the election of this name would wait for itself: a leadership is not re-entered"))
	}
	if q := lk.c.q; q != nil {
		return q.lock(ctx, lk)
	}
	return lk.lockHolding(ctx, lk.newHolding(ctx, 0))
}

// lockHolding is a Lock after its checks, for the holding h (a MultiLock's
// part comes with the token of the whole): a first look without a place,
// then the wait. A default-mode mutex queues behind this Client's waiters
// without a look.
func (lk *lock) lockHolding(ctx context.Context, h *holding) (*Lease, error) {
	if !lk.fair && lk.c.queued(lk.hash) {
		// Others of ours wait already: queue behind them.
		return lk.wait(ctx, h, 0)
	}
	l, err, done, holder := lk.firstLook(ctx, h)
	if done {
		return l, err
	}
	return lk.wait(ctx, h, holder)
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
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), m.lk.ttl)
	uerr := l.Unlock(uctx)
	cancel()
	if ferr != nil {
		return ferr
	}
	return uerr
}

// mutexProto is a mutex at Redis: acquire.lua (default mode) or
// fair_acquire.lua (Fair), release.lua, extend.lua, pttl.lua, fair_leave.lua.
type mutexProto struct{}

func (mutexProto) prepare(h *holding, _ int64) {
	lk, c := h.lk, &h.cmd
	c.join = "0"
	// Every release hands the lock to the first live waiter in line.
	c.setRelease(releaseScript, "evalsha", &releaseScript.sha, "3", &lk.keyArr[0], &lk.keyArr[1], &lk.keyArr[2],
		&h.token, &h.fenceStr, &lk.c.idleArg, &lk.keyArr[0], &lk.c.ps.arg)
	if lk.fair {
		c.setAcquire(fairAcquireScript, "evalsha", &fairAcquireScript.sha, "3", &lk.keyArr[0], &lk.keyArr[1], &lk.keyArr[2],
			&h.token, &lk.ttlArg, &lk.c.liveArg, &c.join, &lk.handover)
		return
	}
	c.setAcquire(acquireScript, "evalsha", &acquireScript.sha, "1", &lk.keyArr[0], &h.token, &lk.ttlArg)
}

func (mutexProto) joinLine(h *holding) {
	lk, c := h.lk, &h.cmd
	if lk.fair {
		c.join = "1"
		return
	}
	c.setAcquire(acquireScript, "evalsha", &acquireScript.sha, "3", &lk.keyArr[0], &lk.keyArr[1], &lk.keyArr[2],
		&h.token, &lk.ttlArg, &lk.c.liveArg, &lk.handover)
}

func (mutexProto) extend(h *holding, ttl string) call {
	return call{extendScript, h.lk.keyArr[:1], []any{h.token, ttl}}
}

func (mutexProto) pttl(h *holding) call {
	return call{pttlScript, h.lk.keyArr[:1], []any{h.token}}
}

func (mutexProto) giveBack(ctx context.Context, lk *lock, token string) error {
	v, err := fairLeaveScript.run(ctx, lk.c.drv, lk.scriptKeys(), token)
	if err != nil {
		return err
	}
	if r, ok := v.([]any); ok && len(r) == 2 && r[0] == int64(1) {
		// It had been handed to token: release it (to the next in line).
		if err := lk.c.pubsubReady(ctx); err != nil {
			return err
		}
		f, _ := r[1].(int64)
		_, err = releaseScript.run(ctx, lk.c.drv, lk.scriptKeys(), token, formatUint(uint64(f)), lk.c.idleArg, lk.hash, lk.c.ps.arg)
	}
	return err
}

// passMargin is the least a holder's lease must have left for it to be
// passed on, for each record that must land before the new holder's (its
// own, and those still in flight ahead of it: see passOn): the new holder
// relies on it until the pass is recorded.
const passMargin = 50 * time.Millisecond
