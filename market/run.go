package market

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// readyTimeout bounds how long the workers may take to connect.
	readyTimeout = 30 * time.Second
	// drainTimeout bounds how long after the deadline the in-flight calls
	// may take before the cell is abandoned. Every retry loop and lock wait
	// stops at the deadline, so only a call inside its critical section (or
	// the release's bounded loop) can still be running.
	drainTimeout = 30 * time.Second
	// tickEvery is the interval of progress lines inside a long cell.
	tickEvery = 10 * time.Second
	// rerunFactor grows the inventory when a lister ran out anyway.
	rerunFactor = 4
)

// conner is a client that can hand out one dedicated connection.
type conner interface {
	Conn() *redis.Conn
}

// Run runs every load in cfg.Loads with every variant in cfg.Variants, one
// cell after the other, each on a freshly flushed database, and returns one
// Result per cell in that order (skipped dlock rows included when
// cfg.Locker is nil).
//
// An invalid cfg returns an error wrapping ErrInvalidConfig before Redis is
// touched. A Redis error, or ctx ending, stops the experiment and returns the
// results so far with the error. If every cell ran but some failed their
// conservation check, Run returns all results and a *CheckError.
func Run(ctx context.Context, cfg Config) ([]Result, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	admin := cfg.NewClient()
	defer admin.Close()
	if _, ok := admin.(conner); !ok {
		return nil, fmt.Errorf("%w: NewClient returned %T; the market needs a single-server client (*redis.Client)", ErrInvalidConfig, admin)
	}
	if err := admin.Ping(ctx).Err(); err != nil {
		return nil, fmt.Errorf("market: cannot reach Redis: %w", err)
	}
	rates := map[int]float64{} // pingRate by number of listers

	// Every round runs every load with every variant; a cell skipped for
	// want of a Locker is reported in the first round only.
	type planned struct {
		round int
		load  Load
		spec  *variantSpec
		skip  string
	}
	var plan []planned
	for round := 1; round <= cfg.Rounds; round++ {
		for _, load := range cfg.Loads {
			for _, name := range cfg.Variants {
				spec := specFor(name)
				skip := skipReason(cfg, spec)
				if skip == "" || round == 1 {
					plan = append(plan, planned{round, load, spec, skip})
				}
			}
		}
	}
	var results []Result
	var failed []string
	for n, c := range plan {
		load, name := c.load, c.spec.name
		tag := fmt.Sprintf("[%d/%d]", n+1, len(plan))
		where := fmt.Sprintf("%s %s", load, name)
		if cfg.Rounds > 1 {
			tag += fmt.Sprintf(" round %d", c.round)
			where += fmt.Sprintf(" (round %d)", c.round)
		}
		if c.skip != "" {
			r := baseResult(cfg, load, c.spec)
			r.Round, r.Skipped = c.round, c.skip
			results = append(results, r)
			progressf(cfg.Progress, "%s %-5s %-16s skipped: %s\n", tag, load, name, r.Skipped)
			continue
		}
		if _, ok := rates[load.Listers]; !ok {
			if rates[load.Listers], err = pingRate(ctx, cfg.NewClient, load.Listers); err != nil {
				return results, fmt.Errorf("market: measuring round trips: %w", err)
			}
		}
		inv := inventoryFor(cfg.Duration, rates[load.Listers], c.spec.listTrips)
		if cfg.inventory > 0 {
			inv = cfg.inventory
		}
		r, err := runCell(ctx, cfg, admin, load, c.spec, inv, tag)
		// Rerun a cell whose lister ran out; never hide a failed check.
		if err == nil && !r.Valid && r.Check == nil {
			progressf(cfg.Progress, "%s %-5s %-16s %s; running it again with %d× the inventory\n", tag, load, name, r.Invalid, rerunFactor)
			note := fmt.Sprintf("rerun: the first run was invalid (%s)", r.Invalid)
			r, err = runCell(ctx, cfg, admin, load, c.spec, inv*rerunFactor, tag)
			r.Notes = append(r.Notes, note)
		}
		if err != nil {
			return results, fmt.Errorf("market: %s: %w", where, err)
		}
		r.Round = c.round
		results = append(results, r)
		progressf(cfg.Progress, "%s %s\n", tag, cellLine(r))
		if r.Check != nil {
			failed = append(failed, fmt.Sprintf("%s: %v", where, r.Check))
		}
	}
	// Leave the database as empty as it was found.
	_ = admin.FlushDB(ctx).Err()
	if len(failed) > 0 {
		return results, &CheckError{Cells: failed}
	}
	return results, nil
}

// skipReason says why a variant cannot run with cfg's Locker ("": it can).
func skipReason(cfg Config, spec *variantSpec) string {
	if spec.lock != lockDlock {
		return ""
	}
	if cfg.Locker == nil {
		return cmp.Or(cfg.NoLocker, "no Locker configured")
	}
	if _, multi := cfg.Locker.(MultiLocker); spec.multi && !multi {
		return "the Locker locks no several names as one (not a MultiLocker)"
	}
	return ""
}

// progressf writes a progress line if w is not nil.
func progressf(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format, args...)
	}
}

// cellLine is the one-line summary of a finished cell.
func cellLine(r Result) string {
	verdict := "check ok"
	switch {
	case r.Check != nil:
		verdict = "CHECK FAILED: " + r.Check.Error()
	case !r.Valid:
		verdict = "INVALID: " + r.Invalid
	}
	return fmt.Sprintf("%-5s %-16s listed %9s  bought %9s  retries %9s  p99 %8s  %s",
		r.Load, r.Variant, count(r.Listed), count(r.Bought), count(r.Retries), dur(r.All.P99), verdict)
}

// baseResult fills the identifying fields of a cell's result.
func baseResult(cfg Config, load Load, spec *variantSpec) Result {
	return Result{
		Load:     load,
		Variant:  spec.name,
		Label:    spec.label,
		Improved: !spec.book,
		Pick:     cfg.Pick,
		Duration: cfg.Duration,
		Valid:    true,
	}
}

// runCell runs one load with one variant and checks conservation.
func runCell(ctx context.Context, cfg Config, admin redis.UniversalClient, load Load, spec *variantSpec, inventory int, tag string) (Result, error) {
	r := baseResult(cfg, load, spec)
	r.Inventory = int64(inventory)
	if err := setup(ctx, admin, load, inventory); err != nil {
		return r, fmt.Errorf("setup: %w", err)
	}

	cellCtx, cancelCell := context.WithCancel(ctx)
	defer cancelCell()

	workers := load.Listers + load.Buyers
	logs := make([]workerLog, workers)
	var ready, done sync.WaitGroup
	ready.Add(workers)
	done.Add(workers)
	startGate := make(chan struct{})
	clock := &cellClock{}
	var liveListed, liveBought atomic.Int64

	for i := range workers {
		client := cfg.NewClient()
		w := &logs[i]
		w.t = trader{spec: spec, locker: cfg.Locker, fault: cfg.fault}
		if i < load.Listers {
			w.seller = i + 1
		} else {
			w.buyer = firstBuyer + i - load.Listers
		}
		go func() {
			defer done.Done()
			defer client.Close()
			c, ok := client.(conner)
			if !ok {
				w.err = fmt.Errorf("NewClient returned %T, not a single-server client", client)
				ready.Done()
				return
			}
			conn := c.Conn()
			defer conn.Close()
			w.t.conn = conn
			w.err = conn.Ping(cellCtx).Err()
			ready.Done()
			select {
			case <-startGate:
			case <-cellCtx.Done():
				return
			}
			if w.err != nil || clock.stop == nil {
				return
			}
			w.t.stop, w.t.deadline = clock.stop, clock.deadline
			if w.seller > 0 {
				w.err = listerLoop(cellCtx, cfg, w, clock, inventory, &liveListed)
			} else {
				w.err = buyerLoop(cellCtx, cfg, w, clock, &liveBought)
			}
		}()
	}

	if !waitTimeout(&ready, readyTimeout) {
		cancelCell()
		close(startGate)
		done.Wait()
		return r, fmt.Errorf("workers did not connect within %v", readyTimeout)
	}
	if err := firstErr(logs); err != nil {
		cancelCell()
		close(startGate)
		done.Wait()
		return r, fmt.Errorf("connecting a worker: %w", err)
	}
	before, err := readServerStats(ctx, admin)
	cpu0, cpuOK := processCPU()
	if err != nil {
		cancelCell()
		close(startGate)
		done.Wait()
		return r, fmt.Errorf("INFO: %w", err)
	}

	clock.start = time.Now()
	clock.deadline = clock.start.Add(cfg.Duration)
	stopCtx, cancelStop := context.WithDeadline(cellCtx, clock.deadline)
	defer cancelStop()
	clock.stop = stopCtx
	close(startGate)

	finished := make(chan struct{})
	go func() { done.Wait(); close(finished) }()
	ticker := time.NewTicker(tickEvery)
	defer ticker.Stop()
	abandon := time.NewTimer(cfg.Duration + drainTimeout)
	defer abandon.Stop()
wait:
	for {
		select {
		case <-finished:
			break wait
		case <-ticker.C:
			if cfg.Duration >= 2*tickEvery {
				progressf(cfg.Progress, "%s %-5s %-16s %5.0fs/%v  listed %9s  bought %9s\n", tag, load, spec.name,
					time.Since(clock.start).Seconds(), cfg.Duration, count(liveListed.Load()), count(liveBought.Load()))
			}
		case <-abandon.C:
			cancelCell()
			<-finished
			return r, fmt.Errorf("calls still running %v after the deadline", drainTimeout)
		}
	}
	r.Elapsed = time.Since(clock.start)
	if err := ctx.Err(); err != nil {
		return r, err
	}
	if err := firstErr(logs); err != nil {
		return r, err
	}
	cpu1, _ := processCPU()
	after, err := readServerStats(ctx, admin)
	if err != nil {
		return r, fmt.Errorf("INFO: %w", err)
	}
	r.CommandCalls, r.Commands = diffCounts(before.calls, after.calls)
	r.CommandUsec = diffUsec(before.usec, after.usec)
	if after.reads > before.reads {
		r.RoundTrips = after.reads - before.reads - 1 // less the INFO that read "before"
	}
	r.RedisCPU = after.cpu - before.cpu
	if cpuOK {
		r.ClientCPU = cpu1 - cpu0
	}
	r.OpsPerSec = float64(r.Commands) / r.Elapsed.Seconds()

	aggregate(&r, logs, load)
	zcard, err := check(ctx, admin, load, inventory, logs)
	r.FinalZCard = zcard
	if err != nil {
		var cf checkFailure
		if !errors.As(err, &cf) {
			return r, fmt.Errorf("checking: %w", err)
		}
		r.Check = err
		r.CheckError = err.Error()
	}
	if r.UnlockFailures > 0 && r.Check == nil {
		r.Check = fmt.Errorf("%d releases found the lock no longer held", r.UnlockFailures)
		r.CheckError = r.Check.Error()
	}
	return r, nil
}

// aggregate sums the workers' logs into r.
func aggregate(r *Result, logs []workerLog, load Load) {
	var okLat, allLat []time.Duration
	var acquiring, releasing time.Duration
	var acquired int64
	for i := range logs {
		w := &logs[i]
		r.Listed += w.listed
		r.LateListed += w.lateListed
		r.Bought += w.purchased
		r.LateBought += w.lateBought
		r.Gone += w.gone
		r.NoFunds += w.noFunds
		r.Calls += w.calls
		if w.seller > 0 {
			r.ListTimeouts += w.timeouts
		} else {
			r.Timeouts += w.timeouts
		}
		if w.inFlight {
			r.InFlight++
		}
		r.Retries += w.t.retries
		r.ListRetries += w.t.listRetries
		r.LockFailures += w.t.lockFailures
		r.UnlockFailures += w.t.unlockFailures
		r.LockHeld += w.t.held
		r.LockSections += w.t.sections
		acquiring += w.t.acquiring
		releasing += w.t.releasing
		acquired += w.t.acquired
		r.ListCalls += w.listCalls
		if w.t.lockErr != nil && !slices.Contains(r.Notes, w.t.lockErr.Error()) && len(r.Notes) < 5 {
			r.Notes = append(r.Notes, w.t.lockErr.Error())
		}
		if w.exhausted && r.Valid {
			r.Valid = false
			r.Invalid = fmt.Sprintf("seller %d ran out of its %d items", w.seller, r.Inventory)
		}
		okLat = append(okLat, w.okLat...)
		allLat = append(allLat, w.allLat...)
	}
	ceiling(r)
	if acquired > 0 {
		r.AcquireMean = acquiring / time.Duration(acquired)
		r.ReleaseMean = releasing / time.Duration(acquired)
	}
	r.Success = summarize(okLat)
	r.All = summarize(allLat)
	if r.Bought > 0 {
		r.BookWait = time.Duration(float64(load.Buyers) * float64(r.Duration) / float64(r.Bought))
	}
}

// ceiling sets r's mean critical section from LockHeld and LockSections,
// and for a coarse row the share of the most one lock allows that it ran.
func ceiling(r *Result) {
	if r.LockSections <= 0 {
		return
	}
	r.CriticalSection = r.LockHeld / time.Duration(r.LockSections)
	if spec := specFor(r.Variant); spec != nil && spec.lock != lockNone && !spec.fine && r.Duration > 0 && r.CriticalSection > 0 {
		perSec := float64(r.LockSections) / r.Duration.Seconds()
		r.CeilingShare = perSec / (1 / r.CriticalSection.Seconds())
	}
}

// waitTimeout waits for wg, at most d; it reports whether wg finished.
func waitTimeout(wg *sync.WaitGroup, d time.Duration) bool {
	ch := make(chan struct{})
	go func() { wg.Wait(); close(ch) }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ch:
		return true
	case <-t.C:
		return false
	}
}

// firstErr returns the first worker error.
func firstErr(logs []workerLog) error {
	for i := range logs {
		if err := logs[i].err; err != nil {
			who := fmt.Sprintf("buyer %d", logs[i].buyer)
			if logs[i].seller > 0 {
				who = fmt.Sprintf("seller %d", logs[i].seller)
			}
			return fmt.Errorf("%s: %w", who, err)
		}
	}
	return nil
}
