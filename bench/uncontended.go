package main

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Scenario 1: uncontended. G goroutines, each on its own key, lock+unlock
// back to back for a fixed time. Allocations are counted in a separate
// single-goroutine pass (runtime.MemStats.Mallocs delta / cycles), so other
// goroutines' work does not blur the count; background goroutines the library
// itself runs (renewal, pipelining) are counted, which is their cost.

// uncontendedRun is one timed run of one implementation.
type uncontendedRun struct {
	Impl         string  `json:"impl"`
	Round        int     `json:"round"`
	Goroutines   int     `json:"goroutines"`
	Seconds      float64 `json:"seconds"`
	Cycles       int64   `json:"cycles"`
	CyclesPerSec float64 `json:"cycles_per_sec"`
	Errors       int64   `json:"errors"`
	FirstError   string  `json:"first_error,omitempty"`
	// Mallocs delta / cycles over the timed run itself (all goroutines; the
	// other, idle implementations' background work included, which is small).
	ParallelAllocsPerCycle float64 `json:"parallel_allocs_per_cycle"`
	ParallelBytesPerCycle  float64 `json:"parallel_bytes_per_cycle"`
	// From the single-goroutine pass of the same round.
	AllocCycles    int64   `json:"alloc_cycles"`
	AllocsPerCycle float64 `json:"allocs_per_cycle"`
	BytesPerCycle  float64 `json:"bytes_per_cycle"`
	SerialMicros   float64 `json:"serial_us_per_cycle"`
	LoadAvg        float64 `json:"loadavg_1m"` // /proc/loadavg at the run's start
}

// maxCyclesPerGoroutine bounds every load loop in count as well as in time.
const maxCyclesPerGoroutine = 5_000_000

// uncontendedKey is goroutine g's key: distinct per implementation and goroutine,
// the same across rounds.
func uncontendedKey(impl string, g int) string {
	return fmt.Sprintf("bench:u:%s:%d", impl, g)
}

// runUncontended runs G goroutines for d and counts completed lock+unlock cycles.
func runUncontended(l locker, impl string, goroutines int, d time.Duration) uncontendedRun {
	// No deadline on the calls (libraries behave as they do for users without
	// one); a cancel well after d bounds any call that would hang.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	hard := time.AfterFunc(d+30*time.Second, cancel)
	defer hard.Stop()

	var (
		stop     atomic.Bool
		cycles   atomic.Int64
		errs     atomic.Int64
		firstErr atomic.Value
		wg       sync.WaitGroup
		startGun = make(chan struct{})
	)
	for g := range goroutines {
		key := uncontendedKey(impl, g)
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-startGun
			var n int64
			for i := 0; i < maxCyclesPerGoroutine && !stop.Load(); i++ {
				h, err := l.Lock(ctx, key)
				if err == nil {
					err = h.Unlock(ctx)
					if err == nil {
						n++
						continue
					}
				}
				errs.Add(1)
				firstErr.CompareAndSwap(nil, err.Error())
				if ctx.Err() != nil {
					break
				}
				time.Sleep(time.Millisecond) // do not spin on a failing server
			}
			cycles.Add(n)
		}()
	}
	load := loadAvg()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	close(startGun)
	timer := time.AfterFunc(d, func() { stop.Store(true) })
	wg.Wait()
	timer.Stop()
	elapsed := time.Since(start)
	runtime.ReadMemStats(&after)

	r := uncontendedRun{
		Impl:         impl,
		Goroutines:   goroutines,
		Seconds:      elapsed.Seconds(),
		Cycles:       cycles.Load(),
		CyclesPerSec: float64(cycles.Load()) / elapsed.Seconds(),
		Errors:       errs.Load(),
		LoadAvg:      load,
	}
	if r.Cycles > 0 {
		r.ParallelAllocsPerCycle = float64(after.Mallocs-before.Mallocs) / float64(r.Cycles)
		r.ParallelBytesPerCycle = float64(after.TotalAlloc-before.TotalAlloc) / float64(r.Cycles)
	}
	if v := firstErr.Load(); v != nil {
		r.FirstError = v.(string)
	}
	return r
}

// measureAllocs runs n lock+unlock cycles on one goroutine (after a short
// warm-up) and returns allocations and bytes per cycle and the serial cycle
// time. The loop is bounded by n and by maxTime.
func measureAllocs(l locker, impl string, n int, maxTime time.Duration) (cycles int64, allocs, bytes, micros float64, err error) {
	ctx := context.Background()
	key := uncontendedKey(impl, 1_000_000)
	cycle := func() error {
		h, err := l.Lock(ctx, key)
		if err != nil {
			return err
		}
		return h.Unlock(ctx)
	}
	for range 50 {
		if err := cycle(); err != nil {
			return 0, 0, 0, 0, err
		}
	}
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	deadline := start.Add(maxTime)
	var i int
	for i = 0; i < n; i++ {
		if err := cycle(); err != nil {
			return 0, 0, 0, 0, err
		}
		if i%64 == 63 && time.Now().After(deadline) {
			i++
			break
		}
	}
	elapsed := time.Since(start)
	runtime.ReadMemStats(&after)
	c := float64(i)
	return int64(i),
		float64(after.Mallocs-before.Mallocs) / c,
		float64(after.TotalAlloc-before.TotalAlloc) / c,
		float64(elapsed.Microseconds()) / c,
		nil
}
