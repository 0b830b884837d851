package dlock_test

// Faults from shared/SAFETY.md injected on a single server (topology S).
// Each test names its row of the fault matrix. The checks that hold on
// every topology run on R and C too (siteChecks in topologies_test.go).

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faultproxy"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// fencedWrite is the storage side of fencing: a register that accepts a
// write only with a fence at least as high as any it has seen.
var fencedWrite = redis.NewScript(`
local seen = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[1]) < seen then return 0 end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'value', ARGV[2])
return 1`)

func writeFenced(ctx context.Context, rdb redis.Scripter, fence uint64, value string) bool {
	n, err := fencedWrite.Run(ctx, rdb, []string{"register"}, fence, value).Int()
	return err == nil && n == 1
}

// Fault 4: the acquire is applied but its reply never arrives in time. The
// caller must see an error, never success, and the lock must be free again
// soon (dlock releases the token it may have been granted). On R and C
// (siteChecks), the server frozen is the one that serves the lock: the
// primary, the master of the lock's slot.
func TestFault4AcquireReplyLost(t *testing.T) { acquireReplyLost(t, startS(t)) }

func acquireReplyLost(t *testing.T, site *site) {
	c, rdb := site.client(t)
	ctx := ctxT(t, 20*time.Second)
	if l, err := c.Mutex("lost-reply").TryLock(ctx); err != nil { // warm up
		t.Fatal(err)
	} else {
		_ = l.Unlock(ctx)
	}
	// The server is frozen when our acquire is sent, and runs it once it
	// resumes, after our 100ms ctx has ended. (Frozen with SIGSTOP, not DEBUG
	// SLEEP: a sleep in progress cannot be observed, a stopped process is.)
	s := site.serverOf(t, "dlock:{lost-reply}")
	s.Pause()
	tctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err := c.Mutex("lost-reply", dlock.TTL(5*time.Second)).TryLock(tctx)
	cancel()
	s.Resume()
	if err == nil {
		t.Fatal("TryLock reported success with its reply lost")
	}
	// The lock is free well before its 5s TTL.
	deadline := time.Now().Add(2 * time.Second)
	for {
		l, err := c.Mutex("lost-reply").TryLock(ctx)
		if err == nil {
			_ = l.Unlock(ctx)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lock still held 2s after a lost acquire reply: owner %q", owner(ctx, rdb, "lost-reply"))
		}
		time.Sleep(20 * time.Millisecond) // poll; the 2s bound is what is tested
	}

	// The connection is reset after the acquire ran, before its reply came
	// (a proxy in front of the server holds the reply back): go-redis sends
	// it again, with the same token, and acquire.lua recognises it. The
	// grant is real, so it is reported, held by that token, and freed by
	// its Unlock.
	pc, p := warmProxied(t, ctx, site, "reset-reply")
	p.Hold(faultproxy.Downstream)
	got := async(t, ctx, pc.Mutex("reset-reply", dlock.TTL(10*time.Second)).TryLock)
	waitFor(t, ctx, "the acquire to run", func() bool { return owner(ctx, rdb, "reset-reply") != "" })
	p.ResetAll()
	p.Release(faultproxy.Downstream)
	l, err := got()
	if err != nil {
		t.Fatalf("TryLock whose reply was reset after it ran: %v (owner %q)", err, owner(ctx, rdb, "reset-reply"))
	}
	if o := owner(ctx, rdb, "reset-reply"); o != l.Token() {
		t.Fatalf("owner %q, want the lease's token %q", o, l.Token())
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if o := owner(ctx, rdb, "reset-reply"); o != "" {
		t.Fatalf("owner %q after Unlock", o)
	}
}

// Fault 7: restart without persistence while held. The lock is gone
// (documented); the holder is told so by its lease context, and fences still
// increase after the restart.
func TestFault7RestartWithoutPersistence(t *testing.T) {
	s := redistest.Start(t)
	c, _ := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	l, err := c.Mutex("volatile", dlock.TTL(600*time.Millisecond)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s.Kill()
	s.Restart(t)
	select {
	case <-l.Context().Done():
	case <-time.After(3 * time.Second):
		t.Fatal("holder not told its lock vanished in a restart")
	}
	if !errors.Is(context.Cause(l.Context()), dlock.ErrLockLost) {
		t.Fatalf("cause %v", context.Cause(l.Context()))
	}
	lockAbove(t, ctx, c.Mutex("volatile"), l.Fence(), "after a restart that lost the counter")
}

// Fault 8: the un-fsynced AOF tail is lost (power loss, imitated by
// restoring the AOF directory as it was before the writes). With everysec
// the grants after the snapshot are lost; fences still never go back, since
// a lost counter is reseeded from the server clock. With always the key
// survives a kill.
func TestFault8AOFTailLost(t *testing.T) {
	s := redistest.Start(t, redistest.Options{AOF: true, AppendFsync: "everysec"})
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 30*time.Second)
	m := c.Mutex("aof")
	l, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Unlock(ctx)
	time.Sleep(1200 * time.Millisecond) // let everysec fsync the first grant
	snap := s.SnapshotDir(t)
	var last uint64
	for i := 0; i < 20; i++ {
		l, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		last = l.Fence()
		_ = l.Unlock(ctx)
	}
	s.Kill()
	s.RestoreDir(t, snap)
	s.Restart(t)
	if f, _ := rdb.HGet(ctx, "dlock:{aof}", "f").Uint64(); f >= last {
		t.Fatalf("the lost tail was not lost (counter %d, last fence %d): the test does not reproduce the fault", f, last)
	}
	lockAbove(t, ctx, m, last, "after losing the AOF tail")

	// appendfsync always: a kill loses nothing acknowledged.
	s2 := redistest.Start(t, redistest.Options{AOF: true, AppendFsync: "always"})
	c2, _ := newClient(t, s2)
	held, err := c2.Mutex("durable", dlock.TTL(time.Minute)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	s2.Kill()
	s2.Restart(t)
	if _, err := c2.Mutex("durable").TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("lock lost across kill -9 with appendfsync always: %v", err)
	}
	if err := held.Unlock(ctx); err != nil {
		t.Fatalf("holder's Unlock after the restart: %v", err)
	}
}

// Fault 9: the server clock jumps forward, expiring the lock early
// (emulated with PEXPIRE on the key). The early expiry is reproduced: a
// second client gets the lock while the first still thinks it holds it, and
// the fence makes the storage reject the first one's late write.
func TestFault9ClockJumpFenced(t *testing.T) {
	s := redistest.Start(t)
	c1, rdb := newClient(t, s)
	c2, _ := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	old, err := c1.Mutex("jump", dlock.TTL(10*time.Second)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rdb.PExpire(ctx, "dlock:{jump}", time.Millisecond) // the clock jumped ~10s
	// Past that 1ms TTL (a time property: the early expiry is the fault).
	time.Sleep(10 * time.Millisecond)
	cur, err := c2.Mutex("jump").TryLock(ctx)
	if err != nil {
		t.Fatalf("early expiry not reproduced: %v", err)
	}
	if !writeFenced(ctx, rdb, cur.Fence(), "new holder") {
		t.Fatal("current holder's write rejected")
	}
	if writeFenced(ctx, rdb, old.Fence(), "stale holder") {
		t.Fatal("stale holder's write accepted by the fenced register")
	}
	if v := rdb.HGet(ctx, "register", "value").Val(); v != "new holder" {
		t.Fatalf("register = %q", v)
	}
	if err := old.Unlock(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("stale Unlock: %v, want ErrLockLost", err)
	}
	if _, err := cur.TTL(ctx); err != nil {
		t.Fatalf("stale Unlock touched the current holder: %v", err)
	}
	_ = cur.Unlock(ctx)
}

// Fault 13: a contention storm, 128 goroutines on 4 Clients: zero double
// grants and everyone progresses.
func TestFault13ContentionStorm(t *testing.T) { contentionStorm(t, startS(t)) }

func contentionStorm(t *testing.T, site *site) {
	cs, rdb := site.clients(t, 4)
	contend(t, ctxT(t, 60*time.Second), rdb, 128, 4, func(g int) *dlock.Mutex { return cs[g%4].Mutex("storm") })
}

// Fault 14: the server that serves the lock is paused longer than the TTL.
// The holder is told it lost the lock by its deadline, while that server
// is still frozen; after it resumes exactly one of the queued waiters wins,
// with a fence above the holder's.
//
// On R the sentinels fail the frozen primary over (after 1s): exactly one
// waiter wins, on the promoted replica, while the old primary is still
// frozen. The old primary, once it resumes, runs the acquires it had
// queued and grants one, but nobody believes its reply: every waiting
// Client followed the promoted replica first (startR). go-redis closed
// its connections to the old primary then; rueidis still reads them for
// up to a second as it closes them, and rueidisdlock takes a reply that
// came across the move for an unknown outcome (see rueidisdlock's watch).
// (A Client that had not followed would be granted the lock there too, as
// by a primary cut off with a client: fault 6.) On C the frozen master is
// not failed over (startC).
func TestFault14ServerPausedPastTTL(t *testing.T) { serverPausedPastTTL(t, startS(t)) }

func serverPausedPastTTL(t *testing.T, site *site) {
	c, rdb := site.client(t)
	ctx := ctxT(t, 60*time.Second)
	holder, err := c.Mutex("frozen", dlock.TTL(500*time.Millisecond)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var clients []*dlock.Client
	var names []string
	for i := 0; i < 4; i++ {
		wc, _ := site.client(t)
		clients = append(clients, wc)
		names = append(names, site.names[wc])
	}
	w := startWaiters(ctx, clients, "frozen")
	defer w.stop(ctx)
	waitLine(t, ctx, rdb, "dlock:{frozen}", 4) // every waiter in line
	s := site.serverOf(t, "dlock:{frozen}")
	paused := time.Now()
	s.Pause()
	select {
	case <-holder.Context().Done():
		if d := time.Since(paused); d > 1500*time.Millisecond {
			t.Errorf("holder told %v after the pause, TTL 500ms", d)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("holder not told it lost the lock while the server was frozen")
	}
	site.frozen(t, ctx, s, names)
	s.Resume()
	if site.resumed != nil {
		site.resumed(t, s, "dlock:{frozen}")
	}
	w.oneWins(t, ctx, holder, 5*time.Second)
}

// waiters are Clients each waiting in Lock for one lock name (fault 14).
type waiters struct {
	got    atomic.Int32
	grants chan *dlock.Lease
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startWaiters has each of clients Lock name (TTL 10 s) until it gets it
// or stop is called.
func startWaiters(ctx context.Context, clients []*dlock.Client, name string) *waiters {
	w := &waiters{grants: make(chan *dlock.Lease, len(clients))}
	wctx, cancel := context.WithCancel(ctx)
	w.cancel = cancel
	for _, c := range clients {
		w.wg.Go(func() {
			if l, err := c.Mutex(name, dlock.TTL(10*time.Second)).Lock(wctx); err == nil {
				w.got.Add(1)
				w.grants <- l
			}
		})
	}
	return w
}

// oneWins checks what follows a holder's loss of its lease: a waiter gets
// the lock within d, with a fence above the holder's, no second waiter
// gets it meanwhile, and the holder's Unlock says ErrLockLost.
func (w *waiters) oneWins(t *testing.T, ctx context.Context, holder *dlock.Lease, d time.Duration) {
	t.Helper()
	var first *dlock.Lease
	select {
	case first = <-w.grants:
	case <-time.After(d):
		t.Fatal("no waiter got the lock after the server resumed")
	}
	defer first.Unlock(ctx)
	if first.Fence() <= holder.Fence() {
		t.Fatalf("the waiter's fence %d is not above the holder's %d", first.Fence(), holder.Fence())
	}
	// Not ordering: time for a wrong second grant to happen; the check is
	// that none does.
	time.Sleep(300 * time.Millisecond)
	if n := w.got.Load(); n != 1 {
		t.Fatalf("%d waiters hold the lock", n)
	}
	if err := holder.Unlock(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("old holder's Unlock: %v, want ErrLockLost", err)
	}
}

// stop ends the waits and unlocks what they got.
func (w *waiters) stop(ctx context.Context) {
	w.cancel()
	w.wg.Wait()
	close(w.grants)
	for l := range w.grants {
		_ = l.Unlock(ctx)
	}
}

// Fault 17: a release whose reply was lost is retried. The retry must say
// "released" (not ErrLockLost) when the first attempt went through, and
// ErrLockLost when someone else has been granted the lock since. Then the
// fault itself, through a proxy in front of the server that serves the
// lock: a connection reset during a release, or during an extend.
func TestFault17ReleaseRetry(t *testing.T) { releaseRetry(t, startS(t)) }

func releaseRetry(t *testing.T, site *site) {
	c, rdb := site.client(t)
	ctx := ctxT(t, 20*time.Second)
	src, err := os.ReadFile("internal/wire/lua/release.lua")
	if err != nil {
		t.Fatal(err)
	}
	release := redis.NewScript(string(src))
	firstRelease := func(l *dlock.Lease) { // what reached Redis before the reply was lost
		n, err := release.Run(ctx, rdb, []string{"dlock:{" + l.Name() + "}"}, l.Token(), l.Fence(), 600000, "dlock:{"+l.Name()+"}").Int()
		if err != nil || n != 1 {
			t.Fatalf("release script: %d, %v", n, err)
		}
	}

	l, err := c.Mutex("retry").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	firstRelease(l)
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("retried Unlock after a release that went through: %v, want nil", err)
	}

	l, err = c.Mutex("retry").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	firstRelease(l)
	other, err := c.Mutex("retry").Lock(ctx) // granted since
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("retried Unlock after another grant: %v, want ErrLockLost", err)
	}
	if o := owner(ctx, rdb, "retry"); o != other.Token() {
		t.Fatal("the retried release touched the new holder")
	}
	_ = other.Unlock(ctx)

	resetAfterRelease(t, ctx, site, rdb, c)
	resetAfterExtend(t, ctx, site, rdb)
}

// warmProxied returns site.proxied's Client and proxy for lock name,
// warmed up on it (warmUp). A test that holds replies back needs it: a
// call on a new connection waits for its handshake's reply, and one that
// meets NOSCRIPT for that reply, before it runs.
func warmProxied(t *testing.T, ctx context.Context, site *site, name string) (*dlock.Client, *faultproxy.Proxy) {
	t.Helper()
	c, p := site.proxied(t, "dlock:{"+name+"}")
	warmUp(t, ctx, c, name)
	return c, p
}

// resetAfterRelease: the connection of an Unlock is reset after its release
// ran, and the lock is taken (by other) before the reset. dlock sends the
// release again, which finds the lock another's: the Unlock says nil (its
// first run released the lock) and the new holder keeps it.
func resetAfterRelease(t *testing.T, ctx context.Context, site *site, rdb redis.UniversalClient, other *dlock.Client) {
	t.Helper()
	const name = "reset-release"
	pc, p := warmProxied(t, ctx, site, name)
	l, err := pc.Mutex(name, dlock.TTL(10*time.Second)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	p.Hold(faultproxy.Downstream)
	unlocked := async(t, ctx, func(ctx context.Context) (*dlock.Lease, error) { return nil, l.Unlock(ctx) })
	waitFor(t, ctx, "the release to run", func() bool { return owner(ctx, rdb, name) != l.Token() })
	cur, err := other.Mutex(name, dlock.TTL(10*time.Second)).TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock once the release ran: %v", err)
	}
	p.ResetAll()
	p.Release(faultproxy.Downstream)
	if _, err := unlocked(); err != nil {
		t.Fatalf("Unlock whose reply was reset after it ran, the lock taken since: %v, want nil", err)
	}
	if o := owner(ctx, rdb, name); o != cur.Token() {
		t.Fatalf("owner %q after the resent release, want the new holder %q", o, cur.Token())
	}
	if err := cur.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// resetAfterExtend: the connection of an Extend is reset after the
// extension ran, and new connections are refused: the outcome is unknown,
// so Extend fails (not with ErrLockLost) and the lease still ends at its
// old deadline, though the server extended it.
func resetAfterExtend(t *testing.T, ctx context.Context, site *site, rdb redis.UniversalClient) {
	t.Helper()
	const name, short = "reset-extend", 1500 * time.Millisecond
	key := "dlock:{" + name + "}"
	pc, p := warmProxied(t, ctx, site, name)
	l, err := pc.Mutex(name, dlock.TTL(short), dlock.NoRenew()).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	locked := time.Now() // after the acquire was sent: its deadline is before locked + short
	p.Hold(faultproxy.Downstream)
	extended := async(t, ctx, func(ctx context.Context) (*dlock.Lease, error) { return nil, l.Extend(ctx, 20*time.Second) })
	waitFor(t, ctx, "the extension to run", func() bool { return rdb.PTTL(ctx, key).Val() > 10*time.Second })
	p.Refuse(true)
	p.ResetAll()
	p.Release(faultproxy.Downstream)
	if _, err := extended(); err == nil || errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Extend whose reply was reset after it ran: %v, want an error of unknown outcome", err)
	}
	// Not ordering: past the old deadline, which must stand.
	time.Sleep(time.Until(locked.Add(short)))
	if stillValid(l) {
		t.Fatalf("the lease is believed valid past its TTL after an Extend of unknown outcome (%s)", dlock.Describe(l))
	}
	p.Refuse(false)
	_ = l.Unlock(ctx)
	if o := owner(ctx, rdb, name); o != "" {
		t.Fatalf("owner %q after the Unlock of the lease whose Extend was unknown", o)
	}
}

// A fence that goes backwards (the server lost the counter in a failover or
// restart, and its clock is behind the one that granted the last fence) is
// reported, not silently passed on: storage that checks fences would refuse
// the new holder. The counter of a server whose clock ran ahead is
// emulated by raising f, its loss by deleting the key.
func TestFenceRegressionReported(t *testing.T) {
	s := redistest.Start(t)
	var logged recordedLogs
	c, rdb := newClient(t, s, dlock.WithLogger(slog.New(&logged)))
	ctx := ctxT(t, 10*time.Second)
	m := c.Mutex("regress")
	l, err := m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Unlock(ctx)
	ahead := l.Fence() + 1_000_000_000_000 // a clock about 12 days ahead
	rdb.HSet(ctx, "dlock:{regress}", "f", ahead)
	l, err = m.Lock(ctx)
	if err != nil || l.Fence() != ahead+1 {
		t.Fatalf("lock %v, fence %d, want %d", err, l.Fence(), ahead+1)
	}
	_ = l.Unlock(ctx)
	if logged.count("fence went backwards") != 0 {
		t.Fatal("reported a regression before there was one")
	}
	rdb.Del(ctx, "dlock:{regress}") // the counter is lost
	l, err = m.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Unlock(ctx)
	if l.Fence() > ahead {
		t.Fatalf("fence %d did not go backwards: the test does not reproduce the fault", l.Fence())
	}
	if logged.count("fence went backwards") != 1 {
		t.Fatalf("the regression from %d to %d was not reported", ahead+1, l.Fence())
	}
}

// recordedLogs is a slog.Handler that keeps the records.
type recordedLogs struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (r *recordedLogs) Enabled(context.Context, slog.Level) bool { return true }
func (r *recordedLogs) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	r.recs = append(r.recs, rec.Clone())
	r.mu.Unlock()
	return nil
}
func (r *recordedLogs) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *recordedLogs) WithGroup(string) slog.Handler      { return r }

// count returns how many messages, at any level, contain substr.
func (r *recordedLogs) count(substr string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, rec := range r.recs {
		if strings.Contains(rec.Message, substr) {
			n++
		}
	}
	return n
}

// errorAttrs returns the attributes, as strings, of each Error record
// whose message contains substr.
func (r *recordedLogs) errorAttrs(substr string) []map[string]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []map[string]string
	for _, rec := range r.recs {
		if rec.Level != slog.LevelError || !strings.Contains(rec.Message, substr) {
			continue
		}
		attrs := map[string]string{}
		rec.Attrs(func(a slog.Attr) bool {
			attrs[a.Key] = a.Value.String()
			return true
		})
		out = append(out, attrs)
	}
	return out
}
