package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faults"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/wire"
)

// stressHeld is one lease believed valid: from Lock's return until its
// Unlock call (unlocking set) or its context's end.
type stressHeld struct {
	l         *dlock.Lease
	client    int
	fence     uint64
	at        time.Time
	unlocking bool
}

// TestReviewStress (exploratory; runs only with DLOCK_REVIEW_STRESS=seconds):
// several Clients with random faults on every script lock one name with
// Mutex (default or Fair), Semaphore or RWMutex; at every grant it checks
// that no other lease of the name is believed valid beyond what the
// primitive allows, and that mutex fences increase in grant order.
func TestReviewStress(t *testing.T) {
	secs, _ := strconv.Atoi(os.Getenv("DLOCK_REVIEW_STRESS"))
	if secs <= 0 {
		t.Skip("DLOCK_REVIEW_STRESS=seconds runs it")
	}
	seed, _ := strconv.ParseUint(os.Getenv("DLOCK_REVIEW_SEED"), 10, 64)
	kind := os.Getenv("DLOCK_REVIEW_KIND") // mutex, fair, sem, rw
	if kind == "" {
		kind = "mutex"
	}
	s := redistest.Start(t)
	ctx := ctxT(t, time.Duration(secs+60)*time.Second)
	const nClients = 3
	var clients []*dlock.Client
	var ins []*faults.Injector
	for i := 0; i < nClients; i++ {
		rules := []faults.Rule{
			{Kind: faults.DelaySend, P: 0.04, Min: 0, Max: 60 * time.Millisecond},
			{Kind: faults.DelayReply, P: 0.04, Min: 0, Max: 60 * time.Millisecond},
			{Kind: faults.LoseReply, P: 0.02, Min: 0, Max: 40 * time.Millisecond},
			{Kind: faults.FailSend, P: 0.01, Min: 0, Max: 20 * time.Millisecond},
		}
		plain := s.Client(t)
		for _, sc := range wire.Scripts() {
			if err := plain.ScriptLoad(ctx, sc.Src).Err(); err != nil {
				t.Fatal(err)
			}
		}
		in := faults.New(faults.Config{Seed: seed*10 + uint64(i), Scripts: engineScripts(t), Rules: rules, MaxDelay: time.Second})
		rdb := s.Client(t)
		rdb.AddHook(in)
		c := dlock.New(rdb)
		t.Cleanup(func() { _ = c.Close() })
		clients = append(clients, c)
		ins = append(ins, in)
	}
	var (
		mu        sync.Mutex
		held      = map[*stressHeld]bool{}
		lastFence uint64
		grants    int
		failures  []string
	)
	fail := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		failures = append(failures, msg)
	}
	const size = 3
	ttl := 400 * time.Millisecond
	// writer: permits = size (sem) or writer (rw); reader: 1.
	check := func(me *stressHeld, permits int64, writer bool) {
		mu.Lock()
		defer mu.Unlock()
		grants++
		used := permits
		for o := range held {
			if o.unlocking || o.l.Context().Err() != nil {
				continue
			}
			switch kind {
			case "mutex", "fair":
				fail("grant %d (client %d, fence %d) while lease of client %d (fence %d, granted %v before) is believed valid",
					grants, me.client, me.fence, o.client, o.fence, me.at.Sub(o.at))
			case "rw":
				if writer || o.fence == 0 { // fence 0 marks a writer below
					fail("rw: grant %d writer=%v (client %d) while a %s of client %d is believed valid", grants, writer, me.client,
						map[bool]string{true: "writer", false: "reader"}[o.fence == 0], o.client)
				}
			}
		}
		if kind == "sem" {
			for o := range held {
				if !o.unlocking && o.l.Context().Err() == nil {
					used += int64(o.fence) // permits, for sem
				}
			}
			if used > size {
				fail("sem: %d permits believed held, size %d", used, size)
			}
		}
		if kind == "mutex" || kind == "fair" {
			if me.fence <= lastFence {
				fail("fence %d granted after %d", me.fence, lastFence)
			}
			lastFence = me.fence
		}
		held[me] = true
	}
	end := time.Now().Add(time.Duration(secs) * time.Second)
	var wg sync.WaitGroup
	for g := 0; g < 4*nClients; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(g)))
			ci := g % nClients
			c := clients[ci]
			for time.Now().Before(end) {
				var opts []dlock.LockOption
				opts = append(opts, dlock.TTL(ttl))
				wait := time.Duration(r.IntN(300)) * time.Millisecond
				if r.IntN(3) == 0 {
					wait = 2 * time.Second
				}
				lctx, cancel := context.WithTimeout(ctx, wait)
				var l *dlock.Lease
				var err error
				var permits int64 = 1
				writer := false
				switch kind {
				case "mutex":
					l, err = c.Mutex("s", opts...).Lock(lctx)
				case "fair":
					opts = append(opts, dlock.Fair())
					l, err = c.Mutex("s", opts...).Lock(lctx)
				case "sem":
					permits = int64(1 + r.IntN(size))
					l, err = c.Semaphore("s", size, opts...).Acquire(lctx, permits)
				case "rw":
					writer = r.IntN(3) == 0
					if writer {
						l, err = c.RWMutex("s", opts...).Lock(lctx)
					} else {
						l, err = c.RWMutex("s", opts...).RLock(lctx)
					}
				}
				cancel()
				if err != nil {
					if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) && ctx.Err() == nil {
						t.Logf("lock: %v", err)
					}
					continue
				}
				me := &stressHeld{l: l, client: ci, fence: l.Fence(), at: time.Now()}
				switch kind {
				case "sem":
					me.fence = uint64(permits)
				case "rw":
					if writer {
						me.fence = 0
					} else {
						me.fence = 1
					}
				}
				check(me, permits, writer)
				if r.IntN(10) == 0 {
					time.Sleep(time.Duration(r.IntN(int(ttl/time.Millisecond))) * time.Millisecond)
				} else {
					time.Sleep(time.Duration(r.IntN(3000)) * time.Microsecond)
				}
				if r.IntN(8) == 0 {
					ectx, cancel := context.WithTimeout(ctx, time.Duration(r.IntN(50))*time.Millisecond)
					_ = l.Extend(ectx, time.Duration(100+r.IntN(800))*time.Millisecond)
					cancel()
				}
				mu.Lock()
				me.unlocking = true
				mu.Unlock()
				switch r.IntN(4) {
				case 0: // ended ctx
					ectx, cancel := context.WithCancel(ctx)
					cancel()
					_ = l.Unlock(ectx)
				case 1: // two at once
					var w2 sync.WaitGroup
					w2.Add(2)
					for range 2 {
						go func() { defer w2.Done(); _ = l.Unlock(ctx) }()
					}
					w2.Wait()
				default:
					uctx, cancel := context.WithTimeout(ctx, time.Duration(1+r.IntN(100))*time.Millisecond)
					_ = l.Unlock(uctx)
					cancel()
				}
				mu.Lock()
				delete(held, me)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	returned := time.Now()
	// Nothing may stay held longer than one TTL (at most 900ms after an
	// Extend) after every caller returned.
	time.Sleep(time.Second + 100*time.Millisecond)
	rdb := s.Client(t)
	if o, _ := rdb.HGet(ctx, "dlock:{s}", "o").Result(); o != "" {
		t.Errorf("owner %q still at Redis %v after every caller returned", o, time.Since(returned))
	}
	if u, _ := rdb.HGet(ctx, "dlock:{s}", "u").Result(); u != "" && u != "0" {
		t.Errorf("u=%s permits still held %v after every caller returned; holders %v", u, time.Since(returned), rdb.ZRangeWithScores(ctx, "dlock:{s}:h", 0, -1).Val())
	}
	mu.Lock()
	defer mu.Unlock()
	t.Logf("%s seed %d: %d grants", kind, seed, grants)
	for i, in := range ins {
		t.Logf("client %d faults: %s", i, in.Summary())
	}
	for i, f := range failures {
		if i > 20 {
			break
		}
		t.Error(f)
	}
}
