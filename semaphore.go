package dlock

import (
	"context"
	"strconv"

	"github.com/dlock-go/dlock/internal/wire"
)

// MaxSemaphoreSize is the largest semaphore size: permits are counted in
// Redis's Lua numbers, which are exact up to 2^53.
const MaxSemaphoreSize = wire.RWWriter

// A Semaphore is a distributed weighted semaphore of a fixed size: holders
// take n permits at a time, and at most size permits are held at once.
// Waiters are served strictly in arrival order, like
// golang.org/x/sync/semaphore: a request that does not fit yet keeps those
// behind it waiting, so a large request is not starved by small ones. Each
// holding of permits is a Lease, renewed by the watchdog; the permits of a
// holder that crashed come back when its lease runs out.
//
// Every client must give a name the same size. A semaphore in use (permits
// held, or waiters in line) with another size makes Acquire fail with
// ErrInvalidArgument; once nobody holds or waits, the next Acquire's size
// becomes the semaphore's.
//
// Leases of a semaphore do not re-enter: an Acquire with a ctx that descends
// from one of its leases asks for more permits like any other.
type Semaphore struct {
	lk   lock
	size int64
}

// Semaphore returns the semaphore called name with size permits. Names are
// as for Mutex; a name used by another primitive (a Mutex or an RWMutex) is
// reported as ErrForeignKey. LockOptions set the lease TTL and renewal;
// waiting is always in arrival order (Fair is implied).
func (c *Client) Semaphore(name string, size int64, opts ...LockOption) *Semaphore {
	s := &Semaphore{size: size}
	c.initLock(&s.lk, name, wire.KindSemaphore, opts)
	s.lk.sizeArg = strconv.FormatInt(size, 10)
	if s.lk.err == nil && (size < 1 || size > MaxSemaphoreSize) {
		s.lk.err = invalidf("semaphore size %d is not in 1..MaxSemaphoreSize (%d)", size, int64(MaxSemaphoreSize))
	}
	return s
}

// Name returns the semaphore's name.
func (s *Semaphore) Name() string { return s.lk.name }

// Size returns the number of permits.
func (s *Semaphore) Size() int64 { return s.size }

// Acquire waits until it holds n permits or ctx ends; then it returns an
// error that errors.Is ctx.Err(). The returned Lease holds the n permits until
// Unlock (or until it is lost).
func (s *Semaphore) Acquire(ctx context.Context, n int64) (l *Lease, err error) {
	defer s.lk.c.obs.acquire(&ctx, &s.lk, callLock).end(&l, &err)
	if err := s.check(n); err != nil {
		return nil, err
	}
	return s.lk.lock(ctx, n)
}

// TryAcquire takes n permits if they are free and nobody waits in line
// before it; otherwise it returns ErrNotObtained.
func (s *Semaphore) TryAcquire(ctx context.Context, n int64) (l *Lease, err error) {
	defer s.lk.c.obs.acquire(&ctx, &s.lk, callTry).end(&l, &err)
	if err := s.check(n); err != nil {
		return nil, err
	}
	if l, err, done := s.lk.start(ctx); done {
		return l, err
	}
	return s.lk.try(ctx, n)
}

func (s *Semaphore) check(n int64) error {
	if s.lk.err == nil && (n < 1 || n > s.size) {
		return nameErr(s.lk.name, invalidf("asked for %d permits of a semaphore of size %d: n must be in 1..%d", n, s.size, s.size))
	}
	return nil
}

// lock is Lock for the kinds whose waiters all wait in the line at Redis
// (semaphores, RWMutexes): a first look without a place, then the line.
func (lk *lock) lock(ctx context.Context, n int64) (*Lease, error) {
	if l, err, done := lk.start(ctx); done {
		return l, err
	}
	return lk.lockHolding(ctx, lk.newHolding(ctx, n))
}

// semProto is a semaphore (or an RWMutex) at Redis: every operation is
// sem.lua, whose first argument names it.
type semProto struct{}

func (semProto) prepare(h *holding, n int64) {
	lk, c := h.lk, &h.cmd
	c.join = "0"
	if lk.nArg != "" {
		c.nArg = lk.nArg
	} else {
		c.nArg = strconv.FormatInt(n, 10)
	}
	k := &lk.keyArr
	c.setAcquire(semScript, "evalsha", &semScript.sha, "4", &k[0], &k[1], &k[2], &k[3], wire.SemAcquire,
		&h.token, &lk.ttlArg, &lk.c.liveArg, &c.join, &lk.handover, &c.nArg, &lk.sizeArg, &lk.kind, &lk.c.idleArg, &lk.c.ps.arg)
	c.setRelease(semScript, "evalsha", &semScript.sha, "4", &k[0], &k[1], &k[2], &k[3], wire.SemRelease,
		&h.token, &lk.c.idleArg, &lk.c.ps.arg)
}

func (semProto) joinLine(h *holding) { h.cmd.join = "1" }

func (semProto) extend(h *holding, ttl string) call {
	return call{semScript, h.lk.scriptKeys(), []any{wire.SemExtend, h.token, ttl, h.c.idleArg}}
}

func (semProto) pttl(h *holding) call {
	return call{semScript, h.lk.scriptKeys(), []any{wire.SemPTTL, h.token}}
}

func (semProto) giveBack(ctx context.Context, lk *lock, token string) error {
	// sem.lua's leave releases the permits if they had been handed over
	// (and hands them on).
	if err := lk.c.pubsubReady(ctx); err != nil {
		return err
	}
	_, err := semScript.run(ctx, lk.c.drv, lk.scriptKeys(), wire.SemLeave, token, lk.c.idleArg, lk.c.ps.arg)
	return err
}
