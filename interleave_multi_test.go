package dlock_test

// The MultiLock kind of TestInterleavings (interleave_test.go): each lock
// call takes two or three names of a pool of four with one MultiLock (Lock
// or TryLock), or now and then one name with a Mutex (a MultiLock's names
// are ordinary mutexes, which exclude it and wait for it). The sets
// overlap, and the pool's names come in two hash tags, two names each: on a
// Cluster (TestInterleavingsCluster, whose tags put the two slots on two
// masters) the names of one tag are taken by one script, the others slot
// by slot; on one server every set is one script. Each
// check of the run is made per name: at most one lease believed valid holds
// a name, the fences of each name (FenceOf) rise in grant order, a lease
// believed valid owns each of its names at Redis (each name's hash names
// its token), and no name is left held once every caller returned. A
// reentrant Lock under a MultiLock's lease, of one of its names, must be
// refused rather than wait for that lease.

import (
	"context"
	"errors"
	"math/rand/v2"

	"github.com/dlock-go/dlock"
)

// ilMultiPool is the pool of names of a multi run; every byte a name may
// hold must survive keys, entries and channels.
var ilMultiPool = []string{"il,multi {a}:1", "il,multi {a}:2\n\xff", "il,multi {b}:1", "il,multi {b}:2 \xff"}

// multiLock makes the lock call of a multi run: a MultiLock of 2 or 3
// names of the pool, or (one call in six) a Mutex of one.
func (w *interleaving) multiLock(r *rand.Rand, ctx context.Context, ic *ilClient, opts []dlock.LockOption, try bool, me *ilLease) (*dlock.Lease, error) {
	perm := r.Perm(len(w.pool))
	if r.IntN(6) == 0 {
		m := ic.c.Mutex(w.pool[perm[0]], opts...)
		if try {
			me.via = "Mutex.TryLock"
			return m.TryLock(ctx)
		}
		me.via = "Mutex.Lock"
		return m.Lock(ctx)
	}
	names := make([]string, 2+r.IntN(2))
	for i := range names {
		names[i] = w.pool[perm[i]]
	}
	me.multi = true
	m := ic.c.MultiLock(names, opts...)
	if try {
		me.via = "MultiLock.TryLock"
		return m.TryLock(ctx)
	}
	me.via = "MultiLock.Lock"
	return m.Lock(ctx)
}

// reenterMulti locks one of the names of the MultiLock lease me again, under
// its context (ctx), with a Mutex or a MultiLock of ic (me's Client): a
// MultiLock re-enters nothing, so the call must be refused
// (ErrInvalidArgument), not wait for me, nor be granted while me holds it.
func (w *interleaving) reenterMulti(r *rand.Rand, ctx context.Context, ic *ilClient, me *ilLease) {
	name := me.names[r.IntN(len(me.names))]
	var l *dlock.Lease
	var err error
	what := "Mutex"
	if r.IntN(2) == 0 {
		l, err = ic.c.Mutex(name).Lock(ctx)
	} else {
		what = "MultiLock"
		names := []string{name}
		if other := w.pool[r.IntN(len(w.pool))]; other != name {
			names = append(names, other)
		}
		l, err = ic.c.MultiLock(names).Lock(ctx)
	}
	w.count("reenter " + what)
	switch {
	case l != nil:
		w.mu.Lock()
		w.failf("a %s.Lock of %q under the MultiLock lease %v that holds it returned a lease (token %s): it re-enters nothing", what, name, me, l.Token())
		w.mu.Unlock()
		w.expected(l.Unlock(context.Background()), "Unlock of a reentrant lock under a MultiLock lease")
	case errors.Is(err, dlock.ErrInvalidArgument):
		w.count("reenter refused")
	case errors.Is(err, dlock.ErrClosed), ctx.Err() != nil:
		// The Client closed, or the lease ended, or the call's ctx did.
	default:
		w.mu.Lock()
		w.failf("a %s.Lock of %q under the MultiLock lease %v that holds it: %v, want ErrInvalidArgument", what, name, me, err)
		w.mu.Unlock()
	}
}
