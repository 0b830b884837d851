package dlock_test

// Each test here fails when one safety mechanism of the engine is removed,
// which no other test noticed: internal/mutate/mutants.txt names the
// mutant each one kills (make mutate).

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faults"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/wire"
	"github.com/redis/go-redis/v9"
)

// TestLeaseDatedFromAcquireSend: the acquire's reply comes late, after
// Redis granted the lock and started its TTL. The lease counts from when
// the request was sent, so its context has ended by the time the key
// expires at Redis and another Client takes the lock.
func TestLeaseDatedFromAcquireSend(t *testing.T) {
	s := redistest.Start(t)
	const delay = 600 * time.Millisecond
	c, in := faultyClient(t, s, faults.Rule{Script: "acquire", Via: faults.Single, Kind: faults.DelayReply, Calls: []int{1}, Min: delay, Max: delay})
	other, _ := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	const name = "late-reply"
	l, err := c.Mutex(name, dlock.TTL(time.Second), dlock.NoRenew()).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if in.Stats()["acquire delay-reply single"] != 1 {
		t.Fatalf("the acquire's reply was not delayed: %s", in.Summary())
	}
	endedBeforeTaken(t, ctx, other, name, l)
}

// TestLateGrantReleased: the acquire is held back on its way to Redis
// until after the caller gave up (and after the give-back that follows at
// once, which finds nothing to give back). Redis then grants it: the grant's
// reply comes to nobody, and the lock must be released when it comes, not
// left to its TTL.
func TestLateGrantReleased(t *testing.T) {
	s := redistest.Start(t)
	c, in := faultyClient(t, s, faults.Rule{Script: "acquire", Via: faults.Single, Kind: faults.DelayWrite, Calls: []int{1}, Min: 500 * time.Millisecond, Max: 500 * time.Millisecond})
	rdb := s.Client(t)
	ctx := ctxT(t, 30*time.Second)
	const name = "late-grant"
	tctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err := c.Mutex(name, dlock.TTL(time.Minute)).TryLock(tctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("TryLock whose ctx ended before the reply: %v, want context.DeadlineExceeded", err)
	}
	key := wire.HashKey(wire.DefaultPrefix, name)
	// The fence field stays after a release: it shows the grant happened.
	waitFor(t, ctx, "the held-back acquire run at Redis", func() bool { return rdb.HExists(ctx, key, wire.FieldFence).Val() })
	if in.Stats()["acquire delay-write single"] != 1 {
		t.Fatalf("the acquire was not held back: %s", in.Summary())
	}
	waitFor(t, ctx, "the late grant released (its TTL is a minute)", func() bool { return owner(ctx, rdb, name) == "" })
}

// TestRenewalFindingKeyGoneEndsLease: the key of a renewed lease is deleted
// right after it was granted. The next renewal finds it gone and ends the
// lease at once: its context ends within two renewal periods, well before
// the deadline the grant gave it.
func TestRenewalFindingKeyGoneEndsLease(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	const ttl = 4500 * time.Millisecond // renewed every 1.5s
	const name = "deleted"
	l, err := c.Mutex(name, dlock.TTL(ttl)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.Del(ctx, wire.HashKey(wire.DefaultPrefix, name)).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Context().Done():
	case <-time.After(2 * ttl / 3):
		t.Fatalf("the lease context is live %v after its key was deleted: the renewal did not end it", 2*ttl/3)
	}
	if cause := context.Cause(l.Context()); !errors.Is(cause, dlock.ErrLockLost) {
		t.Fatalf("cause %v, want ErrLockLost", cause)
	}
	if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Unlock: %v, want ErrLockLost", err)
	}
}

// TestRetriedReleaseAfterHandOver: a release runs and hands the lock to a
// waiter of another Client, but its reply is lost. The release is sent
// again (by Unlock itself, and by a later Unlock): each must say success
// and leave the new owner alone; release.lua itself answers a retry with
// "already released or handed over by this holding", as docs/PROTOCOL.md
// promises any client.
func TestRetriedReleaseAfterHandOver(t *testing.T) {
	s := redistest.Start(t)
	c, in := faultyClient(t, s, faults.Rule{Script: "release", Kind: faults.LoseReply, Calls: []int{1}})
	other, rdb := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	const name = "retry-handover"
	keys := wire.KeysOf(wire.DefaultPrefix, name)
	a, err := c.Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := async(t, ctx, other.Mutex(name).Lock)
	waitLine(t, ctx, rdb, keys.Hash, 1)
	if err := a.Unlock(ctx); err != nil {
		t.Fatalf("Unlock whose release's reply was lost (it sends it again): %v, want nil", err)
	}
	if in.Stats()["release lose-reply single"] != 1 {
		t.Fatalf("the release's reply was not lost: %s", in.Summary())
	}
	b, err := got()
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Unlock(ctx); err != nil {
		t.Fatalf("retried Unlock after a hand-over: %v, want nil", err)
	}
	release := redis.NewScript(wire.Release.Src)
	code, err := release.Run(ctx, rdb, []string{keys.Hash, keys.Line, keys.Waiters}, a.Token(), a.Fence(), 600000, keys.Hash).Int()
	if err != nil || code != wire.ReleaseAgain {
		t.Fatalf("release.lua retried after its hand-over: %d, %v; want %d", code, err, wire.ReleaseAgain)
	}
	if o := owner(ctx, rdb, name); o != b.Token() {
		t.Fatalf("owner %q after the retries, want the waiter it was handed to", o)
	}
	if _, err := b.TTL(ctx); err != nil || !stillValid(b) {
		t.Fatalf("the new owner's lease was disturbed: %v", err)
	}
	if err := b.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestForeignKeysRefused: every primitive, in every mode, refuses a key
// that is not a dlock lock (a string, a plain hash, a hash naming another
// kind) by name, whether it tries once or waits, and leaves it as it was.
func TestForeignKeysRefused(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	foreign := []struct {
		name string
		set  func(key string) error
	}{
		{"string", func(key string) error { return rdb.Set(ctx, key, "precious", 0).Err() }},
		{"hash", func(key string) error { return rdb.HSet(ctx, key, "field", "precious").Err() }},
		{"kind", func(key string) error { return rdb.HSet(ctx, key, wire.FieldKind, "queue").Err() }},
	}
	for _, p := range exclusives {
		for _, f := range foreign {
			name := "foreign-" + p.kind + "-" + f.name
			keys := wire.KeysOf(wire.DefaultPrefix, name)
			if err := f.set(keys.Hash); err != nil {
				t.Fatal(err)
			}
			before := rdb.Dump(ctx, keys.Hash).Val()
			for _, try := range []struct {
				how  string
				lock func(context.Context) (*dlock.Lease, error)
			}{{"once", p.jumpAheadOfWait(c, name)}, {"waiting", p.wait(c, name)}} {
				// The refusal is at once; a bound on the wait only stops a
				// Lock that took the key from waiting for itself.
				tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				l, err := try.lock(tctx)
				cancel()
				if !errors.Is(err, dlock.ErrForeignKey) || !strings.Contains(err.Error(), keys.Hash) {
					t.Errorf("%s on a foreign %s, %s: %v, %v; want ErrForeignKey naming %s", p.kind, f.name, try.how, l, err, keys.Hash)
				}
			}
			if after := rdb.Dump(ctx, keys.Hash).Val(); after != before {
				t.Errorf("%s changed the foreign %s", p.kind, f.name)
			}
			if ttl := rdb.PTTL(ctx, keys.Hash).Val(); ttl != -1 {
				t.Errorf("%s gave the foreign %s an expiry (%v)", p.kind, f.name, ttl)
			}
			if n := rdb.Exists(ctx, keys.Line, keys.Waiters, keys.Holders).Val(); n != 0 {
				t.Errorf("%s on a foreign %s left %d keys of a line or holders", p.kind, f.name, n)
			}
		}
	}
}

// TestSemaphoreStateOutlivesItsHolders: a semaphore's (and an RWMutex's)
// fence counter and size live on for the idle period after the last lease,
// as a mutex's fence counter does, not just as long as the leases.
func TestSemaphoreStateOutlivesItsHolders(t *testing.T) {
	s := redistest.Start(t)
	const idle = time.Hour
	c, rdb := newClient(t, s, dlock.WithIdleExpiry(idle))
	ctx := ctxT(t, 10*time.Second)
	for _, p := range []struct {
		name, size string
		lock       func(context.Context) (*dlock.Lease, error)
	}{
		{"idle-semaphore", "2", func(ctx context.Context) (*dlock.Lease, error) {
			return c.Semaphore("idle-semaphore", 2, dlock.TTL(2*time.Second)).Acquire(ctx, 1)
		}},
		{"idle-rwmutex", "", c.RWMutex("idle-rwmutex", dlock.TTL(2*time.Second)).Lock},
	} {
		l, err := p.lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		key := wire.HashKey(wire.DefaultPrefix, p.name)
		if ttl := rdb.PTTL(ctx, key).Val(); ttl < idle-time.Minute || ttl > idle+time.Minute {
			t.Errorf("%s: its state expires in %v, want the idle period (%v) after its last lease", p.name, ttl, idle)
		}
		st := rdb.HGetAll(ctx, key).Val()
		if st[wire.FieldFence] != strconv.FormatUint(l.Fence(), 10) || (p.size != "" && st[wire.FieldSize] != p.size) {
			t.Errorf("%s: state after its last lease %v, want fence %d and size %s", p.name, st, l.Fence(), p.size)
		}
	}
}

// TestExtendOfATakenLockChangesNothing: a lease still believed valid whose
// lock was taken by another Client (its key expired early, as when the
// server's clock jumps). Extend reaches Redis, finds the lock not its own,
// says ErrLockLost and leaves the new holder's owner and expiry alone; so
// does Unlock, of another such lease. And a lease whose key is gone
// altogether (deleted: a restart without persistence) is not made again by
// Extend. On R and C too (siteChecks).
func TestExtendOfATakenLockChangesNothing(t *testing.T) { extendOfATakenLock(t, startS(t)) }

func extendOfATakenLock(t *testing.T, site *site) {
	c1, rdb := site.client(t)
	c2, _ := site.client(t)
	ctx := ctxT(t, 20*time.Second)
	for _, stale := range []struct {
		call string
		do   func(*dlock.Lease) error
	}{
		{"Extend", func(l *dlock.Lease) error { return l.Extend(ctx, time.Minute) }},
		{"Unlock", func(l *dlock.Lease) error { return l.Unlock(ctx) }},
	} {
		name := "taken-" + stale.call
		key := wire.HashKey(wire.DefaultPrefix, name)
		old, err := c1.Mutex(name, dlock.TTL(10*time.Second)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rdb.PExpire(ctx, key, time.Millisecond) // the clock jumped
		waitFor(t, ctx, "the key expired early", func() bool { return rdb.Exists(ctx, key).Val() == 0 })
		cur, err := c2.Mutex(name, dlock.TTL(5*time.Second)).TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !stillValid(old) {
			t.Fatalf("the old lease ended before %s: the test does not reach Redis with it", stale.call)
		}
		if err := stale.do(old); !errors.Is(err, dlock.ErrLockLost) {
			t.Fatalf("%s of a lock taken by another Client: %v, want ErrLockLost", stale.call, err)
		}
		if cause := context.Cause(old.Context()); stale.call == "Extend" && !errors.Is(cause, dlock.ErrLockLost) {
			t.Fatalf("the old lease's context after Extend: %v, want ErrLockLost", cause)
		}
		if ttl := rdb.PTTL(ctx, key).Val(); ttl > 5*time.Second {
			t.Fatalf("the new holder's lock now expires in %v: the stale %s moved it", ttl, stale.call)
		}
		if o := owner(ctx, rdb, name); o != cur.Token() {
			t.Fatalf("owner %q after the stale %s, want the new holder", o, stale.call)
		}
		_ = cur.Unlock(ctx)
	}

	const gone = "gone"
	goneKey := wire.HashKey(wire.DefaultPrefix, gone)
	l, err := c1.Mutex(gone, dlock.TTL(10*time.Second), dlock.NoRenew()).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rdb.Del(ctx, goneKey)
	if err := l.Extend(ctx, time.Minute); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Extend of a lease whose key was deleted: %v, want ErrLockLost", err)
	}
	if n := rdb.Exists(ctx, goneKey).Val(); n != 0 {
		t.Fatalf("Extend made the deleted key again (owner %q)", owner(ctx, rdb, gone))
	}
}

// TestPassOfATakenLock: a holder whose lock was taken behind its back (the
// owner field now names another token, the fence unchanged) passes it to
// its Client's next waiter. pass.lua must refuse: the holder's lease is
// lost and the other owner is left alone. The waiter either took the pass
// before the refusal came back (its lease is then lost too) or after it
// (it starts over with a fresh token and waits in line, and gets the lock
// once the other owner lets go).
func TestPassOfATakenLock(t *testing.T) {
	s := redistest.Start(t)
	cs, rdb := newClients(t, s, 2)
	ctx := ctxT(t, 20*time.Second)
	const name = "pass-taken"
	key := wire.HashKey(wire.DefaultPrefix, name)
	a, leases := inTurn(t, ctx, cs, rdb, name)
	// The other owner holds on (no expiry) until the test lets it go.
	if err := rdb.HSet(ctx, key, wire.FieldOwner, "another-token").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Persist(ctx, key).Err(); err != nil {
		t.Fatal(err)
	}
	if err := a.Unlock(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Unlock of a lease whose lock was taken, passing it on: %v, want ErrLockLost", err)
	}
	if o := owner(ctx, rdb, name); o != "another-token" {
		t.Fatalf("owner %q after the refused pass, want the other owner left alone", o)
	}
	// The pass taken before its refusal came back: a lease that ends lost.
	passed := func(w *dlock.Lease) {
		t.Helper()
		select {
		case <-w.Context().Done():
		case <-time.After(5 * time.Second):
			t.Fatal("the lease passed over a lock taken by another owner did not end")
		}
		if cause := context.Cause(w.Context()); !errors.Is(cause, dlock.ErrLockLost) {
			t.Fatalf("passed lease ended with %v, want ErrLockLost", cause)
		}
		if err := w.Unlock(ctx); !errors.Is(err, dlock.ErrLockLost) {
			t.Fatalf("Unlock of the lost passed lease: %v, want ErrLockLost", err)
		}
	}
	var w *dlock.Lease
	select {
	case w = <-leases:
	case <-time.After(time.Second):
	}
	if w != nil {
		if w.Fence() != a.Fence()+1 {
			t.Fatalf("fence %d after %d while another owner holds the lock: not the pass, and not the other owner's", w.Fence(), a.Fence())
		}
		passed(w)
		if o := owner(ctx, rdb, name); o != "another-token" {
			t.Fatalf("owner %q, want the other owner left alone", o)
		}
		return
	}
	// No lease yet: the waiter took the pass only after its refusal, and
	// waits on in line while the other owner holds (or, on a slow machine,
	// its Lock is still returning the passed lease).
	if o := owner(ctx, rdb, name); o != "another-token" {
		t.Fatalf("owner %q while the waiter waits on, want the other owner left alone", o)
	}
	if err := rdb.Del(ctx, key).Err(); err != nil { // the other owner lets go
		t.Fatal(err)
	}
	w = <-leases
	if w == nil {
		t.FailNow()
	}
	if w.Fence() == a.Fence()+1 {
		t.Log("the passed lease came late")
		passed(w)
		return
	}
	t.Log("the waiter took the pass after its refusal and waited on")
	if w.Fence() <= a.Fence()+1 {
		t.Fatalf("fence %d after %d: the waiter's own grant must be above the pass's", w.Fence(), a.Fence())
	}
	if o := owner(ctx, rdb, name); o != w.Token() {
		t.Fatalf("owner %q, want the waiter's fresh token %q", o, w.Token())
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestReentrancyOnlyIntoTheSameLock: a Lock re-enters a holding found in
// its ctx only if it is this Client's, of this name and of this kind; any
// other lease in the ctx is no licence to skip Redis.
func TestReentrancyOnlyIntoTheSameLock(t *testing.T) {
	s := redistest.Start(t)
	cs, _ := newClients(t, s, 2)
	c := cs[0]
	ctx := ctxT(t, 10*time.Second)
	held, err := c.Mutex("re-a").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock(ctx)
	if l, err := cs[1].Mutex("re-a").TryLock(held.Context()); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("another Client's TryLock under the lease: %v, %v; want ErrNotObtained", l, err)
	}
	other, err := c.Mutex("re-b").TryLock(held.Context())
	if err != nil {
		t.Fatal(err)
	}
	if other.Token() == held.Token() {
		t.Fatal("a Lock of another name re-entered the lease in its ctx")
	}
	_ = other.Unlock(ctx)
	// A name is one kind of lock: another kind under the lease is refused
	// at Redis, not let in through the lease.
	for _, try := range []func(context.Context) (*dlock.Lease, error){
		c.RWMutex("re-a").TryRLock, c.RWMutex("re-a").TryLock, acquire1(c, "re-a"),
	} {
		if l, err := try(held.Context()); !errors.Is(err, dlock.ErrForeignKey) {
			t.Fatalf("another kind of lock of the same name under the lease: %v, %v; want ErrForeignKey", l, err)
		}
	}
	rw, err := c.RWMutex("re-c").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rw.Unlock(ctx)
	if l, err := c.Mutex("re-c").TryLock(rw.Context()); !errors.Is(err, dlock.ErrForeignKey) {
		t.Fatalf("a Mutex under an RWMutex lease of the same name: %v, %v; want ErrForeignKey", l, err)
	}
}

// neverLivePast watches l's context from one goroutine that never yields
// (GOMAXPROCS 1 meanwhile), so no timer can run while it looks: the
// context must end by itself once bound has passed, not when a timer (the
// watchdog's, a record's) gets round to ending it. bound must be no earlier
// than the lease's deadline. It returns once the context has ended.
func neverLivePast(t *testing.T, l *dlock.Lease, bound time.Time) {
	t.Helper()
	ctx := l.Context()
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for {
		now := time.Now()
		done := false
		select {
		case <-ctx.Done():
			done = true
		default:
		}
		live := !done && ctx.Err() == nil
		if live && !now.Before(bound) {
			t.Fatalf("the lease context was live %v past a bound on its deadline", now.Sub(bound))
		}
		if !live {
			return
		}
	}
}

// TestLeaseContextEndsAtItsDeadline: Done and Err of a lease context check
// the deadline themselves, so a holder that looks after its deadline (as
// one resuming from a pause does, before any timer has fired) never sees a
// live lease. A lease is valid until its acquire's send + TTL − 1%, so no
// later than that long after Lock returned.
func TestLeaseContextEndsAtItsDeadline(t *testing.T) {
	s := redistest.Start(t)
	c, _ := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	const ttl = 200 * time.Millisecond
	for i := range 5 {
		l, err := c.Mutex("deadline-"+strconv.Itoa(i), dlock.TTL(ttl), dlock.NoRenew()).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		neverLivePast(t, l, time.Now().Add(ttl-ttl/100)) // sent before now, valid for TTL − 1% from then
		if cause := context.Cause(l.Context()); !errors.Is(cause, dlock.ErrLockLost) {
			t.Fatalf("cause %v, want ErrLockLost", cause)
		}
	}
}

// TestPassedLeaseLivesOnThePassersDeadline: a lease passed within a Client
// whose record never reaches Redis lives no longer than the passer's lease
// would have, though its own TTL from the pass would reach further.
func TestPassedLeaseLivesOnThePassersDeadline(t *testing.T) {
	s := redistest.Start(t)
	// The record waits until after the passer's deadline, and a send whose
	// ctx has ended is never made.
	cs, _, rdb := slowRecords(t, s, 2*time.Second)
	ctx := ctxT(t, 30*time.Second)
	const ttl = 600 * time.Millisecond
	for i := range 3 {
		name := "inherited-" + strconv.Itoa(i)
		a, passed := inTurn(t, ctx, cs, rdb, name, dlock.TTL(ttl), dlock.NoRenew())
		if err := a.Extend(ctx, ttl); err != nil { // the passer's deadline: TTL − 1% from its send
			t.Fatal(err)
		}
		bound := time.Now().Add(ttl - ttl/100)
		time.Sleep(ttl / 2) // the passer uses half its lease: the other half is what it passes on
		w, unlocked := unlockPassing(t, ctx, a, passed)
		neverLivePast(t, w, bound)
		// The passer held the lock until it unlocked: its Unlock reports the
		// record's failure, not a lost lease.
		if err := <-unlocked; err == nil || errors.Is(err, dlock.ErrLockLost) {
			t.Fatalf("the passer's Unlock: %v, want the record's failure (the pass was never recorded)", err)
		}
		_ = w.Unlock(ctx)
	}
}

// unlockPassing unlocks a, which passes the lock to the waiter inTurn
// queued behind it (whose Lock result comes on leases), and returns that
// waiter's lease and, when it comes, a's Unlock result.
func unlockPassing(t *testing.T, ctx context.Context, a *dlock.Lease, leases <-chan *dlock.Lease) (*dlock.Lease, <-chan error) {
	t.Helper()
	unlocked := make(chan error, 1)
	go func() { unlocked <- a.Unlock(ctx) }()
	w := <-leases
	if w == nil {
		t.FailNow()
	}
	return w, unlocked
}

// TestPlacesInLine: a place in a lock's line counts while it is live, and
// not after. A Fair newcomer does not take a free lock ahead of a live
// place; a place that lapsed at the head of the line is dropped when the
// lock is free; a release skips a lapsed place and hands the lock to the
// live waiter behind it. (The places are a waiter's that never refreshes
// them, as a killed process leaves them.)
func TestPlacesInLine(t *testing.T) {
	s := redistest.Start(t)
	cs, rdb := newClients(t, s, 2)
	c := cs[0]
	ctx := ctxT(t, 20*time.Second)
	ghost := func(name string, live time.Duration) {
		t.Helper()
		keys := wire.KeysOf(wire.DefaultPrefix, name)
		w := wire.Waiter{Deadline: rdb.Time(ctx).Val().Add(live).UnixMilli(), TTL: 10000, Channel: wire.HandOverChannel(wire.DefaultPrefix, name, "ghost")}
		if err := rdb.RPush(ctx, keys.Line, "ghost").Err(); err != nil {
			t.Fatal(err)
		}
		if err := rdb.HSet(ctx, keys.Waiters, "ghost", w.Entry()).Err(); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("fair newcomer behind a live place", func(t *testing.T) {
		// As after a holder's lease ran out while a waiter had its place:
		// the lock is free, and the waiter comes first.
		const name = "places-live"
		ghost(name, 10*time.Second)
		if l, err := c.Mutex(name, dlock.Fair()).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
			t.Fatalf("a Fair TryLock ahead of a live place in line: %v, %v; want ErrNotObtained", l, err)
		}
		if head := rdb.LIndex(ctx, wire.KeysOf(wire.DefaultPrefix, name).Line, 0).Val(); head != "ghost" {
			t.Fatalf("the live place is gone from the head of the line (head %q)", head)
		}
	})
	t.Run("fair lapsed head dropped", func(t *testing.T) {
		const name = "places-lapsed"
		ghost(name, -time.Second)
		l, err := c.Mutex(name, dlock.Fair()).TryLock(ctx)
		if err != nil {
			t.Fatalf("a Fair TryLock of a free lock behind a lapsed place: %v", err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("release skips a lapsed place", func(t *testing.T) {
		const name = "places-release"
		key := wire.HashKey(wire.DefaultPrefix, name)
		holder, err := c.Mutex(name).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ghost(name, -time.Second)
		got := async(t, ctx, cs[1].Mutex(name).Lock)
		waitLine(t, ctx, rdb, key, 2) // the live waiter behind the lapsed place
		if err := holder.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if o := owner(ctx, rdb, name); o == "ghost" || o == "" {
			t.Fatalf("right after the release the owner is %q, want the live waiter (handed the lock)", o)
		}
		b, err := got()
		if err != nil {
			t.Fatal(err)
		}
		if o, p := owner(ctx, rdb, name), rdb.HGet(ctx, key, wire.FieldHandedFrom).Val(); o != b.Token() || p != strconv.FormatUint(holder.Fence(), 10) {
			t.Fatalf("owner %q handed over from fence %s; want the waiter, from %d", o, p, holder.Fence())
		}
		_ = b.Unlock(ctx)
	})
}

// TestUnlockOfAPassedLeaseWaitsForItsRecord: a lease passed within a Client
// is unlocked while the record of its pass is still on its way to Redis.
// Calls about one holding are made one at a time: the Unlock waits for
// the record, then releases the lock as its own. (A release sent before
// the record would find the passer's token at Redis and report a loss.)
func TestUnlockOfAPassedLeaseWaitsForItsRecord(t *testing.T) {
	s := redistest.Start(t)
	cs, in, rdb := slowRecords(t, s, 200*time.Millisecond)
	ctx := ctxT(t, 20*time.Second)
	const name = "unlock-pending"
	a, passed := inTurn(t, ctx, cs, rdb, name)
	w, unlocked := unlockPassing(t, ctx, a, passed)
	if !in.WaitInFlight(time.Second, func(k faults.Call) bool { return k.Script == "pass" }) {
		t.Fatal("the record is not in flight: the test does not unlock a pending lease")
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatalf("Unlock of a passed lease while its record is in flight: %v, want nil", err)
	}
	if err := <-unlocked; err != nil {
		t.Fatalf("the passer's Unlock: %v", err)
	}
	if o := owner(ctx, rdb, name); o != "" {
		t.Fatalf("owner %q left at Redis after both Unlocks", o)
	}
}

// TestUnlockWithEndedCtxReleasesInTheBackground: defer l.Unlock(reqCtx)
// after the request ended. Unlock reports the ctx's error, ends the lease,
// and releases the lock in the background, long before its TTL; a later
// Unlock reports that it went well.
func TestUnlockWithEndedCtxReleasesInTheBackground(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	const name = "ended-unlock"
	l, err := c.Mutex(name, dlock.TTL(time.Minute)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if err := l.Unlock(ended); !errors.Is(err, context.Canceled) {
		t.Fatalf("Unlock with an ended ctx: %v, want context.Canceled", err)
	}
	if stillValid(l) {
		t.Fatal("the lease context outlived its Unlock")
	}
	waitFor(t, ctx, "the lock released in the background (its TTL is a minute)", func() bool { return owner(ctx, rdb, name) == "" })
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("a later Unlock: %v, want nil (released)", err)
	}
}

// TestCloseRacingAGrant: Close runs while a Lock's acquire is on its way
// back with a grant. Close does not know the holding (it was not live yet);
// the Lock call that gets the grant releases it and returns ErrClosed.
func TestCloseRacingAGrant(t *testing.T) {
	s := redistest.Start(t)
	c, in := faultyClient(t, s, faults.Rule{Script: "acquire", Via: faults.Single, Kind: faults.DelayReply, Calls: []int{1}, Min: 300 * time.Millisecond, Max: 300 * time.Millisecond})
	rdb := s.Client(t)
	ctx := ctxT(t, 20*time.Second)
	const name = "close-race"
	got := async(t, ctx, c.Mutex(name, dlock.TTL(time.Minute)).Lock)
	if !in.WaitInFlight(5*time.Second, func(k faults.Call) bool { return k.Script == "acquire" }) {
		t.Fatal("no acquire in flight")
	}
	waitFor(t, ctx, "the grant at Redis", func() bool { return owner(ctx, rdb, name) != "" })
	_ = c.Close()
	if l, err := got(); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("Lock granted as Close ran: %v, %v; want ErrClosed", l, err)
	}
	if o := owner(ctx, rdb, name); o != "" {
		t.Fatalf("owner %q left at Redis after Close and the Lock returned (TTL a minute)", o)
	}
}

// TestWaiterNotStuckBehindRefusedSubscriptions: a server that refuses every
// subscription (here SSUBSCRIBE is renamed away; on a Cluster, a slot being
// failed over does so). A waiter goes on without its subscriptions after a
// bound, takes its place in line and finds the hand-over by looking.
func TestWaiterNotStuckBehindRefusedSubscriptions(t *testing.T) {
	s := redistest.Start(t, redistest.Options{Args: []string{"--rename-command", "SSUBSCRIBE", ""}})
	cs, rdb := newClients(t, s, 2)
	ctx := ctxT(t, 20*time.Second)
	const name = "unsubscribed"
	holder, err := cs[0].Mutex(name).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := async(t, ctx, cs[1].Mutex(name).Lock)
	waitLine(t, ctx, rdb, wire.HashKey(wire.DefaultPrefix, name), 1)
	if err := holder.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	l, err := got()
	if err != nil {
		t.Fatalf("the waiter without subscriptions: %v", err)
	}
	if dlock.HandOversHeard(cs[1]) != 0 {
		t.Fatal("a hand-over message was heard: the subscriptions were not refused")
	}
	_ = l.Unlock(ctx)
}

// TestFault3ReplyPastValidity: an acquire granted at Redis whose reply
// comes after the lease it granted may have expired is not obtained:
// TryLock fails and gives the lock back, and a Lock goes on to a grant of
// its own that is valid when it returns.
func TestFault3ReplyPastValidity(t *testing.T) {
	s := redistest.Start(t)
	const ttl, delay = 500 * time.Millisecond, 700 * time.Millisecond
	c, in := faultyClient(t, s, faults.Rule{Script: "acquire", Via: faults.Single, Kind: faults.DelayReply, Calls: []int{1, 2}, Min: delay, Max: delay})
	rdb := s.Client(t)
	ctx := ctxT(t, 20*time.Second)
	l, err := c.Mutex("late3", dlock.TTL(ttl)).TryLock(ctx)
	if err == nil {
		t.Fatalf("TryLock whose grant's reply came %v after it, past a %v TTL, obtained the lock (context ended: %v)", delay, ttl, l.Context().Err())
	}
	if in.Stats()["acquire delay-reply single"] != 1 {
		t.Fatalf("the acquire's reply was not delayed: %s", in.Summary())
	}
	if o := owner(ctx, rdb, "late3"); o != "" {
		t.Fatalf("the late grant was not given back: owner %q", o)
	}
	l, err = c.Mutex("late3", dlock.TTL(ttl)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Context().Err(); err != nil {
		t.Fatalf("Lock returned a lease that had ended: %v", context.Cause(l.Context()))
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
