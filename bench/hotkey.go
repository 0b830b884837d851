package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// Scenario 2: one hot key. W waiters spread over P worker processes each loop
// Lock, hold for cfg.Hold (time.Sleep: a busy-wait would take one of the two
// cores away from Redis and the other waiters), Unlock, and Lock again.
//
// Timeline of a run: start → settle (not counted: everyone starts at once)
// → window (counted) → tail (load goes on so that requests made late in the
// window are served under full contention) → end: Locks still waiting are
// cancelled and reported as pending.
//
// Counted: hand-offs whose acquisition falls in the window; waits of the
// requests made in the window (a request still pending at the end counts
// with its wait so far, a lower bound, and is reported as censored).

type hotkeyParams struct {
	impl     *impl
	url      string
	poolSize int
	ttl      time.Duration
	retry    time.Duration
	waiters  int
	procs    int
	hold     time.Duration
	settle   time.Duration
	window   time.Duration
	tail     time.Duration
	round    int
	rttNanos float64 // PING round trip measured just before the run
}

// hotkeyRun is the outcome of one run of one implementation.
type hotkeyRun struct {
	Impl    string `json:"impl"`
	Round   int    `json:"round"`
	Waiters int    `json:"waiters"`
	Procs   int    `json:"procs"`

	RTTMicros       float64 `json:"rtt_us"`       // median PING round trip, same run
	HoldMeanMS      float64 `json:"hold_mean_ms"` // measured hold: acquired → before Unlock
	HoldP50MS       float64 `json:"hold_p50_ms"`
	HoldP99MS       float64 `json:"hold_p99_ms"`
	Handoffs        int     `json:"handoffs"` // acquisitions in the window
	HandoffsPerSec  float64 `json:"handoffs_per_sec"`
	Efficiency      float64 `json:"efficiency"` // handoffs/s × (mean hold + RTT)
	GapP50MS        float64 `json:"gap_p50_ms"` // release (before Unlock) → next acquisition
	GapP99MS        float64 `json:"gap_p99_ms"`
	Requests        int     `json:"requests"` // requests made in the window
	Censored        int     `json:"censored"` // of those, still waiting at the end
	WaitP50MS       float64 `json:"wait_p50_ms"`
	WaitP99MS       float64 `json:"wait_p99_ms"`
	WaitMaxMS       float64 `json:"wait_max_ms"`
	BoundMS         float64 `json:"bound_ms"` // (waiters−1) × (mean hold + RTT)
	MaxOverBound    float64 `json:"max_over_bound"`
	MinPerWaiter    int     `json:"min_acquisitions_per_waiter"`
	MaxPerWaiter    int     `json:"max_acquisitions_per_waiter"`
	Overlaps        int     `json:"overlaps"` // acquisitions that began before the previous holder released: must be 0
	Errors          int     `json:"errors"`
	FirstError      string  `json:"first_error,omitempty"`
	WindowSeconds   float64 `json:"window_seconds"`
	TotalAcquired   int     `json:"total_acquired"`
	WorkerFailures  int     `json:"worker_failures"`
	WorkerFailCause string  `json:"worker_fail_cause,omitempty"`
	LoadAvg         float64 `json:"loadavg_1m"` // /proc/loadavg at the run's start: other processes share the machine
}

// runRecords is every acquisition of one run, for -records (charts).
type runRecords struct {
	Impl      string        `json:"impl"`
	Waiters   int           `json:"waiters"`
	Round     int           `json:"round"`
	Start     int64         `json:"start"`      // Unix ns
	CountFrom int64         `json:"count_from"` // counted window, Unix ns
	CountTo   int64         `json:"count_to"`
	End       int64         `json:"end"`
	Acquired  []acquisition `json:"acquired"` // [waiter, requested, acquired, releasing, released]
	Pending   []pending     `json:"pending"`  // [waiter, requested]
}

type workerProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	stdout *bufio.Reader
	done   chan struct{}
}

// runHotkey runs one hot-key run in p.procs worker processes.
func runHotkey(p hotkeyParams) (hotkeyRun, *runRecords, error) {
	exe, err := os.Executable()
	if err != nil {
		return hotkeyRun{}, nil, err
	}
	key := fmt.Sprintf("bench:hot:%s:w%d:r%d:%d", p.impl.name, p.waiters, p.round, time.Now().UnixNano())
	procs := min(p.procs, p.waiters)
	var ws []*workerProc
	defer func() {
		for _, w := range ws {
			select {
			case <-w.done:
			case <-time.After(5 * time.Second):
				_ = w.cmd.Process.Kill()
				<-w.done
			}
		}
	}()
	first := 0
	for i := range procs {
		n := p.waiters / procs
		if i < p.waiters%procs {
			n++
		}
		cfg := workerConfig{
			Impl: p.impl.name, URL: p.url, PoolSize: p.poolSize, TTL: p.ttl, Retry: p.retry,
			Key: key, Worker: i, First: first, Waiters: n,
			Hold: p.hold, Settle: p.settle, Window: p.window, Tail: p.tail,
		}
		first += n
		w, err := startWorker(exe, i)
		if err != nil {
			return hotkeyRun{}, nil, err
		}
		ws = append(ws, w)
		if err := writeJSONLine(w.stdin, cfg); err != nil {
			return hotkeyRun{}, nil, fmt.Errorf("worker %d: %w", i, err)
		}
	}
	for i, w := range ws {
		var r workerResult
		if err := readWithTimeout(w, &r, 60*time.Second); err != nil || !r.Ready {
			return hotkeyRun{}, nil, fmt.Errorf("worker %d not ready: %v", i, err)
		}
	}
	start := time.Now().Add(100 * time.Millisecond)
	for i, w := range ws {
		if err := writeJSONLine(w.stdin, workerStart{Start: start.UnixNano()}); err != nil {
			return hotkeyRun{}, nil, fmt.Errorf("worker %d: %w", i, err)
		}
	}
	limit := time.Until(start) + p.settle + p.window + p.tail + 30*time.Second
	var results []workerResult
	run := hotkeyRun{Impl: p.impl.name, Round: p.round, Waiters: p.waiters, Procs: procs, LoadAvg: loadAvg()}
	for i, w := range ws {
		var r workerResult
		if err := readWithTimeout(w, &r, limit); err != nil {
			run.WorkerFailures++
			if run.WorkerFailCause == "" {
				run.WorkerFailCause = fmt.Sprintf("worker %d: %v", i, err)
			}
			continue
		}
		results = append(results, r)
		_ = w.stdin.Close()
	}
	analyzeHotkey(&run, p, start, results)
	rec := &runRecords{
		Impl: p.impl.name, Waiters: p.waiters, Round: p.round, Start: start.UnixNano(),
		CountFrom: start.Add(p.settle).UnixNano(), CountTo: start.Add(p.settle + p.window).UnixNano(),
		End: start.Add(p.settle + p.window + p.tail).UnixNano(),
	}
	for _, r := range results {
		rec.Acquired = append(rec.Acquired, r.Acquired...)
		rec.Pending = append(rec.Pending, r.Pending...)
	}
	return run, rec, nil
}

func startWorker(exe string, i int) (*workerProc, error) {
	cmd := exec.Command(exe, "-worker")
	cmd.Env = os.Environ()
	cmd.Stderr = &prefixWriter{prefix: fmt.Sprintf("[worker %d] ", i), w: os.Stderr}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	// An os.Pipe of our own rather than StdoutPipe: Wait closes StdoutPipe's
	// read end when the worker exits, which can race with reading its last line.
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout = pw
	err = cmd.Start()
	_ = pw.Close()
	if err != nil {
		_ = pr.Close()
		return nil, err
	}
	w := &workerProc{cmd: cmd, stdin: stdin, stdout: bufio.NewReaderSize(pr, 1<<20), done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(w.done) }()
	return w, nil
}

// readWithTimeout reads one JSON line from w, killing w if none comes in d.
func readWithTimeout(w *workerProc, v any, d time.Duration) error {
	errc := make(chan error, 1)
	go func() { errc <- readJSONLine(w.stdout, v) }()
	select {
	case err := <-errc:
		return err
	case <-time.After(d):
		_ = w.cmd.Process.Kill()
		return fmt.Errorf("no answer within %v; killed", d)
	}
}

func analyzeHotkey(run *hotkeyRun, p hotkeyParams, start time.Time, results []workerResult) {
	from := start.Add(p.settle).UnixNano()
	to := start.Add(p.settle + p.window).UnixNano()
	end := start.Add(p.settle + p.window + p.tail).UnixNano()
	run.WindowSeconds = p.window.Seconds()
	run.RTTMicros = p.rttNanos / 1e3

	var all []acquisition
	var pend []pending
	for _, r := range results {
		all = append(all, r.Acquired...)
		pend = append(pend, r.Pending...)
		run.Errors += r.Errors
		if run.FirstError == "" {
			run.FirstError = r.FirstError
		}
	}
	run.TotalAcquired = len(all)
	sort.Slice(all, func(i, j int) bool { return all[i][2] < all[j][2] })

	var holds, gaps, waits []float64
	perWaiter := make(map[int64]int, p.waiters)
	for i := range p.waiters {
		perWaiter[int64(i)] = 0
	}
	var lastRelease int64
	for i, a := range all {
		if i > 0 && a[2] < lastRelease {
			run.Overlaps++
		}
		lastRelease = max(lastRelease, a[3])
		if a[2] >= from && a[2] < to {
			run.Handoffs++
			holds = append(holds, float64(a[3]-a[2]))
			perWaiter[a[0]]++
			if i > 0 {
				gaps = append(gaps, float64(a[2]-all[i-1][3]))
			}
		}
		if a[1] >= from && a[1] < to {
			waits = append(waits, float64(a[2]-a[1]))
		}
	}
	for _, q := range pend {
		if q[1] >= from && q[1] < to {
			run.Censored++
			waits = append(waits, float64(end-q[1]))
		}
	}
	run.Requests = len(waits)
	run.HandoffsPerSec = float64(run.Handoffs) / p.window.Seconds()
	holdMean := mean(holds)
	run.HoldMeanMS = durMS(holdMean)
	run.HoldP50MS = durMS(quantile(holds, 0.5))
	run.HoldP99MS = durMS(quantile(holds, 0.99))
	run.GapP50MS = durMS(quantile(gaps, 0.5))
	run.GapP99MS = durMS(quantile(gaps, 0.99))
	slices.Sort(waits)
	run.WaitP50MS = durMS(sortedQuantile(waits, 0.5))
	run.WaitP99MS = durMS(sortedQuantile(waits, 0.99))
	if len(waits) > 0 {
		run.WaitMaxMS = durMS(waits[len(waits)-1])
	}
	cycle := holdMean + p.rttNanos
	run.Efficiency = run.HandoffsPerSec * cycle / 1e9
	run.BoundMS = durMS(float64(p.waiters-1) * cycle)
	run.MaxOverBound = run.WaitMaxMS / run.BoundMS
	run.MinPerWaiter = math.MaxInt
	for _, n := range perWaiter {
		run.MinPerWaiter = min(run.MinPerWaiter, n)
		run.MaxPerWaiter = max(run.MaxPerWaiter, n)
	}
}

// measureRTT returns the median of n sequential PINGs, in nanoseconds.
func measureRTT(rdb *redis.Client, n int) (float64, error) {
	ctx := context.Background()
	xs := make([]float64, 0, n)
	for range n {
		t := time.Now()
		if err := rdb.Ping(ctx).Err(); err != nil {
			return 0, err
		}
		xs = append(xs, float64(time.Since(t)))
	}
	return median(xs), nil
}

// sleepOvershoot measures how much longer than d a time.Sleep(d) takes here
// (n samples): median and p99 of the excess, in nanoseconds.
func sleepOvershoot(d time.Duration, n int) (p50, p99 float64) {
	xs := make([]float64, 0, n)
	for range n {
		t := time.Now()
		time.Sleep(d)
		xs = append(xs, float64(time.Since(t)-d))
	}
	return quantile(xs, 0.5), quantile(xs, 0.99)
}

// prefixWriter prefixes each line a worker writes to stderr.
type prefixWriter struct {
	prefix string
	w      io.Writer
	buf    []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.buf = append(p.buf, b...)
	for {
		i := strings.IndexByte(string(p.buf), '\n')
		if i < 0 {
			break
		}
		fmt.Fprintf(p.w, "%s%s\n", p.prefix, p.buf[:i])
		p.buf = p.buf[i+1:]
	}
	return len(b), nil
}
