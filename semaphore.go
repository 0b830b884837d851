package dlock

import (
	"context"
	"strconv"
)

// MaxSemaphoreSize is the largest semaphore size: permits are counted in
// Redis's Lua numbers, which are exact up to 2^53.
const MaxSemaphoreSize = 1 << 50

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
	m    Mutex
	size int64
}

// Semaphore returns the semaphore called name with size permits. Names are
// as for Mutex; a name used by another primitive (a Mutex or an RWMutex) is
// reported as ErrForeignKey. LockOptions set the lease TTL and renewal;
// waiting is always in arrival order (Fair is implied).
func (c *Client) Semaphore(name string, size int64, opts ...LockOption) *Semaphore {
	s := &Semaphore{size: size}
	c.initLock(&s.m, name, "semaphore", opts)
	s.m.sizeArg = strconv.FormatInt(size, 10)
	if s.m.err == nil && (size < 1 || size > MaxSemaphoreSize) {
		s.m.err = invalidf("semaphore size %d is not in 1..MaxSemaphoreSize (%d)", size, int64(MaxSemaphoreSize))
	}
	return s
}

// Name returns the semaphore's name.
func (s *Semaphore) Name() string { return s.m.name }

// Size returns the number of permits.
func (s *Semaphore) Size() int64 { return s.size }

// Acquire waits until it holds n permits or ctx ends; then it returns an
// error that errors.Is ctx.Err(). The returned Lease holds the n permits until
// Unlock (or until it is lost).
func (s *Semaphore) Acquire(ctx context.Context, n int64) (*Lease, error) {
	if err := s.check(n); err != nil {
		return nil, err
	}
	if l, err, done := s.m.start(ctx); done {
		return l, err
	}
	return s.m.lockFair(ctx, s.m.prepare(ctx, strconv.FormatInt(n, 10)))
}

// TryAcquire takes n permits if they are free and nobody waits in line
// before it; otherwise it returns ErrNotObtained.
func (s *Semaphore) TryAcquire(ctx context.Context, n int64) (*Lease, error) {
	if err := s.check(n); err != nil {
		return nil, err
	}
	if l, err, done := s.m.start(ctx); done {
		return l, err
	}
	return s.m.try(ctx, strconv.FormatInt(n, 10))
}

func (s *Semaphore) check(n int64) error {
	if s.m.err == nil && (n < 1 || n > s.size) {
		return nameErr(s.m.name, invalidf("asked for %d permits of a semaphore of size %d: n must be in 1..%d", n, s.size, s.size))
	}
	return nil
}
