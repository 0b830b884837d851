package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// familyRoles are the child-process roles of the semaphore and RWMutex tests.
var familyRoles = map[string]func(*dlock.Client, *redis.Client, string) error{
	"sem-load": childSemLoad,
	"sem-hold": childSemHold,
	"rw-load":  childRWLoad,
	"rw-hold":  childRWHold,
}

func TestSemaphoreBasics(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	sem := c.Semaphore("pool", 3)
	a, err := sem.Acquire(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sem.TryAcquire(ctx, 2); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryAcquire(2) with 1 of 3 free: %v", err)
	}
	b, err := sem.TryAcquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if b.Fence() <= a.Fence() || a.Token() == b.Token() {
		t.Fatalf("second holding: fence %d after %d, tokens %q %q", b.Fence(), a.Fence(), a.Token(), b.Token())
	}
	if used, _ := rdb.HGet(ctx, "dlock:{pool}", "u").Int(); used != 3 {
		t.Fatalf("permits held at Redis = %d, want 3", used)
	}
	if ttl, err := a.TTL(ctx); err != nil || ttl <= 9*time.Second {
		t.Fatalf("TTL = %v, %v", ttl, err)
	}
	if err := a.Extend(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if ttl, err := a.TTL(ctx); err != nil || ttl <= 29*time.Second {
		t.Fatalf("TTL after Extend = %v, %v", ttl, err)
	}
	// A ctx from a lease does not re-enter a semaphore: it asks anew.
	if _, err := sem.TryAcquire(a.Context(), 1); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryAcquire under a lease of the full semaphore: %v", err)
	}
	for _, l := range []*dlock.Lease{a, b} {
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatalf("second Unlock: %v", err)
		}
	}
	if err := a.Extend(ctx, time.Minute); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Extend after Unlock: %v", err)
	}
	// Nothing held: only the hash with size and fence stays, for the idle period.
	if n := rdb.Exists(ctx, "dlock:{pool}:h", "dlock:{pool}:q", "dlock:{pool}:w").Val(); n != 0 {
		t.Fatalf("%d holder or line keys left behind", n)
	}
	if ttl := rdb.PTTL(ctx, "dlock:{pool}").Val(); ttl <= 0 || ttl > 10*time.Minute+time.Minute { // the idle period after the last lease (extended to 30s) would have ended
		t.Fatalf("idle semaphore key expiry %v", ttl)
	}
	full, err := sem.Acquire(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if full.Fence() <= b.Fence() {
		t.Fatalf("fence went back: %d after %d", full.Fence(), b.Fence())
	}
	_ = full.Unlock(ctx)
}

// TestSemaphoreFIFOMixedWeights: waiters are served in arrival order, and a
// large request at the head keeps smaller ones behind it waiting even when
// they would fit (it is not starved).
func TestSemaphoreFIFOMixedWeights(t *testing.T) {
	s := redistest.Start(t)
	cs, rdb := newClients(t, s, 3)
	ctx := ctxT(t, 30*time.Second)
	const size = 4
	first, err := cs[0].Semaphore("fifo", size).Acquire(ctx, size)
	if err != nil {
		t.Fatal(err)
	}
	weights := []int64{3, 1, 2, 4, 1, 1, 2, 3}
	type grant struct {
		i     int
		fence uint64
	}
	grants := make(chan grant, len(weights))
	var inside, most atomic.Int64
	var wg sync.WaitGroup
	for i, n := range weights {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := cs[i%len(cs)].Semaphore("fifo", size).Acquire(ctx, n)
			if err != nil {
				t.Error(err)
				return
			}
			v := inside.Add(n)
			for m := most.Load(); v > m && !most.CompareAndSwap(m, v); m = most.Load() {
			}
			grants <- grant{i, l.Fence()}
			time.Sleep(30 * time.Millisecond) // hold time
			inside.Add(-n)
			_ = l.Unlock(ctx)
		}()
		waitLine(t, ctx, rdb, "dlock:{fifo}", int64(i+1)) // arrival order is line order
	}
	// The head (3) does not fit while the first holder has all 4; a 1 would
	// not fit either, and must not jump the line.
	if _, err := cs[2].Semaphore("fifo", size).TryAcquire(ctx, 1); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryAcquire(1) with waiters in line: %v", err)
	}
	if err := first.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(grants)
	var got []grant
	for g := range grants {
		got = append(got, g)
	}
	if len(got) != len(weights) {
		t.FailNow()
	}
	sort.Slice(got, func(a, b int) bool { return got[a].fence < got[b].fence })
	for k, g := range got {
		if g.i != k {
			t.Fatalf("grant order by fence %v, want arrival order", got)
		}
	}
	if m := most.Load(); m > size || m < 3 {
		t.Fatalf("most permits held at once = %d (size %d)", m, size)
	}
}

// TestSemaphoreGivingUpHeadLetsOthersIn: a large waiter at the head that
// gives up (ctx ends) no longer blocks the smaller ones behind it.
func TestSemaphoreGivingUpHeadLetsOthersIn(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	sem := c.Semaphore("giveup", 2)
	held, err := sem.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	bigCtx, cancelBig := context.WithCancel(ctx)
	bigErr := make(chan error, 1)
	go func() {
		_, err := sem.Acquire(bigCtx, 2)
		bigErr <- err
	}()
	waitLine(t, ctx, rdb, "dlock:{giveup}", 1)
	small := lockedAt(t, ctx, func(ctx context.Context) (*dlock.Lease, error) { return sem.Acquire(ctx, 1) })
	waitLine(t, ctx, rdb, "dlock:{giveup}", 2)
	select {
	case <-small:
		t.Fatal("a small request passed the large one waiting at the head")
	case <-time.After(200 * time.Millisecond):
	}
	cancelBig()
	start := time.Now()
	if err := <-bigErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled Acquire: %v", err)
	}
	at, ok := <-small
	if !ok {
		t.FailNow()
	}
	// Leaving the line serves the next waiter at once, not at the liveness bound.
	if d := at.Sub(start); d > 500*time.Millisecond {
		t.Fatalf("small request got in %v after the head gave up", d)
	}
	_ = held.Unlock(ctx)
}

// TestSemaphoreNeverOversubscribed: 4 processes × 6 goroutines take random
// weights of a size-5 semaphore; a Redis counter of permits in use, kept
// inside the holdings, must never pass the size.
func TestSemaphoreNeverOversubscribed(t *testing.T) {
	s := redistest.Start(t)
	_, rdb := newClient(t, s)
	ctx := ctxT(t, 60*time.Second)
	const procs = 4
	var args []string
	for p := 0; p < procs; p++ {
		args = append(args, fmt.Sprintf("%d,6,15,5", p))
	}
	runChildren(t, "sem-load", s.Addr(), args)
	over, _ := rdb.Get(ctx, "sem:over").Int()
	most, _ := rdb.Get(ctx, "sem:most").Int()
	grants, _ := rdb.Get(ctx, "sem:grants").Int()
	if over != 0 {
		t.Fatalf("%d times more than 5 permits were in use (most %d)", over, most)
	}
	if grants != procs*6*15 {
		t.Fatalf("%d grants, want %d", grants, procs*6*15)
	}
	if most < 3 {
		t.Fatalf("at most %d permits in use at once: the semaphore did not share", most)
	}
	t.Logf("%d grants, at most %d of 5 permits in use", grants, most)
}

// childSemLoad: "id,goroutines,iterations,size". Each goroutine takes 1..3
// permits, adds them to sem:inuse, records overshoots, holds briefly, leaves.
func childSemLoad(c *dlock.Client, rdb *redis.Client, arg string) error {
	var id, gs, iters int
	var size int64
	if _, err := fmt.Sscanf(arg, "%d,%d,%d,%d", &id, &gs, &iters, &size); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	return inGoroutines(gs, func(g int) error {
		sem := c.Semaphore("load", size, dlock.TTL(5*time.Second))
		rng := rand.New(rand.NewPCG(uint64(id), uint64(g)))
		for i := 0; i < iters; i++ {
			n := 1 + rng.Int64N(3)
			l, err := sem.Acquire(ctx, n)
			if err != nil {
				return err
			}
			v := rdb.IncrBy(ctx, "sem:inuse", n).Val()
			if v > size {
				rdb.Incr(ctx, "sem:over")
			}
			rdb.Incr(ctx, "sem:grants")
			maxScript.Run(ctx, rdb, []string{"sem:most"}, v)
			time.Sleep(time.Duration(rng.IntN(2000)) * time.Microsecond) // load: hold time
			rdb.DecrBy(ctx, "sem:inuse", n)
			if err := l.Unlock(ctx); err != nil {
				return err
			}
		}
		return nil
	})
}

// maxScript raises KEYS[1] to ARGV[1] if it is higher.
var maxScript = redis.NewScript(`
local v = tonumber(redis.call('GET', KEYS[1]) or '0')
if tonumber(ARGV[1]) > v then redis.call('SET', KEYS[1], ARGV[1]) end
return 0`)

// childSemHold: "n,size,ttl". Take n permits, print "held", wait for EOF.
func childSemHold(c *dlock.Client, rdb *redis.Client, arg string) error {
	var n, size int64
	var ttl string
	if _, err := fmt.Sscanf(arg, "%d,%d,%s", &n, &size, &ttl); err != nil {
		return err
	}
	d, err := time.ParseDuration(ttl)
	if err != nil {
		return err
	}
	return holdUntilEOF(c.Semaphore("held", size, dlock.TTL(d)).Acquire(context.Background(), n))
}

// TestSemaphoreKilledHolderPermitsReturn: permits of a holder killed with
// SIGKILL come back at its TTL, while a live holder's stay held.
func TestSemaphoreKilledHolderPermitsReturn(t *testing.T) {
	s := redistest.Start(t)
	c, _ := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	sem := c.Semaphore("held", 4)
	live, err := sem.Acquire(ctx, 1) // renewed by the watchdog throughout
	if err != nil {
		t.Fatal(err)
	}
	cmd, _, out := startChild(t, "sem-hold", s.Addr(), "3,4,1s")
	expectLine(t, out, "held")
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	start := time.Now()
	l, err := sem.Acquire(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2500*time.Millisecond {
		t.Fatalf("the killed holder's permits came back after %v (TTL 1s)", d)
	}
	if _, err := sem.TryAcquire(ctx, 1); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("a fifth permit: %v (the live holder's must still count)", err)
	}
	if err := live.Unlock(ctx); err != nil {
		t.Fatalf("live holder lost its permit: %v", err)
	}
	_ = l.Unlock(ctx)
}

func TestSemaphoreBadInput(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 10*time.Second)
	for _, size := range []int64{0, -1, dlock.MaxSemaphoreSize + 1} {
		_, err := c.Semaphore("bad", size).Acquire(ctx, 1)
		if !errors.Is(err, dlock.ErrInvalidArgument) || !strings.Contains(err.Error(), fmt.Sprint(size)) {
			t.Fatalf("size %d: %v", size, err)
		}
	}
	sem := c.Semaphore("sized", 3)
	for _, n := range []int64{0, -2, 4} {
		if _, err := sem.Acquire(ctx, n); !errors.Is(err, dlock.ErrInvalidArgument) || !strings.Contains(err.Error(), fmt.Sprint(n)) {
			t.Fatalf("Acquire(%d) of 3: %v", n, err)
		}
		if _, err := sem.TryAcquire(ctx, n); !errors.Is(err, dlock.ErrInvalidArgument) {
			t.Fatalf("TryAcquire(%d) of 3: %v", n, err)
		}
	}
	// Two clients that disagree on the size: a clear error while in use.
	l, err := sem.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := newClient(t, s)
	_, err = other.Semaphore("sized", 5).Acquire(ctx, 1)
	if !errors.Is(err, dlock.ErrInvalidArgument) || !strings.Contains(err.Error(), "size 3, not 5") {
		t.Fatalf("Acquire with another size while in use: %v", err)
	}
	if used, _ := rdb.HGet(ctx, "dlock:{sized}", "u").Int(); used != 1 {
		t.Fatalf("the refused Acquire changed the count: %d", used)
	}
	_ = l.Unlock(ctx)
	// Idle: the next size is adopted.
	l5, err := other.Semaphore("sized", 5).Acquire(ctx, 5)
	if err != nil {
		t.Fatalf("Acquire with a new size once idle: %v", err)
	}
	_ = l5.Unlock(ctx)
	closed, _ := newClient(t, s)
	cs := closed.Semaphore("sized", 5)
	_ = closed.Close()
	if _, err := cs.Acquire(ctx, 1); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("Acquire after Close: %v", err)
	}
}

// TestPrimitiveKindsDoNotMix: a name used by one primitive is refused by the
// others with an error naming both, and nothing is overwritten.
func TestPrimitiveKindsDoNotMix(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 10*time.Second)
	m, err := c.Mutex("m").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sl, err := c.Semaphore("s", 2).Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	rl, err := c.RWMutex("rw").RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := func(err error, holds, not string) {
		t.Helper()
		if !errors.Is(err, dlock.ErrForeignKey) || !strings.Contains(err.Error(), "is a dlock "+holds+", not a "+not) || strings.Count(err.Error(), "dlock: ") != 1 {
			t.Fatalf("want a %s refused as a %s: %v", holds, not, err)
		}
	}
	_, err = c.Semaphore("m", 2).Acquire(ctx, 1)
	want(err, "mutex", "semaphore")
	_, err = c.RWMutex("m").TryRLock(ctx)
	want(err, "mutex", "rwmutex")
	_, err = c.Mutex("s").TryLock(ctx)
	want(err, "semaphore", "mutex")
	_, err = c.Mutex("s", dlock.Fair()).Lock(ctx)
	want(err, "semaphore", "mutex")
	_, err = c.RWMutex("s").Lock(ctx)
	want(err, "semaphore", "rwmutex")
	_, err = c.Mutex("rw").Lock(ctx)
	want(err, "rwmutex", "mutex")
	_, err = c.Semaphore("rw", 3).TryAcquire(ctx, 1)
	want(err, "rwmutex", "semaphore")
	// Not a lock at all.
	rdb.Set(ctx, "dlock:{str}", "x", 0)
	if _, err := c.Semaphore("str", 1).Acquire(ctx, 1); !errors.Is(err, dlock.ErrForeignKey) || !strings.Contains(err.Error(), `"dlock:{str}"`) {
		t.Fatalf("semaphore on a string key: %v", err)
	}
	// A foreign lock's lease context is no way into another primitive.
	if _, err := c.Mutex("s").TryLock(sl.Context()); !errors.Is(err, dlock.ErrForeignKey) {
		t.Fatalf("mutex under a semaphore lease of the same name: %v", err)
	}
	if _, err := c.RWMutex("m").RLock(m.Context()); !errors.Is(err, dlock.ErrForeignKey) {
		t.Fatalf("RLock under a mutex lease of the same name: %v", err)
	}
	for _, l := range []*dlock.Lease{m, sl, rl} {
		if err := l.Unlock(ctx); err != nil {
			t.Fatalf("%s: %v", l.Name(), err)
		}
	}
}

// TestSemaphoreReleaseRetry (fault 17 for permits): an Unlock whose reply
// was lost (the server froze after receiving it) is retried; the retry finds
// the holding gone, before its deadline, and reports success, not a loss.
// A holding that really was lost (pruned after its TTL) still says ErrLockLost.
func TestSemaphoreReleaseRetry(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	sem := c.Semaphore("retry", 2)
	l, err := sem.Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	s.Pause()
	uctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err = l.Unlock(uctx)
	cancel()
	s.Resume()
	if err == nil || errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Unlock against a frozen server: %v, want an unknown outcome", err)
	}
	waitFor(t, ctx, "the release sent before the freeze to run", func() bool {
		return rdb.HGet(ctx, "dlock:{retry}", "u").Val() == "0"
	})
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("retried Unlock after a release that went through: %v, want nil", err)
	}

	lost, err := c.Semaphore("retry", 2, dlock.TTL(300*time.Millisecond), dlock.NoRenew()).Acquire(ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond) // past its 300ms TTL: a lost holding is what is tested
	if err := lost.Unlock(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Unlock after the TTL: %v, want ErrLockLost", err)
	}
}

// TestSemaphoreAcquireReplyLost (fault 4 for permits): an Acquire applied
// at Redis after its ctx ended is not reported as success, and its permits
// come back at once, not after their TTL.
func TestSemaphoreAcquireReplyLost(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	sem := c.Semaphore("lost-reply", 2, dlock.TTL(5*time.Second))
	if l, err := sem.TryAcquire(ctx, 1); err != nil { // warm up (loads the script)
		t.Fatal(err)
	} else {
		_ = l.Unlock(ctx)
	}
	for _, try := range []bool{true, false} {
		// Frozen (SIGSTOP) when the acquire is sent, the server runs it once
		// it resumes, after the 100ms ctx has ended.
		s.Pause()
		tctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		var err error
		if try {
			_, err = sem.TryAcquire(tctx, 2)
		} else {
			_, err = sem.Acquire(tctx, 2)
		}
		cancel()
		s.Resume()
		if err == nil {
			t.Fatal("reported success with its reply lost")
		}
		deadline := time.Now().Add(2 * time.Second)
		for rdb.HGet(ctx, "dlock:{lost-reply}", "u").Val() != "0" {
			if time.Now().After(deadline) {
				t.Fatalf("TryAcquire=%v: permits still held 2s after a lost reply", try)
			}
			time.Sleep(20 * time.Millisecond) // poll; the 2s bound is what is tested
		}
	}
}

// TestSemaphoreKeysLostWhileWaiting: the semaphore's keys vanish (DEL,
// eviction, a restart without persistence) while a waiter is in line. A
// grant must take the grantee out of the line, or a later release serves
// it again and the count of permits held drifts from the holdings (a
// request for every permit then waits for the idle expiry). After every
// caller has gone, the count is zero and no holding is left.
func TestSemaphoreKeysLostWhileWaiting(t *testing.T) {
	s := redistest.Start(t)
	cs, rdb := newClients(t, s, 2)
	for _, lost := range [][]string{{""}, {"", ":h"}, {"", ":h", ":q", ":w"}} {
		t.Run(strings.Join(lost, "+"), func(t *testing.T) {
			ctx := ctxT(t, 8*time.Second)
			name := "lost" + strings.Join(lost, "")
			hash := "dlock:{" + name + "}"
			sem := func(i int) *dlock.Semaphore { return cs[i].Semaphore(name, 2) }
			a, err := sem(0).Acquire(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			b, err := sem(0).Acquire(ctx, 1)
			if err != nil {
				t.Fatal(err)
			}
			wl := async(t, ctx, func(ctx context.Context) (*dlock.Lease, error) { return sem(1).Acquire(ctx, 1) })
			waitLine(t, ctx, rdb, hash, 1)
			for _, suffix := range lost {
				rdb.Del(ctx, hash+suffix)
			}
			w, err := wl() // granted at its next refresh: the permits are free again
			if err != nil {
				t.Fatal(err)
			}
			// A request for every permit waits behind the holder w.
			xl := async(t, ctx, func(ctx context.Context) (*dlock.Lease, error) { return sem(1).Acquire(ctx, 2) })
			waitFor(t, ctx, "the request for 2 permits is in line", func() bool {
				for _, v := range rdb.HVals(ctx, hash+":w").Val() {
					if strings.Contains(v, ",2,") || strings.HasSuffix(v, ",2") { // its entry (permits 2)
						return true
					}
				}
				return false
			})
			_ = a.Unlock(ctx) // its holding went with the keys: ErrLockLost, and a look at the line
			_ = b.Unlock(ctx)
			if err := w.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			x, err := xl()
			if err != nil {
				t.Fatalf("the request for every permit: %v", err)
			}
			if err := x.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			fields := rdb.HGetAll(ctx, hash).Val()
			for f := range fields {
				if strings.HasPrefix(f, "h:") {
					t.Errorf("holding %s left behind", f)
				}
			}
			if u := fields["u"]; u != "0" {
				t.Fatalf("u = %q after every holder left, want 0 (%v)", u, fields)
			}
		})
	}
}
