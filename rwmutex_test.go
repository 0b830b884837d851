package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
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

func TestRWMutexBasics(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	rw := c.RWMutex("doc")
	r1, err := rw.RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := rw.TryRLock(ctx)
	if err != nil {
		t.Fatalf("second reader: %v", err)
	}
	if r1.Token() == r2.Token() || r2.Fence() <= r1.Fence() {
		t.Fatalf("readers share a holding: %q/%d %q/%d", r1.Token(), r1.Fence(), r2.Token(), r2.Fence())
	}
	if _, err := rw.TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock with readers in: %v", err)
	}
	// A waiting writer: readers that come after it wait behind it.
	wrote := make(chan *dlock.Lease, 1)
	go func() {
		w, err := c.RWMutex("doc").Lock(ctx)
		if err != nil {
			t.Error(err)
		}
		wrote <- w
	}()
	waitLine(t, ctx, rdb, "dlock:{doc}", 1)
	if _, err := rw.TryRLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryRLock with a writer waiting: %v", err)
	}
	_ = r1.Unlock(ctx)
	select {
	case <-wrote:
		t.Fatal("the writer got in while a reader held")
	case <-time.After(100 * time.Millisecond):
	}
	_ = r2.Unlock(ctx)
	w := <-wrote
	if w == nil {
		t.FailNow()
	}
	if w.Fence() <= r2.Fence() {
		t.Fatalf("writer fence %d after reader fence %d", w.Fence(), r2.Fence())
	}
	if _, err := rw.TryRLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryRLock with the writer in: %v", err)
	}
	// Readers waiting behind the writer all enter together when it unlocks.
	var wg sync.WaitGroup
	var in atomic.Int32
	release := make(chan struct{})
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l, err := c.RWMutex("doc").RLock(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			in.Add(1)
			<-release
			_ = l.Unlock(ctx)
		}()
	}
	waitLine(t, ctx, rdb, "dlock:{doc}", 3)
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * time.Second)
	for in.Load() != 3 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond) // poll; the 3s bound is what is tested
	}
	if n := in.Load(); n != 3 {
		t.Fatalf("%d of 3 waiting readers got in after the writer left", n)
	}
	close(release)
	wg.Wait()
}

func TestRWMutexReentrancy(t *testing.T) {
	s := redistest.Start(t)
	c, _ := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	rw := c.RWMutex("re")
	r, err := rw.RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := rw.RLock(r.Context())
	if err != nil || r2.Token() != r.Token() {
		t.Fatalf("RLock under a read lease: %v (token %v)", err, r2)
	}
	if _, err := rw.Lock(r.Context()); !errors.Is(err, dlock.ErrInvalidArgument) || !strings.Contains(err.Error(), "read lease") {
		t.Fatalf("Lock under a read lease: %v", err)
	}
	_ = r2.Unlock(ctx)
	if _, err := rw.TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("the outer read lease must still hold: %v", err)
	}
	_ = r.Unlock(ctx)
	w, err := rw.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	w2, err := rw.Lock(w.Context())
	if err != nil || w2.Token() != w.Token() {
		t.Fatalf("Lock under the write lease: %v", err)
	}
	wr, err := rw.RLock(w.Context())
	if err != nil || wr.Token() != w.Token() {
		t.Fatalf("RLock under the write lease: %v", err)
	}
	_ = wr.Unlock(ctx)
	_ = w2.Unlock(ctx)
	if _, err := rw.TryRLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("the outer write lease must still hold: %v", err)
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatalf("Unlock twice: %v", err)
	}
	l, err := rw.TryRLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Unlock(ctx)
}

// TestRWMutexWriterNotStarved: readers keep arriving, always overlapping, so
// the reader count would never reach zero on its own; a writer still gets
// in, because readers that arrive after it wait behind it.
func TestRWMutexWriterNotStarved(t *testing.T) {
	s := redistest.Start(t)
	cs, _ := newClients(t, s, 2)
	ctx := ctxT(t, 20*time.Second)
	stop := time.Now().Add(2 * time.Second)
	var wg sync.WaitGroup
	var reads, readsAfter atomic.Int64
	var readers atomic.Int32 // reader goroutines that have been in once
	var writerIn atomic.Bool
	for g := 0; g < 6; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(g) * 5 * time.Millisecond) // load: staggered, always someone inside
			rw := cs[g%2].RWMutex("busy")
			for first := true; time.Now().Before(stop); first = false {
				l, err := rw.RLock(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				reads.Add(1)
				if first {
					readers.Add(1)
				}
				if writerIn.Load() {
					readsAfter.Add(1)
				}
				time.Sleep(30 * time.Millisecond) // hold time
				_ = l.Unlock(ctx)
			}
		}()
	}
	// The writer comes once every reader is going.
	waitFor(t, ctx, "every reader in once", func() bool { return readers.Load() == 6 })
	start := time.Now()
	w, err := cs[0].RWMutex("busy").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	waited := time.Since(start)
	writerIn.Store(true)
	time.Sleep(10 * time.Millisecond) // hold time
	_ = w.Unlock(ctx)
	wg.Wait()
	if waited > time.Second {
		t.Fatalf("the writer waited %v while readers kept coming (they stop after 2s)", waited)
	}
	if readsAfter.Load() == 0 {
		t.Fatalf("no reader got in after the writer: readers were not still arriving")
	}
	t.Logf("writer waited %v; %d reads, %d after the writer", waited, reads.Load(), readsAfter.Load())
}

// TestRWMutexKilledReaderShareExpires: a reader killed with SIGKILL frees its
// share at its own TTL while another reader keeps holding.
func TestRWMutexKilledReaderShareExpires(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	rw := c.RWMutex("held")
	live, err := rw.RLock(ctx) // TTL 10s, renewed
	if err != nil {
		t.Fatal(err)
	}
	cmd, _, out := startChild(t, "rw-hold", s.Addr(), "r,1s")
	expectLine(t, out, "held")
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if used, _ := rdb.HGet(ctx, "dlock:{held}", "u").Int(); used != 2 {
		t.Fatalf("readers at Redis = %d, want 2", used)
	}
	time.Sleep(1200 * time.Millisecond) // past the killed reader's 1s TTL: what is tested
	if _, err := rw.TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock while the live reader holds: %v", err)
	}
	if used, _ := rdb.HGet(ctx, "dlock:{held}", "u").Int(); used != 1 {
		t.Fatalf("readers at Redis after the killed one's TTL = %d, want 1", used)
	}
	got := lockedAt(t, ctx, c.RWMutex("held").Lock)
	waitLine(t, ctx, rdb, "dlock:{held}", 1)
	unlocked := time.Now()
	if err := live.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	at, ok := <-got
	if !ok {
		t.FailNow()
	}
	if d := at.Sub(unlocked); d > 500*time.Millisecond {
		t.Fatalf("writer got in %v after the last live reader left", d)
	}
}

// childRWHold: "r|w,ttl". Take a read or write lease, print "held", wait for EOF.
func childRWHold(c *dlock.Client, rdb *redis.Client, arg string) error {
	mode, ttl, _ := strings.Cut(arg, ",")
	d, err := time.ParseDuration(ttl)
	if err != nil {
		return err
	}
	rw := c.RWMutex("held", dlock.TTL(d))
	if mode == "r" {
		return holdUntilEOF(rw.RLock(context.Background()))
	}
	return holdUntilEOF(rw.Lock(context.Background()))
}

// TestRWMutexAcrossProcesses: 4 processes of readers and writers. Writers
// do read-modify-write of a counter; Redis counters of readers and writers
// inside show that readers share and that a writer is alone.
func TestRWMutexAcrossProcesses(t *testing.T) {
	s := redistest.Start(t)
	_, rdb := newClient(t, s)
	ctx := ctxT(t, 60*time.Second)
	const procs, gs, iters = 4, 6, 15
	var args []string
	for p := 0; p < procs; p++ {
		args = append(args, fmt.Sprintf("%d,%d,%d", p, gs, iters))
	}
	runChildren(t, "rw-load", s.Addr(), args)
	bad, _ := rdb.Get(ctx, "rw:bad").Int()
	writes, _ := rdb.Get(ctx, "rw:writes").Int()
	reads, _ := rdb.Get(ctx, "rw:reads").Int()
	counter, _ := rdb.Get(ctx, "rw:counter").Int()
	most, _ := rdb.Get(ctx, "rw:most").Int()
	if bad != 0 {
		t.Fatalf("%d times a writer was not alone", bad)
	}
	if counter != writes || writes == 0 {
		t.Fatalf("counter %d after %d writes (lost updates)", counter, writes)
	}
	if reads+writes != procs*gs*iters {
		t.Fatalf("%d reads + %d writes, want %d", reads, writes, procs*gs*iters)
	}
	if most < 2 {
		t.Fatalf("at most %d readers at once: readers did not share", most)
	}
	t.Logf("%d writes, %d reads, up to %d readers at once", writes, reads, most)
}

// childRWLoad: "id,goroutines,iterations". A quarter of the operations write.
func childRWLoad(c *dlock.Client, rdb *redis.Client, arg string) error {
	var id, gs, iters int
	if _, err := fmt.Sscanf(arg, "%d,%d,%d", &id, &gs, &iters); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	return inGoroutines(gs, func(g int) error {
		rw := c.RWMutex("shared", dlock.TTL(5*time.Second))
		rng := rand.New(rand.NewPCG(uint64(id), uint64(g)))
		for i := 0; i < iters; i++ {
			var err error
			if rng.IntN(4) == 0 {
				err = rwWrite(ctx, rw, rdb)
			} else {
				err = rwRead(ctx, rw, rdb, rng)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
}

func rwWrite(ctx context.Context, rw *dlock.RWMutex, rdb *redis.Client) error {
	l, err := rw.Lock(ctx)
	if err != nil {
		return err
	}
	if rdb.Incr(ctx, "rw:w").Val() != 1 || rdb.Get(ctx, "rw:r").Val() != "0" && rdb.Get(ctx, "rw:r").Val() != "" {
		rdb.Incr(ctx, "rw:bad")
	}
	v, _ := rdb.Get(ctx, "rw:counter").Int()
	rdb.Set(ctx, "rw:counter", v+1, 0)
	rdb.Incr(ctx, "rw:writes")
	rdb.Decr(ctx, "rw:w")
	return l.Unlock(ctx)
}

func rwRead(ctx context.Context, rw *dlock.RWMutex, rdb *redis.Client, rng *rand.Rand) error {
	l, err := rw.RLock(ctx)
	if err != nil {
		return err
	}
	n := rdb.Incr(ctx, "rw:r").Val()
	maxScript.Run(ctx, rdb, []string{"rw:most"}, n)
	if w := rdb.Get(ctx, "rw:w").Val(); w != "0" && w != "" {
		rdb.Incr(ctx, "rw:bad")
	}
	rdb.Incr(ctx, "rw:reads")
	time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond) // load: hold time
	rdb.Decr(ctx, "rw:r")
	return l.Unlock(ctx)
}

func TestRWMutexBadInput(t *testing.T) {
	s := redistest.Start(t)
	c, _ := newClient(t, s)
	ctx := ctxT(t, 10*time.Second)
	if _, err := c.RWMutex("").RLock(ctx); !errors.Is(err, dlock.ErrInvalidArgument) || !strings.Contains(err.Error(), "empty") {
		t.Fatalf("empty name: %v", err)
	}
	if _, err := c.RWMutex("x", dlock.TTL(0)).Lock(ctx); !errors.Is(err, dlock.ErrInvalidArgument) || !strings.Contains(err.Error(), "TTL") {
		t.Fatalf("TTL 0: %v", err)
	}
	if _, err := c.RWMutex(strings.Repeat("n", dlock.MaxNameLen+1)).TryRLock(ctx); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Fatalf("oversized name: %v", err)
	}
	closed, _ := newClient(t, s)
	rw := closed.RWMutex("x")
	l, err := rw.RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = closed.Close()
	if _, err := rw.RLock(ctx); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("RLock after Close: %v", err)
	}
	if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("Unlock after Close: %v", err)
	}
	if !errors.Is(context.Cause(l.Context()), dlock.ErrClosed) {
		t.Fatalf("lease context cause after Close: %v", context.Cause(l.Context()))
	}
	// Close released the read lease: a writer gets in at once.
	w, err := c.RWMutex("x").TryLock(ctx)
	if err != nil {
		t.Fatalf("writer after the reader's Client closed: %v", err)
	}
	_ = w.Unlock(ctx)
}
