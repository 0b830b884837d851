// Command bench measures dlock beside the raw Redis floor and its peers
// (redsync, bsm/redislock, rueidislock) in one run, on one Redis server:
//
//	cd bench && go run . -scenario all -duration 1s -rounds 15 -hot-duration 3s -hot-rounds 5 \
//	    -waiters 16,64 -impls raw,raw-autopipeline,dlock,dlock-norenew,redsync,redislock,rueidislock \
//	    -hot-impls raw,dlock,redsync,redislock,rueidislock \
//	    -json out.json -benchstat bench.txt -records records.jsonl
//
// (bench is its own module: from the repository root, `go -C bench run . ...`.)
//
// Scenarios:
//
//   - uncontended: 64 goroutines, each on its own key, lock+unlock back to back
//     for -duration; cycles/s, ratio to the raw floor (median of the per-round
//     ratios), allocations per cycle (single-goroutine pass).
//   - hotkey: one key, a 1ms critical section (time.Sleep), W waiters over 4
//     OS processes (this binary re-executed with -worker); hand-offs/s,
//     efficiency = hand-offs/s × (measured hold + PING RTT), waits, and the
//     longest wait against the bound (W−1) × (hold + RTT).
//   - quorum: five private masters; one goroutine's lock+unlock on one of
//     them, on all five, and on five with two killed or blackholed
//     (percentiles, ratios to one master and to the raw floors on the same
//     masters, CPU per cycle of this process and of the masters); TryLock
//     with three of five down (time against the per-master timeout, owners
//     left on the live masters). -quorum-latency 500us puts every live
//     master behind a proxy adding that much each way (masters on a network).
//
// Every implementation runs in every round, in an order rotated per round
// (interleaved), and the tables show medians over rounds. Unless -redis is
// given, the bench starts its own redis-server on a free loopback port
// (no persistence) and stops it at exit. The markdown tables go to stdout,
// progress to stderr; -json keeps every run, -benchstat writes one
// benchstat line per run.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

type options struct {
	scenario    string
	duration    time.Duration
	hotDuration time.Duration
	rounds      int
	hotRounds   int
	records     string
	waiters     []int
	procs       int
	goroutines  int
	impls       []*impl
	hotImpls    []*impl
	jsonPath    string
	benchPath   string
	redisURL    string
	redisServer string
	poolSize    int
	ttl         time.Duration
	retry       time.Duration
	hold        time.Duration
	settle      time.Duration
	tail        time.Duration
	allocCycles int
	// Quorum scenario.
	quorumImpls  []*impl
	quorumCycles int
	nodeTimeout  time.Duration
	tryAttempts  int
	// quorumLatency is added each way in front of every live master.
	quorumLatency time.Duration
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-worker" {
		if err := runWorker(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, "bench worker:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func parseFlags() (*options, error) {
	o := &options{}
	var waiters, impls, hotImpls, quorumImpls string
	flag.StringVar(&o.scenario, "scenario", "all", "uncontended, hotkey, all (both) or quorum")
	flag.DurationVar(&o.duration, "duration", 5*time.Second, "length of one measured run (uncontended; hotkey too unless -hot-duration)")
	flag.DurationVar(&o.hotDuration, "hot-duration", 0, "counted window of one hot-key run (default: -duration)")
	flag.IntVar(&o.rounds, "rounds", 5, "rounds; every implementation runs once per round, interleaved; medians are reported")
	flag.IntVar(&o.hotRounds, "hot-rounds", 0, "hot-key rounds (default: -rounds)")
	flag.StringVar(&o.records, "records", "", "hot key: write every acquisition of every run to this JSON-lines file (for charts)")
	flag.StringVar(&waiters, "waiters", "16,64", "hot-key waiter counts, comma-separated")
	flag.IntVar(&o.procs, "procs", 4, "hot-key worker processes the waiters are spread over")
	flag.IntVar(&o.goroutines, "goroutines", 64, "uncontended goroutines, each on its own key")
	flag.StringVar(&impls, "impls", "raw,dlock,redsync,redislock,rueidislock", "implementations, comma-separated; compiled in: "+strings.Join(knownImpls(false), ","))
	flag.StringVar(&hotImpls, "hot-impls", "", "hot-key implementations (default: -impls)")
	flag.StringVar(&o.jsonPath, "json", "", "write every run, the medians and the settings to this JSON file")
	flag.StringVar(&o.benchPath, "benchstat", "bench.txt", "write benchstat-format lines (one per run) to this file; empty: none")
	flag.StringVar(&o.redisURL, "redis", "", "use this Redis (redis://host:port) instead of starting a private redis-server")
	flag.StringVar(&o.redisServer, "redis-server", "redis-server", "redis-server binary to start when -redis is not given")
	flag.IntVar(&o.poolSize, "poolsize", 0, "go-redis PoolSize of the shared client (0: go-redis default, 10 × GOMAXPROCS)")
	flag.DurationVar(&o.ttl, "ttl", 10*time.Second, "lease length for every implementation")
	flag.DurationVar(&o.retry, "retry", time.Millisecond, "retry delay of the polling implementations (raw, redsync, redislock)")
	flag.DurationVar(&o.hold, "hold", time.Millisecond, "hot-key critical section (time.Sleep)")
	flag.DurationVar(&o.settle, "settle", 250*time.Millisecond, "hot-key: uncounted time after the common start")
	flag.DurationVar(&o.tail, "tail", 2*time.Second, "hot-key: load after the counted window, so late requests are served under full contention")
	flag.IntVar(&o.allocCycles, "alloc-cycles", 2000, "lock+unlock cycles of the single-goroutine allocation pass (bounded to 3s)")
	flag.StringVar(&quorumImpls, "quorum-impls", "raw,raw-majority,dlock,redsync", "quorum: implementations that run on several masters; compiled in: "+strings.Join(knownImpls(true), ","))
	flag.IntVar(&o.quorumCycles, "quorum-cycles", 2000, "quorum: serial lock+unlock cycles per run (bounded by -duration)")
	flag.DurationVar(&o.nodeTimeout, "node-timeout", 50*time.Millisecond, "quorum: per-master request timeout")
	flag.IntVar(&o.tryAttempts, "try-attempts", 20, "quorum: TryLocks per run with 3 of 5 masters down")
	flag.DurationVar(&o.quorumLatency, "quorum-latency", 0, "quorum: one-way latency a proxy adds in front of every live master, in every row (e.g. 500us for a 1ms round trip); 0: none")
	flag.Parse()
	if flag.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", flag.Args())
	}
	switch o.scenario {
	case "uncontended", "hotkey", "all", "quorum":
	default:
		return nil, fmt.Errorf("-scenario must be uncontended, hotkey, all or quorum, not %q", o.scenario)
	}
	if o.hotDuration == 0 {
		o.hotDuration = o.duration
	}
	if o.hotRounds == 0 {
		o.hotRounds = o.rounds
	}
	if o.rounds < 1 || o.hotRounds < 1 || o.duration <= 0 || o.hotDuration <= 0 || o.goroutines < 1 || o.procs < 1 {
		return nil, fmt.Errorf("-rounds, -duration, -goroutines and -procs must be positive")
	}
	if o.quorumCycles < 1 || o.quorumCycles > 1_000_000 || o.tryAttempts < 1 || o.tryAttempts > 1000 || o.nodeTimeout < time.Millisecond || o.nodeTimeout > 10*time.Second {
		return nil, fmt.Errorf("-quorum-cycles must be in 1..1000000, -try-attempts in 1..1000, -node-timeout in 1ms..10s")
	}
	if o.quorumLatency < 0 || o.quorumLatency > time.Second {
		return nil, fmt.Errorf("-quorum-latency must be in 0..1s, not %v", o.quorumLatency)
	}
	if o.duration > 10*time.Minute || o.hotDuration > 10*time.Minute || o.rounds > 100 || o.hotRounds > 100 {
		return nil, fmt.Errorf("runs are bounded: -duration at most 10m, -rounds at most 100")
	}
	for _, w := range strings.Split(waiters, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(w))
		if err != nil || n < 2 || n > 1024 {
			return nil, fmt.Errorf("-waiters: %q is not a count in 2..1024", w)
		}
		o.waiters = append(o.waiters, n)
	}
	var err error
	if o.impls, err = parseImpls(impls, false); err != nil {
		return nil, err
	}
	o.hotImpls = o.impls
	if o.quorumImpls, err = parseImpls(quorumImpls, true); err != nil {
		return nil, fmt.Errorf("-quorum-impls: %w", err)
	}
	if hotImpls != "" {
		if o.hotImpls, err = parseImpls(hotImpls, false); err != nil {
			return nil, err
		}
	}
	return o, nil
}

func run() error {
	o, err := parseFlags()
	if err != nil {
		return err
	}
	url := o.redisURL
	if url == "" {
		srv, err := startServer(o.redisServer)
		if err != nil {
			return err
		}
		defer srv.Close()
		url = "redis://" + srv.Addr()
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
		go func() {
			<-sig
			_ = srv.Close()
			os.Exit(130)
		}()
		logf("%s %s started on %s (pid %d)", o.redisServer, srv.Version(), srv.Addr(), srv.PID())
	}
	e, err := newEnv(url, o.poolSize, o.ttl, o.retry)
	if err != nil {
		return fmt.Errorf("connect %s: %w", url, err)
	}
	defer e.rdb.Close()

	rep := &report{
		Command:  strings.Join(os.Args, " "),
		Started:  time.Now().UTC().Format(time.RFC3339),
		Machine:  describeMachine(e),
		Settings: map[string]string{},
		Config: reportConfig{
			Scenario: o.scenario, Duration: o.duration.String(), HotDuration: o.hotDuration.String(),
			Rounds: o.rounds, HotRounds: o.hotRounds, Waiters: o.waiters, Procs: o.procs, Goroutines: o.goroutines,
			PoolSize: o.poolSize, TTL: o.ttl.String(), Retry: o.retry.String(), Hold: o.hold.String(),
			Settle: o.settle.String(), Tail: o.tail.String(), AllocCycles: o.allocCycles,
		},
	}
	lists := [][]*impl{o.impls, o.hotImpls}
	if o.scenario == "quorum" {
		lists = [][]*impl{o.quorumImpls}
	}
	for _, list := range lists {
		for _, im := range list {
			if _, dup := rep.Settings[im.name]; !dup {
				rep.Impls = append(rep.Impls, im.name)
				if o.scenario == "quorum" {
					rep.Settings[im.name] = im.quorum.settings(e, o.nodeTimeout)
				} else {
					rep.Settings[im.name] = im.settings(e)
				}
			}
		}
	}
	p50, p99 := sleepOvershoot(o.hold, 300)
	rep.SleepOvershoot = sleepStats{Sleep: o.hold.String(), P50Micros: p50 / 1e3, P99Micros: p99 / 1e3}
	logf("time.Sleep(%v) overshoot, idle: p50 %.0fµs p99 %.0fµs", o.hold, p50/1e3, p99/1e3)

	if o.scenario == "quorum" {
		if err := quorumScenario(o, e, rep); err != nil {
			return err
		}
	}
	if o.scenario == "uncontended" || o.scenario == "all" {
		if err := uncontendedScenario(o, e, rep); err != nil {
			return err
		}
	}
	if o.scenario == "hotkey" || o.scenario == "all" {
		if err := hotkeyScenario(o, e, url, rep); err != nil {
			return err
		}
	}
	rep.summarize()
	rep.Finished = time.Now().UTC().Format(time.RFC3339)

	rep.writeMarkdown(os.Stdout)
	if o.jsonPath != "" {
		b, err := marshalIndent(rep)
		if err != nil {
			return err
		}
		if err := os.WriteFile(o.jsonPath, append(b, '\n'), 0o644); err != nil {
			return err
		}
		logf("wrote %s", o.jsonPath)
	}
	if o.benchPath != "" {
		if err := os.WriteFile(o.benchPath, rep.benchstat(), 0o644); err != nil {
			return err
		}
		logf("wrote %s (compare runs with: benchstat old.txt new.txt)", o.benchPath)
	}
	return nil
}

// rotated returns impls rotated left by r, so that no implementation always
// runs first (or right after the same neighbour) in a round.
func rotated(impls []*impl, r int) []*impl {
	n := len(impls)
	out := make([]*impl, 0, n)
	for i := range n {
		out = append(out, impls[(i+r)%n])
	}
	return out
}

func uncontendedScenario(o *options, e *env, rep *report) error {
	lockers := map[string]locker{}
	defer func() {
		for _, l := range lockers {
			_ = l.Close()
		}
	}()
	for _, im := range o.impls {
		l, err := im.open(e)
		if err != nil {
			return fmt.Errorf("open %s: %w", im.name, err)
		}
		lockers[im.name] = l
		// Warm-up, not recorded: connections, scripts, first keys.
		w := runUncontended(l, im.name, o.goroutines, 300*time.Millisecond)
		if w.Cycles == 0 {
			return fmt.Errorf("%s: no cycle completed in warm-up: %s", im.name, w.FirstError)
		}
	}
	for r := range o.rounds {
		for _, im := range rotated(o.impls, r) {
			l := lockers[im.name]
			runtime.GC()
			run := runUncontended(l, im.name, o.goroutines, o.duration)
			run.Round = r + 1
			n, allocs, bytes, us, err := measureAllocs(l, im.name, o.allocCycles, 3*time.Second)
			if err != nil {
				return fmt.Errorf("%s allocation pass: %w", im.name, err)
			}
			run.AllocCycles, run.AllocsPerCycle, run.BytesPerCycle, run.SerialMicros = n, allocs, bytes, us
			rep.Uncontended = append(rep.Uncontended, run)
			logf("uncontended round %d/%d %-12s %9.0f cycles/s  %6.1f allocs/cycle  %6.1fµs serial  errors %d %s",
				r+1, o.rounds, im.name, run.CyclesPerSec, allocs, us, run.Errors, run.FirstError)
		}
	}
	return nil
}

func hotkeyScenario(o *options, e *env, url string, rep *report) error {
	var records *os.File
	if o.records != "" {
		f, err := os.Create(o.records)
		if err != nil {
			return err
		}
		defer f.Close()
		records = f
	}
	for r := range o.hotRounds {
		for _, w := range o.waiters {
			for _, im := range rotated(o.hotImpls, r) {
				rtt, err := measureRTT(e.rdb, 200)
				if err != nil {
					return err
				}
				run, rec, err := runHotkey(hotkeyParams{
					impl: im, url: url, poolSize: o.poolSize, ttl: o.ttl, retry: o.retry,
					waiters: w, procs: o.procs, hold: o.hold, settle: o.settle,
					window: o.hotDuration, tail: o.tail, round: r + 1, rttNanos: rtt,
				})
				if err != nil {
					return fmt.Errorf("hot key %s, %d waiters: %w", im.name, w, err)
				}
				rep.Hotkey = append(rep.Hotkey, run)
				if records != nil {
					if err := writeJSONLine(records, rec); err != nil {
						return err
					}
				}
				logf("hotkey round %d/%d %-12s W=%-3d %7.0f handoffs/s eff %.3f hold %.3fms rtt %.0fµs wait p50 %.1fms p99 %.1fms max %.1fms (%.1f× bound) censored %d overlaps %d errors %d %s",
					r+1, o.hotRounds, im.name, w, run.HandoffsPerSec, run.Efficiency, run.HoldMeanMS, run.RTTMicros,
					run.WaitP50MS, run.WaitP99MS, run.WaitMaxMS, run.MaxOverBound, run.Censored, run.Overlaps, run.Errors, run.FirstError)
				if run.Overlaps > 0 {
					logf("WARNING: %s: %d acquisitions overlapped the previous holder (mutual exclusion violated?)", im.name, run.Overlaps)
				}
				if run.WorkerFailures > 0 {
					logf("WARNING: %s: %d workers failed: %s", im.name, run.WorkerFailures, run.WorkerFailCause)
				}
			}
		}
	}
	return nil
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}
