package dlock_test

// Faults 9 and 10 of docs/SAFETY.md with the server's wall clock really
// moved: redis-server runs with the clock-shift shim of internal/redistest
// (Options{ClockShift}), and the test sets the offset while it runs. Redis
// keeps a key's expiry as a point on that clock, and dlock seeds new fence
// counters from its TIME; dlock's own lease deadlines are on the client's
// monotonic clock.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Fault 9, for real: the server's clock jumps an hour forward while a lock
// is held and renewed. Its key expires at once (the documented limit); a
// second Client is granted the lock, its fence is higher and the fenced
// register refuses the first holder; the first holder's next renewal finds
// the key gone and ends its lease with ErrLockLost.
func TestFault9ClockJumpForwardReal(t *testing.T) {
	s := redistest.Start(t, redistest.Options{ClockShift: true})
	c1, rdb := newClient(t, s)
	c2, _ := newClient(t, s)
	ctx := ctxT(t, 30*time.Second)
	old, err := c1.Mutex("jump-real", dlock.TTL(3*time.Second)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !writeFenced(ctx, rdb, old.Fence(), "old holder") {
		t.Fatal("holder's fenced write refused")
	}
	s.SetClockOffset(t, time.Hour)
	cur, err := c2.Mutex("jump-real").TryLock(ctx)
	if err != nil {
		t.Fatalf("early expiry not reproduced: %v", err)
	}
	defer cur.Unlock(ctx)
	staleHolderRefused(t, ctx, rdb, old, cur, "did not notice the key gone")
	if o := rdb.HGet(ctx, "dlock:{jump-real}", "o").Val(); o != cur.Token() {
		t.Fatal("the stale holder's renewal or Unlock touched the new holder's lock")
	}
}

// Fault 10: the server's clock jumps an hour backward. Safety holds:
//   - a holder that keeps renewing keeps the lock: its lease does not end,
//     another Client is refused throughout, Extend and Unlock work, and the
//     next holder's fence is higher (the counter survives its release);
//   - a holder that dies before renewing again leaves a key whose expiry
//     was set on the old clock: it lives an hour longer than its TTL (the
//     lock "merely lives longer"), while a holder that renewed after the
//     jump and then died frees the lock at its TTL, since renewals set
//     their expiry from the server's clock of the moment.
func TestFault10ClockJumpsBackward(t *testing.T) {
	s := redistest.Start(t, redistest.Options{ClockShift: true})
	c1, rdb := newClient(t, s)
	c2, _ := newClient(t, s)
	ctx := ctxT(t, 60*time.Second)
	const ttl = time.Second

	t.Run("renewing holder", func(t *testing.T) {
		s.SetClockOffset(t, 0)
		l, err := c1.Mutex("back", dlock.TTL(ttl)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		s.SetClockOffset(t, -time.Hour)
		// Hold on through four renewals after the jump, more than three
		// TTLs: the lease must last, and the lock stay exclusive.
		waitRenewals(t, ctx, rdb, "dlock:{back}", ttl, 4, func() {
			if err := l.Context().Err(); err != nil {
				t.Fatalf("lease ended after the server's clock went back: %v", context.Cause(l.Context()))
			}
			if _, err := c2.Mutex("back").TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
				t.Fatalf("second Client's TryLock while the first holds: %v, want ErrNotObtained", err)
			}
		})
		if err := l.Extend(ctx, 2*ttl); err != nil {
			t.Fatalf("Extend: %v", err)
		}
		if got, err := l.TTL(ctx); err != nil || got <= ttl || got > 2*ttl {
			t.Fatalf("TTL after Extend(2s) = %v, %v; want within (1s, 2s]", got, err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatalf("Unlock: %v", err)
		}
		next, err := c2.Mutex("back").TryLock(ctx)
		if err != nil {
			t.Fatalf("TryLock after Unlock: %v", err)
		}
		if next.Fence() <= l.Fence() {
			t.Fatalf("next fence %d not above %d", next.Fence(), l.Fence())
		}
		_ = next.Unlock(ctx)
	})

	t.Run("holder dies before renewing", func(t *testing.T) {
		s.SetClockOffset(t, 0)
		cmd, _, sc := startChild(t, "hold", s.Addr(), ttl.String())
		childFence, _ := strconv.ParseUint(expectLine(t, sc, "locked "), 10, 64)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		s.SetClockOffset(t, -time.Hour)
		if pttl := rdb.PTTL(ctx, "dlock:{held}").Val(); pttl < time.Hour-time.Minute {
			t.Fatalf("dead holder's key has %v to live after the clock went back an hour, want about 1h", pttl)
		}
		// Past the TTL by real time (a time property: the lock outliving
		// its TTL is what is tested), it is still held.
		time.Sleep(ttl + ttl/2)
		if _, err := c2.Mutex("held").TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
			t.Fatalf("TryLock past the dead holder's TTL: %v, want ErrNotObtained (the lock lives an hour longer)", err)
		}
		// The clock back where it was, the key is past its expiry.
		s.SetClockOffset(t, 0)
		l, err := c2.Mutex("held").TryLock(ctx)
		if err != nil {
			t.Fatalf("TryLock once the clock is back: %v", err)
		}
		if l.Fence() <= childFence {
			t.Fatalf("fence %d not above the dead holder's %d", l.Fence(), childFence)
		}
		_ = l.Unlock(ctx)
	})

	t.Run("holder dies after renewing", func(t *testing.T) {
		s.SetClockOffset(t, 0)
		cmd, _, sc := startChild(t, "hold", s.Addr(), ttl.String())
		expectLine(t, sc, "locked ")
		s.SetClockOffset(t, -time.Hour)
		waitFor(t, ctx, "a renewal after the jump", func() bool {
			return rdb.PTTL(ctx, "dlock:{held}").Val() <= ttl
		})
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		// Free at its TTL: well within the 10 s Lock is given, not an hour.
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		l, err := c2.Mutex("held").Lock(lctx)
		if err != nil {
			t.Fatalf("lock of a holder that renewed after the jump and died: %v", err)
		}
		_ = l.Unlock(ctx)
	})
}

// Fault 10, fences: with the server's clock an hour behind, a lock whose
// hash is reclaimed (its idle period ran out on the shifted clock) starts a
// new counter from TIME in microseconds, below the fences it handed out
// before: fences go backwards (a documented limit). The Client that saw the
// earlier fence reports it at Error level; storage that checks fences
// refuses the new holder, so no stale write gets in. A Client that never
// saw the earlier fence cannot tell.
func TestFault10FenceRegression(t *testing.T) {
	s := redistest.Start(t, redistest.Options{ClockShift: true})
	var seen, unseen recordedLogs
	c, rdb := newClient(t, s, dlock.WithLogger(slog.New(&seen)), dlock.WithIdleExpiry(time.Second))
	other, _ := newClient(t, s, dlock.WithLogger(slog.New(&unseen)), dlock.WithIdleExpiry(time.Second))
	ctx := ctxT(t, 30*time.Second)
	m := c.Mutex("back-fence")
	before, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !writeFenced(ctx, rdb, before.Fence(), "before the jump") {
		t.Fatal("fenced write refused")
	}
	s.SetClockOffset(t, -time.Hour)
	// Released after the jump: the idle period runs on the shifted clock.
	if err := before.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the released lock's hash to expire", func() bool {
		return rdb.Exists(ctx, "dlock:{back-fence}").Val() == 0
	})
	after, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.Fence() >= before.Fence() {
		t.Fatalf("fence %d after the reclaim is not below %d: the fault is not reproduced", after.Fence(), before.Fence())
	}
	reports := seen.errorAttrs("fence went backwards")
	if len(reports) != 1 {
		t.Fatalf("fence went from %d to %d: %d Error reports, want 1", before.Fence(), after.Fence(), len(reports))
	}
	want := map[string]string{"lock": "back-fence", "fence": strconv.FormatUint(after.Fence(), 10), "previous": strconv.FormatUint(before.Fence(), 10)}
	for k, v := range want {
		if reports[0][k] != v {
			t.Fatalf("report %v, want %s=%s", reports[0], k, v)
		}
	}
	if writeFenced(ctx, rdb, after.Fence(), "after the jump") {
		t.Fatal("the register accepted a write with a fence below one it had seen")
	}
	if err := after.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// The limit: a Client that never saw the earlier fence is not told.
	l, err := other.Mutex("back-fence").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Unlock(ctx)
	if l.Fence() >= before.Fence() || unseen.count("fence went backwards") != 0 {
		t.Fatalf("other Client: fence %d (earlier %d), %d reports; want a fence below the earlier one, unreported",
			l.Fence(), before.Fence(), unseen.count("fence went backwards"))
	}
}

// waitRenewals waits until key's time to live, at most ttl, has gone up n
// times (renewals by its holder, a third of ttl apart), calling check
// between looks. It allows twice ttl a renewal, and at least 10 s: a
// quorum Client's renewal of a 3 s lease beside the other test passes once
// took more than the 10 s that four were given.
func waitRenewals(t *testing.T, ctx context.Context, rdb *redis.Client, key string, ttl time.Duration, n int, check func()) {
	t.Helper()
	waitRenewalsOn(t, ctx, []*redis.Client{rdb}, key, ttl, n, check)
}

// waitRenewalsOn is waitRenewals on several masters of one quorum lock: n
// renewals seen on any one of them. (A loaded machine may leave one master
// without a renewal in time, so that its copy of the lock expires while
// the others keep it: a quorum lease lives on a majority.)
func waitRenewalsOn(t *testing.T, ctx context.Context, rdbs []*redis.Client, key string, ttl time.Duration, n int, check func()) {
	t.Helper()
	renewals, last := make([]int, len(rdbs)), make([]time.Duration, len(rdbs))
	waitWithin(t, ctx, max(10*time.Second, time.Duration(2*n)*ttl), fmt.Sprintf("%d renewals of %s", n, key), func() bool {
		check()
		for i, rdb := range rdbs {
			pttl := rdb.PTTL(ctx, key).Val()
			if pttl <= ttl && pttl > last[i] {
				renewals[i]++
			}
			last[i] = pttl
			if renewals[i] >= n {
				return true
			}
		}
		return false
	})
}

// shiftClocks sets the clock offset of each of servers.
func shiftClocks(t *testing.T, servers []*redistest.Server, d time.Duration) {
	t.Helper()
	for _, s := range servers {
		s.SetClockOffset(t, d)
	}
}

// patientQuorum is a quorum Client whose masters have 1 s to answer each
// request, so that a loaded machine does not turn a slow answer into a
// missing vote: these tests count the masters that hold a lock.
func patientQuorum(t *testing.T, rdbs []redis.UniversalClient) *dlock.Client {
	return newQuorum(t, rdbs, dlock.WithNodeTimeout(time.Second))
}

// Fault 9 on Q: the clocks of two of the five masters jump an hour
// forward: their copies of the lock expire, but three still hold it, so a
// contender is refused and the holder renews on its majority. When a third
// master's clock jumps too, the lock is granted again while its holder
// still believes it valid (the documented limit: quorum mode assumes no
// clock jumps); the new fence is higher, the register refuses the old
// holder, whose next renewal finds no majority and ends its lease.
func TestFault9QuorumClockJumpForward(t *testing.T) {
	servers, rdbs := quorumMasters(t, 5, redistest.Options{ClockShift: true})
	a, b := patientQuorum(t, rdbs), patientQuorum(t, rdbs)
	reg := rdbs[0].(*redis.Client) // the fenced register lives on any server
	ctx := ctxT(t, 30*time.Second)
	const key = "dlock:{qjump}"
	old, err := a.Mutex("qjump", dlock.TTL(10*time.Second)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Lock returned once a majority granted; the others' grants follow.
	grantedOnAll(t, ctx, servers, "qjump", old)
	if !writeFenced(ctx, reg, old.Fence(), "old holder") {
		t.Fatal("holder's fenced write refused")
	}

	shiftClocks(t, servers[:2], time.Hour)
	if n := len(heldOn(t, servers, "qjump", old.Token())); n != 3 {
		t.Fatalf("the holder owns the lock on %d masters after two clocks jumped, want 3", n)
	}
	if _, err := b.Mutex("qjump").TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock with the lock held on three masters: %v, want ErrNotObtained", err)
	}
	if err := old.Extend(ctx, 10*time.Second); err != nil {
		t.Fatalf("Extend on the majority that still holds it: %v", err)
	}

	shiftClocks(t, servers[2:3], time.Hour)
	cur, err := b.Mutex("qjump").Lock(ctx)
	if err != nil {
		t.Fatalf("early expiry on a majority not reproduced: %v", err)
	}
	defer cur.Unlock(ctx)
	if old.Context().Err() != nil {
		t.Log("the old lease had already ended")
	}
	staleHolderRefused(t, ctx, reg, old, cur, "did not miss their majority")
	if n := len(heldOn(t, servers, "qjump", cur.Token())); n < 3 {
		t.Fatalf("the new holder owns the lock on %d masters after the stale Unlock, want at least 3", n)
	}
}

// Fault 10 on Q: the clocks of three of the five masters (a majority) jump
// an hour back while a lock is held and renewed. Safety holds: the lease
// lasts, a contender is refused, Unlock releases it on every master and the
// next grant's fence is higher. Those masters' INFO uptime is now negative
// (Redis 7.0 counts it on the wall clock): a new Client still uses them,
// and one whose epoch key was lost is dated from its start, ahead of its
// clock, so it does not vote.
func TestFault10QuorumClockJumpsBackward(t *testing.T) {
	servers, rdbs := quorumMasters(t, 5, redistest.Options{ClockShift: true})
	a, b := patientQuorum(t, rdbs), patientQuorum(t, rdbs)
	ctx := ctxT(t, 45*time.Second)
	const key, ttl = "dlock:{qback}", 3 * time.Second
	l, err := a.Mutex("qback", dlock.TTL(ttl)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	shiftClocks(t, servers[:3], -time.Hour)
	waitRenewals(t, ctx, servers[0].Client(t), key, ttl, 4, func() {
		if err := l.Context().Err(); err != nil {
			t.Fatalf("lease ended after three masters' clocks went back: %v", context.Cause(l.Context()))
		}
		if _, err := b.Mutex("qback").TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
			t.Fatalf("TryLock while held: %v, want ErrNotObtained", err)
		}
	})
	if n := len(heldOn(t, servers, "qback", l.Token())); n < 3 {
		t.Fatalf("the holder owns the lock on %d masters, want a majority", n)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	// A master whose release failed keeps it until its TTL: never a majority.
	if n := len(heldOn(t, servers, "qback", l.Token())); n > 2 {
		t.Fatalf("the lock is still owned on %d masters after Unlock", n)
	}
	next, err := b.Mutex("qback").Lock(ctx)
	if err != nil {
		t.Fatalf("Lock after Unlock: %v", err)
	}
	if next.Fence() <= l.Fence() {
		t.Fatalf("next fence %d not above %d", next.Fence(), l.Fence())
	}
	_ = next.Unlock(ctx)

	servers[0].Do(t, "del", "dlock:epoch") // its data lost, say
	c := patientQuorum(t, rdbs)
	l2, err := c.Mutex("qback2", dlock.TTL(ttl)).Lock(ctx)
	if err != nil {
		t.Fatalf("a new Client's Lock with three masters' clocks behind their start: %v", err)
	}
	defer l2.Unlock(ctx)
	// Master 0's script sets the epoch key before it votes (or not).
	epochKey := epochSet(t, ctx, servers[0])
	if servers[0].Do(t, "hget", "dlock:{qback2}", "o") != nil {
		t.Fatal("a master without its epoch key, its clock behind its start, voted")
	}
	start, _, _ := strings.Cut(epochKey, " ") // "START RUN_ID"
	epoch, _ := strconv.ParseInt(start, 10, 64)
	clock, err := servers[0].Client(t).Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ahead := time.Duration(epoch-clock.UnixMilli()) * time.Millisecond; ahead < time.Hour-time.Minute {
		t.Fatalf("epoch set %v ahead of the master's clock, want its start, about 1h ahead", ahead)
	}
	if n := len(heldOn(t, servers, "qback2", l2.Token())); n < 3 {
		t.Fatalf("granted on %d masters, want a majority of the 4 that vote", n)
	}
}

// staleHolderRefused checks what must follow a lock granted again while old
// believed it held it (a clock jump): cur's fence is above old's, a fenced
// register takes cur's write and refuses old's, old's renewals tell it the
// lease is lost (why: what they would have missed), and old's Unlock says
// ErrLockLost.
func staleHolderRefused(t *testing.T, ctx context.Context, reg *redis.Client, old, cur *dlock.Lease, why string) {
	t.Helper()
	if cur.Fence() <= old.Fence() {
		t.Fatalf("new holder's fence %d not above the old holder's %d", cur.Fence(), old.Fence())
	}
	if !writeFenced(ctx, reg, cur.Fence(), "new holder") {
		t.Fatal("current holder's write rejected")
	}
	if writeFenced(ctx, reg, old.Fence(), "stale holder") {
		t.Fatal("stale holder's write accepted by the fenced register")
	}
	select {
	case <-old.Context().Done():
		if cause := context.Cause(old.Context()); !errors.Is(cause, dlock.ErrLockLost) {
			t.Fatalf("old lease ended with %v, want ErrLockLost", cause)
		}
	case <-ctx.Done():
		t.Fatal("the old holder was never told: its renewals " + why)
	}
	if err := old.Unlock(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("stale Unlock: %v, want ErrLockLost", err)
	}
}
