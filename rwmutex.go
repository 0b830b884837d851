package dlock

import (
	"context"
	"strconv"

	"github.com/dlock-go/dlock/internal/wire"
)

var rwWriterArg = strconv.FormatInt(wire.RWWriter, 10)

// An RWMutex is a distributed reader/writer lock: many readers or one
// writer. It is a semaphore underneath (a reader takes one permit, a writer
// all of them) with all of its state in one Cluster hash slot. Each reader
// holds its own Lease: a reader that crashed frees its share when its own
// lease runs out, not when the last reader leaves.
//
// Waiters are served in arrival order, so once a writer waits, readers that
// come after it wait behind it (writers are not starved), and the readers
// waiting behind a writer all enter together when it unlocks.
//
// Reentrancy: RLock or Lock with a ctx that descends from the Context of a
// write lease of this lock re-enters it; RLock under a read lease re-enters
// that read lease. Lock under a read lease is refused with ErrInvalidArgument
// rather than waiting forever for itself (there are no upgrades).
type RWMutex struct {
	r, w lock
}

// RWMutex returns the read-write lock called name. Names are as for Mutex;
// a name used by another primitive is reported as ErrForeignKey.
// LockOptions set the lease TTL and renewal; waiting is always in arrival
// order (Fair is implied).
func (c *Client) RWMutex(name string, opts ...LockOption) *RWMutex {
	rw := &RWMutex{}
	c.initLock(&rw.r, name, wire.KindRWMutex, opts)
	rw.r.sizeArg = rwWriterArg
	rw.w = rw.r // the write side shares the read side's strings
	rw.r.readSide, rw.r.nArg = true, "1"
	rw.w.nArg = rwWriterArg
	return rw
}

// Name returns the lock name.
func (rw *RWMutex) Name() string { return rw.r.name }

// RLock waits until it holds a read lease or ctx ends (then it returns an
// error that errors.Is ctx.Err()).
func (rw *RWMutex) RLock(ctx context.Context) (l *Lease, err error) {
	defer rw.r.c.obs.acquire(&ctx, &rw.r, callLock).end(&l, &err)
	return rw.r.lock(ctx, 1)
}

// TryRLock takes a read lease if no writer holds the lock or waits for it;
// otherwise it returns ErrNotObtained.
func (rw *RWMutex) TryRLock(ctx context.Context) (l *Lease, err error) {
	defer rw.r.c.obs.acquire(&ctx, &rw.r, callTry).end(&l, &err)
	return rw.r.tryLock(ctx)
}

// Lock waits until it holds the write lease or ctx ends (then it returns an
// error that errors.Is ctx.Err()).
func (rw *RWMutex) Lock(ctx context.Context) (l *Lease, err error) {
	defer rw.w.c.obs.acquire(&ctx, &rw.w, callLock).end(&l, &err)
	return rw.w.lock(ctx, wire.RWWriter)
}

// TryLock takes the write lease if nobody holds the lock or waits for it;
// otherwise it returns ErrNotObtained.
func (rw *RWMutex) TryLock(ctx context.Context) (l *Lease, err error) {
	defer rw.w.c.obs.acquire(&ctx, &rw.w, callTry).end(&l, &err)
	return rw.w.tryLock(ctx)
}

func (lk *lock) tryLock(ctx context.Context) (*Lease, error) {
	if l, err, done := lk.start(ctx); done {
		return l, err
	}
	return lk.try(ctx, 0)
}
