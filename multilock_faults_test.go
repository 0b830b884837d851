package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faults"
	"github.com/dlock-go/dlock/internal/redistest"
)

// TestMultiLockAcquireFaults: the replies of multi_acquire.lua are lost,
// delayed (some past the lease's validity), cut or never sent, at random
// from a seed, while goroutines on three Clients lock random overlapping
// sets of five names (Lock and TryLock). No name is ever held by two live
// leases at once, fences of each name increase in grant order, calls keep
// succeeding, and once the faults stop every name is free again within
// the TTL (what an acquire of unknown outcome took is given back).
func TestMultiLockAcquireFaults(t *testing.T) {
	seed, replay := envSeed(t)
	if !replay {
		seed = rand.Uint64N(1 << 40)
	}
	driver := ""
	if onRueidis() {
		driver = driverEnv + "=rueidis "
	}
	t.Logf("seed %d (replay: DLOCK_SEED=%d %sgo test -race -count=1 -run '^%s$' .)", seed, seed, driver, t.Name())
	s := redistest.Start(t)
	_, rdb := newClient(t, s)
	loadScripts(t, rdb)
	ctx := ctxT(t, 30*time.Second)
	const ttl = time.Second
	ms := time.Millisecond
	var ins []*faults.Injector
	var clients []*dlock.Client
	for i := range 3 {
		in := faults.New(faults.Config{Seed: seed*10 + uint64(i), Scripts: faults.EngineScripts(), MaxDelay: 2 * time.Second, Rules: []faults.Rule{
			{Script: "multi_acquire", Kind: faults.DelayReply, P: 0.01, Min: ttl + 50*ms, Max: ttl + 300*ms},
			{Script: "multi_acquire", Kind: faults.LoseReply, P: 0.05, Max: 100 * ms},
			{Script: "multi_acquire", Kind: faults.DelaySend, P: 0.05, Max: 150 * ms},
			{Script: "multi_acquire", Kind: faults.DelayReply, P: 0.05, Max: 150 * ms},
			{Script: "multi_acquire", Kind: faults.Cut, P: 0.03},
			{Script: "multi_acquire", Kind: faults.FailSend, P: 0.03, Max: 30 * ms},
			{Script: "release", Kind: faults.LoseReply, P: 0.03, Max: 50 * ms},
		}})
		r := s.Client(t)
		injectFaults(t, r, in)
		c := newDlock(t, r)
		t.Cleanup(func() { _ = c.Close() })
		ins, clients = append(ins, in), append(clients, c)
	}
	names := []string{"mf/0", "mf/1", "mf/2", "mf/3", "mf/4"}
	var mu sync.Mutex
	holder := map[string]*dlock.Lease{}
	last := map[string]uint64{}
	var obtained, refused, failed atomic.Int64
	stop := time.Now().Add(2500 * time.Millisecond)
	var wg sync.WaitGroup
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(g)))
			c := clients[g%len(clients)]
			for time.Now().Before(stop) {
				set := slices.Clone(names)
				r.Shuffle(len(set), func(i, j int) { set[i], set[j] = set[j], set[i] })
				set = set[:2+r.IntN(3)]
				ml := c.MultiLock(set, dlock.TTL(ttl))
				cctx, cancel := context.WithTimeout(ctx, 1500*ms)
				var l *dlock.Lease
				var err error
				if r.IntN(3) == 0 {
					l, err = ml.TryLock(cctx)
				} else {
					l, err = ml.Lock(cctx)
				}
				cancel()
				switch {
				case errors.Is(err, dlock.ErrNotObtained):
					refused.Add(1)
					continue
				case err != nil:
					failed.Add(1)
					continue
				}
				obtained.Add(1)
				mu.Lock()
				if l.Context().Err() == nil {
					for _, n := range set {
						if h := holder[n]; h != nil && h.Context().Err() == nil {
							t.Errorf("%s held by two live leases (fences %d and %d)", n, h.FenceOf(n), l.FenceOf(n))
						}
						if f := l.FenceOf(n); f <= last[n] {
							t.Errorf("%s: fence %d granted after %d", n, f, last[n])
						}
						holder[n], last[n] = l, l.FenceOf(n)
					}
				}
				mu.Unlock()
				time.Sleep(time.Duration(r.IntN(2000)) * time.Microsecond)
				mu.Lock()
				for _, n := range set {
					if holder[n] == l {
						delete(holder, n)
					}
				}
				mu.Unlock()
				uctx, cancel := context.WithTimeout(ctx, 2*time.Second)
				_ = l.Unlock(uctx)
				cancel()
			}
		}()
	}
	wg.Wait()
	for _, in := range ins {
		in.SetEnabled(false)
	}
	var injected string
	for _, in := range ins {
		injected += in.Summary() + "; "
	}
	t.Logf("obtained %d, refused %d, failed %d; faults: %s", obtained.Load(), refused.Load(), failed.Load(), injected)
	if obtained.Load() < 20 {
		t.Errorf("only %d MultiLocks obtained in 2.5s: no progress", obtained.Load())
	}
	// Every name free again within the TTL after the last call (plus the
	// delays still in flight).
	waitWithin(t, ctx, ttl+2*time.Second, "every name free once the faults stopped", func() bool {
		for _, n := range names {
			if owner(ctx, rdb, n) != "" {
				return false
			}
		}
		return true
	})
	if t.Failed() {
		fmt.Printf("replay: DLOCK_SEED=%d\n", seed)
	}
}

// TestMultiLockAcquireReplyLost: a TryLock whose multi_acquire.lua ran but
// whose reply was lost reports failure or, if a resend found the names its
// token's, success; after a failure every name is free again well before
// its 10s TTL (given back with the token). A reply that comes after the
// leases it granted may have expired is not obtained, and given back at
// once. A Lock asks again with the same token and gets the names.
func TestMultiLockAcquireReplyLost(t *testing.T) {
	s := redistest.Start(t)
	_, rdb := newClient(t, s)
	names := []string{"ml-lost/a", "ml-lost/b", "ml-lost/c"}
	ctx := ctxT(t, 20*time.Second)
	free := func(what string, within time.Duration) {
		t.Helper()
		waitWithin(t, ctx, within, what+": every name free", func() bool {
			for _, n := range names {
				if owner(ctx, rdb, n) != "" {
					return false
				}
			}
			return true
		})
	}
	for _, kind := range []faults.Kind{faults.LoseReply, faults.Cut} {
		c, _ := reviewClient(t, s, time.Second, nil, faults.Rule{Script: "multi_acquire", Kind: kind, Calls: []int{1}, Max: 50 * time.Millisecond})
		l, err := c.MultiLock(names, dlock.TTL(10*time.Second)).TryLock(ctx)
		if err == nil {
			for _, n := range names {
				if o := owner(ctx, rdb, n); o != l.Token() {
					t.Fatalf("%v: TryLock succeeded, but %s is owned by %q, not %q", kind, n, o, l.Token())
				}
			}
			if err := l.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("%v: TryLock: %v", kind, err)
		free(kind.String()+" TryLock", 2*time.Second)
	}
	late, _ := reviewClient(t, s, 2*time.Second, nil, faults.Rule{Script: "multi_acquire", Kind: faults.DelayReply, Calls: []int{1}, Min: 550 * time.Millisecond, Max: 600 * time.Millisecond})
	if _, err := late.MultiLock(names, dlock.TTL(500*time.Millisecond)).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock granted past its TTL: %v, want ErrNotObtained", err)
	}
	free("late grant", 200*time.Millisecond) // given back before TryLock returned: not left to the TTL
	c, _ := reviewClient(t, s, time.Second, nil, faults.Rule{Script: "multi_acquire", Kind: faults.LoseReply, Calls: []int{1, 2}, Max: 50 * time.Millisecond})
	l, err := c.MultiLock(names, dlock.TTL(10*time.Second)).Lock(ctx)
	if err != nil {
		t.Fatalf("Lock after two lost replies: %v", err)
	}
	for _, n := range names {
		if o := owner(ctx, rdb, n); o != l.Token() {
			t.Fatalf("Lock: %s owned by %q, not the lease's %q", n, o, l.Token())
		}
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	free("Unlock", time.Second)
}

// TestMultiLockRetryEndsAtClose: a MultiLock.Lock whose group acquire keeps
// failing with an unknown outcome (never sent: connection refused) retries
// it with a backoff that grows to 500 ms. Close must end that wait at once,
// as it ends a Mutex's: the Lock returns ErrClosed right after Close is
// called, not once its pause is over. Close is called just after a failed
// attempt, when a whole pause is ahead.
func TestMultiLockRetryEndsAtClose(t *testing.T) {
	s := redistest.Start(t)
	c, in := reviewClient(t, s, time.Second, nil, faults.Rule{Script: "multi_acquire", Kind: faults.FailSend, P: 1})
	ctx := ctxT(t, 30*time.Second)
	failed := func() int {
		n := 0
		for k, v := range in.Stats() {
			if strings.HasPrefix(k, "multi_acquire ") {
				n += v
			}
		}
		return n
	}
	done := make(chan error, 1)
	go func() {
		l, err := c.MultiLock([]string{"ml-close/a", "ml-close/b"}).Lock(ctx)
		if err == nil {
			err = fmt.Errorf("obtained %v", l.Names())
		}
		done <- err
	}()
	// 1+2+...+256 ms of pauses after nine failures: the tenth is followed
	// by one of the full 500 ms.
	waitFor(t, ctx, "ten failed group acquires", func() bool { return failed() >= 10 })
	n := failed()
	waitWithin(t, ctx, 2*time.Second, "the next failed group acquire", func() bool { return failed() > n })
	closing := time.Now()
	closed := make(chan error, 1)
	go func() { closed <- c.Close() }()
	select {
	case err := <-done:
		if took := time.Since(closing); took > 250*time.Millisecond {
			t.Errorf("Lock returned %v after Close was called: its retry's pause did not end at Close", took.Round(time.Millisecond))
		}
		if !errors.Is(err, dlock.ErrClosed) {
			t.Errorf("Lock: %v, want ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Lock did not return within 5 s of Close")
	}
	if err := <-closed; err != nil {
		t.Fatalf("Close: %v", err)
	}
}
