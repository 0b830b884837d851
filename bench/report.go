package main

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"strings"
	"time"
)

type reportConfig struct {
	Scenario    string `json:"scenario"`
	Duration    string `json:"duration"`
	HotDuration string `json:"hot_duration"`
	Rounds      int    `json:"rounds"`
	HotRounds   int    `json:"hot_rounds"`
	Waiters     []int  `json:"waiters"`
	Procs       int    `json:"procs"`
	Goroutines  int    `json:"goroutines"`
	PoolSize    int    `json:"pool_size"`
	TTL         string `json:"ttl"`
	Retry       string `json:"retry"`
	Hold        string `json:"hold"`
	Settle      string `json:"settle"`
	Tail        string `json:"tail"`
	AllocCycles int    `json:"alloc_cycles"`
	// Quorum scenario.
	QuorumCycles int    `json:"quorum_cycles,omitempty"`
	NodeTimeout  string `json:"node_timeout,omitempty"`
	TryAttempts  int    `json:"try_attempts,omitempty"`
	// QuorumLatency is what a proxy adds each way in front of every live
	// master (empty: none).
	QuorumLatency string `json:"quorum_latency,omitempty"`
	// QuorumRTTMicros is the median PING round trip through that proxy.
	QuorumRTTMicros float64 `json:"quorum_ping_rtt_us,omitempty"`
}

type sleepStats struct {
	Sleep     string  `json:"sleep"`
	P50Micros float64 `json:"overshoot_p50_us"`
	P99Micros float64 `json:"overshoot_p99_us"`
}

type uncontendedSummary struct {
	Impl           string  `json:"impl"`
	Rounds         int     `json:"rounds"`
	CyclesPerSec   float64 `json:"cycles_per_sec"`
	RatioToRaw     float64 `json:"ratio_to_raw"` // median of per-round ratios
	ParallelAllocs float64 `json:"parallel_allocs_per_cycle"`
	AllocsPerCycle float64 `json:"allocs_per_cycle"`
	BytesPerCycle  float64 `json:"bytes_per_cycle"`
	SerialMicros   float64 `json:"serial_us_per_cycle"`
	Errors         int64   `json:"errors"`
}

type hotkeySummary struct {
	Impl           string  `json:"impl"`
	Waiters        int     `json:"waiters"`
	Rounds         int     `json:"rounds"`
	HandoffsPerSec float64 `json:"handoffs_per_sec"`
	Efficiency     float64 `json:"efficiency"`
	HoldMeanMS     float64 `json:"hold_mean_ms"`
	RTTMicros      float64 `json:"rtt_us"`
	GapP50MS       float64 `json:"gap_p50_ms"`
	WaitP50MS      float64 `json:"wait_p50_ms"`
	WaitP99MS      float64 `json:"wait_p99_ms"`
	WaitMaxMS      float64 `json:"wait_max_ms"`
	WorstMaxMS     float64 `json:"worst_wait_max_ms"` // largest over rounds
	BoundMS        float64 `json:"bound_ms"`
	MaxOverBound   float64 `json:"max_over_bound"`
	Censored       int     `json:"censored"` // summed over rounds
	Overlaps       int     `json:"overlaps"` // summed over rounds; must be 0
	Errors         int     `json:"errors"`   // summed over rounds
}

// report is everything one bench run produced; -json writes it whole.
type report struct {
	Command        string            `json:"command"`
	Started        string            `json:"started"`
	Finished       string            `json:"finished"`
	Machine        machine           `json:"machine"`
	Config         reportConfig      `json:"config"`
	Impls          []string          `json:"impls"`
	Settings       map[string]string `json:"settings"`
	SleepOvershoot sleepStats        `json:"sleep_overshoot"`

	Uncontended        []uncontendedRun     `json:"uncontended_runs,omitempty"`
	Hotkey             []hotkeyRun          `json:"hotkey_runs,omitempty"`
	UncontendedMedians []uncontendedSummary `json:"uncontended_medians,omitempty"`
	HotkeyMedians      []hotkeySummary      `json:"hotkey_medians,omitempty"`

	Quorum        []quorumRun     `json:"quorum_runs,omitempty"`
	QuorumTry     []quorumRun     `json:"quorum_trylock_runs,omitempty"`
	QuorumMedians []quorumSummary `json:"quorum_medians,omitempty"`
	TryMedians    []quorumSummary `json:"quorum_trylock_medians,omitempty"`
}

// quorumSummary is the medians over rounds of one implementation on one
// set of masters.
type quorumSummary struct {
	Impl       string  `json:"impl"`
	Config     string  `json:"config"`
	Rounds     int     `json:"rounds"`
	P50Micros  float64 `json:"p50_us"`
	P90Micros  float64 `json:"p90_us"`
	P99Micros  float64 `json:"p99_us"`
	MaxMicros  float64 `json:"max_us"`   // median of the runs' max
	WorstMax   float64 `json:"worst_us"` // largest over rounds
	RatioToOne float64 `json:"ratio_to_one_master"`
	// RatioToRaw and RatioToRawMajority: p50 against the raw floors on the
	// same masters (raw waits for every master, raw-majority for a majority).
	RatioToRaw         float64 `json:"ratio_to_raw"`
	RatioToRawMajority float64 `json:"ratio_to_raw_majority"`
	ClientCPU          float64 `json:"client_cpu_us_per_cycle"`
	ServersCPU         float64 `json:"servers_cpu_us_per_cycle"`
	Errors             int     `json:"errors"`
	Obtained           int     `json:"obtained,omitempty"`
	OwnersLeft         int     `json:"owners_left,omitempty"`
}

// summarizeQuorum takes the medians of runs per implementation and
// configuration (in the order they first appear); ratios: medians of the
// per-round ratios of p50 to the same implementation's on one master, and
// to the raw floors' (raw, raw-majority) on the same masters.
// latencyNote is what the quorum tables' titles say of -quorum-latency.
func (r *report) latencyNote() string {
	if r.Config.QuorumLatency == "" {
		return ""
	}
	return ", every live master " + r.Config.QuorumLatency + " away each way"
}

func summarizeQuorum(runs []quorumRun) []quorumSummary {
	type id struct{ impl, config string }
	type roundID struct {
		id
		round int
	}
	p50s := map[roundID]float64{}
	var order []id
	byID := map[id][]quorumRun{}
	for _, q := range runs {
		k := id{q.Impl, q.Config}
		if _, ok := byID[k]; !ok {
			order = append(order, k)
		}
		byID[k] = append(byID[k], q)
		p50s[roundID{k, q.Round}] = q.P50Micros
	}
	// ratio appends q's p50 over base's in q's round, if base ran then.
	ratio := func(out []float64, q quorumRun, base id) []float64 {
		if b := p50s[roundID{base, q.Round}]; b > 0 {
			return append(out, q.P50Micros/b)
		}
		return out
	}
	var out []quorumSummary
	for _, k := range order {
		s := quorumSummary{Impl: k.impl, Config: k.config}
		var p50, p90, p99, mx, one, raw, rawMaj, ccpu, scpu []float64
		for _, q := range byID[k] {
			s.Rounds++
			s.Errors += q.Errors
			s.Obtained += q.Obtained
			s.OwnersLeft += q.OwnersLeft
			s.WorstMax = math.Max(s.WorstMax, q.MaxMicros)
			p50, p90, p99, mx = append(p50, q.P50Micros), append(p90, q.P90Micros), append(p99, q.P99Micros), append(mx, q.MaxMicros)
			ccpu, scpu = append(ccpu, q.ClientCPU), append(scpu, q.ServersCPU)
			one = ratio(one, q, id{q.Impl, "1"})
			raw = ratio(raw, q, id{"raw", q.Config})
			rawMaj = ratio(rawMaj, q, id{"raw-majority", q.Config})
		}
		s.P50Micros, s.P90Micros, s.P99Micros, s.MaxMicros = median(p50), median(p90), median(p99), median(mx)
		s.RatioToOne, s.RatioToRaw, s.RatioToRawMajority = median(one), median(raw), median(rawMaj)
		s.ClientCPU, s.ServersCPU = median(ccpu), median(scpu)
		out = append(out, s)
	}
	return out
}

func (r *report) summarize() {
	r.QuorumMedians, r.TryMedians = summarizeQuorum(r.Quorum), summarizeQuorum(r.QuorumTry)
	raw := map[int]float64{} // round → raw cycles/s
	for _, u := range r.Uncontended {
		if u.Impl == "raw" {
			raw[u.Round] = u.CyclesPerSec
		}
	}
	for _, name := range r.Impls {
		var cps, ratio, pallocs, allocs, bytes, serial []float64
		s := uncontendedSummary{Impl: name}
		for _, u := range r.Uncontended {
			if u.Impl != name {
				continue
			}
			s.Rounds++
			s.Errors += u.Errors
			cps = append(cps, u.CyclesPerSec)
			allocs = append(allocs, u.AllocsPerCycle)
			pallocs = append(pallocs, u.ParallelAllocsPerCycle)
			bytes = append(bytes, u.BytesPerCycle)
			serial = append(serial, u.SerialMicros)
			if f, ok := raw[u.Round]; ok && f > 0 {
				ratio = append(ratio, u.CyclesPerSec/f)
			}
		}
		if s.Rounds == 0 {
			continue
		}
		s.CyclesPerSec, s.RatioToRaw = median(cps), median(ratio)
		s.ParallelAllocs, s.AllocsPerCycle, s.BytesPerCycle, s.SerialMicros = median(pallocs), median(allocs), median(bytes), median(serial)
		r.UncontendedMedians = append(r.UncontendedMedians, s)
	}
	for _, w := range r.Config.Waiters {
		for _, name := range r.Impls {
			s := hotkeySummary{Impl: name, Waiters: w}
			var hps, eff, hold, rtt, gap, p50, p99, mx, bound, mob []float64
			for _, h := range r.Hotkey {
				if h.Impl != name || h.Waiters != w {
					continue
				}
				s.Rounds++
				s.Censored += h.Censored
				s.Overlaps += h.Overlaps
				s.Errors += h.Errors
				s.WorstMaxMS = math.Max(s.WorstMaxMS, h.WaitMaxMS)
				hps = append(hps, h.HandoffsPerSec)
				eff = append(eff, h.Efficiency)
				hold = append(hold, h.HoldMeanMS)
				rtt = append(rtt, h.RTTMicros)
				gap = append(gap, h.GapP50MS)
				p50 = append(p50, h.WaitP50MS)
				p99 = append(p99, h.WaitP99MS)
				mx = append(mx, h.WaitMaxMS)
				bound = append(bound, h.BoundMS)
				mob = append(mob, h.MaxOverBound)
			}
			if s.Rounds == 0 {
				continue
			}
			s.HandoffsPerSec, s.Efficiency, s.HoldMeanMS, s.RTTMicros = median(hps), median(eff), median(hold), median(rtt)
			s.GapP50MS, s.WaitP50MS, s.WaitP99MS, s.WaitMaxMS = median(gap), median(p50), median(p99), median(mx)
			s.BoundMS, s.MaxOverBound = median(bound), median(mob)
			r.HotkeyMedians = append(r.HotkeyMedians, s)
		}
	}
}

func (r *report) writeMarkdown(w io.Writer) {
	m := r.Machine
	fmt.Fprintf(w, "Measured by `%s`\n\n", r.Command)
	fmt.Fprintf(w, "Machine: %s, %d CPUs (GOMAXPROCS %d), %s %s/%s, Redis %s on loopback, no persistence.",
		m.CPU, m.NumCPU, m.GOMAXPROCS, m.GoVersion, m.GOOS, m.GOARCH, m.RedisVersion)
	if m.Tree != "" {
		fmt.Fprintf(w, " Source: %s.", m.Tree)
	}
	fmt.Fprintln(w)
	if r.Config.Scenario == "quorum" {
		fmt.Fprintf(w, "Every implementation runs on every set of masters once per round, in a rotated order; medians over %d rounds.\n", r.Config.Rounds)
	} else {
		fmt.Fprintf(w, "Every implementation runs once per round, in a rotated order; medians over rounds (%d uncontended, %d hot-key).\n", r.Config.Rounds, r.Config.HotRounds)
	}
	var loads []float64
	for _, u := range r.Uncontended {
		loads = append(loads, u.LoadAvg)
	}
	for _, h := range r.Hotkey {
		loads = append(loads, h.LoadAvg)
	}
	for _, q := range append(r.Quorum, r.QuorumTry...) {
		loads = append(loads, q.LoadAvg)
	}
	if len(loads) > 0 {
		fmt.Fprintf(w, "1-minute load average at the runs' starts: median %.1f, max %.1f (%d CPUs; the bench's own processes count, and so does anything else running).\n",
			median(loads), quantile(loads, 1), m.NumCPU)
	}
	fmt.Fprintln(w)

	if len(r.UncontendedMedians) > 0 {
		fmt.Fprintf(w, "### Uncontended: %d goroutines, each on its own key, lock+unlock for %s per run\n\n",
			r.Config.Goroutines, r.Config.Duration)
		fmt.Fprintf(w, "| implementation | lock+unlock/s | × raw floor | allocs/cycle, %d goroutines | allocs/cycle, 1 goroutine | B/cycle, 1 goroutine | µs/cycle, 1 goroutine | errors |\n", r.Config.Goroutines)
		fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|")
		for _, s := range r.UncontendedMedians {
			fmt.Fprintf(w, "| %s | %s | %s | %.1f | %.1f | %.0f | %.0f | %d |\n",
				s.Impl, thousands(s.CyclesPerSec), ratioStr(s.RatioToRaw), s.ParallelAllocs, s.AllocsPerCycle, s.BytesPerCycle, s.SerialMicros, s.Errors)
		}
		fmt.Fprintf(w, "\n× raw floor: median of the per-round ratios to the raw floor (`raw`) of the same round. "+
			"allocs/cycle, %d goroutines: runtime.MemStats Mallocs delta over the timed run / its cycles. "+
			"1 goroutine: a separate pass of %d cycles on one key (Mallocs and TotalAlloc deltas, after a GC; the library's background goroutines included) and its time per cycle.\n\n",
			r.Config.Goroutines, r.Config.AllocCycles)
	}
	if len(r.HotkeyMedians) > 0 {
		fmt.Fprintf(w, "### Hot key: one key, %s critical section (time.Sleep), waiters spread over %d processes, %s counted per run\n\n",
			r.Config.Hold, r.Config.Procs, r.Config.HotDuration)
		fmt.Fprintln(w, "| implementation | waiters | hand-offs/s | efficiency | hold ms | RTT µs | hand-off gap p50 ms | wait p50 ms | wait p99 ms | wait max ms | max / bound | worst max ms | censored |")
		fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
		for _, s := range r.HotkeyMedians {
			fmt.Fprintf(w, "| %s | %d | %.0f | %.3f | %.3f | %.0f | %.3f | %.1f | %.1f | %.1f | %.1f× | %.1f | %d |\n",
				s.Impl, s.Waiters, s.HandoffsPerSec, s.Efficiency, s.HoldMeanMS, s.RTTMicros, s.GapP50MS,
				s.WaitP50MS, s.WaitP99MS, s.WaitMaxMS, s.MaxOverBound, s.WorstMaxMS, s.Censored)
		}
		fmt.Fprintf(w, "\nhold: measured mean of acquired → before Unlock (time.Sleep(%s) overshoot when idle: p50 %.0fµs, p99 %.0fµs). "+
			"RTT: median of 200 sequential PINGs just before each run. efficiency = hand-offs/s × (hold + RTT). "+
			"bound = (waiters−1) × (hold + RTT); worst max: the largest over rounds. hand-off gap: previous holder's Unlock call → next Lock returns. "+
			"Waits of requests made in the counted window; a request still waiting %s after the window (censored, summed over rounds) counts with its wait so far.\n\n",
			r.Config.Hold, r.SleepOvershoot.P50Micros, r.SleepOvershoot.P99Micros, r.Config.Tail)
	}
	if len(r.QuorumMedians) > 0 {
		fmt.Fprintf(w, "### Quorum: one goroutine, lock+unlock of one key, %d cycles per run, per-master timeout %s%s\n\n", r.Config.QuorumCycles, r.Config.NodeTimeout, r.latencyNote())
		fmt.Fprintln(w, "| implementation | masters | p50 µs | p90 µs | p99 µs | max µs | p50 × 1 master | p50 × raw | p50 × raw-majority | client CPU µs/cycle | Redis CPU µs/cycle | errors |")
		fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
		for _, s := range r.QuorumMedians {
			fmt.Fprintf(w, "| %s | %s | %.0f | %.0f | %.0f | %.0f | %s | %s | %s | %.0f | %.0f | %d |\n",
				s.Impl, s.Config, s.P50Micros, s.P90Micros, s.P99Micros, s.MaxMicros, ratioStr(s.RatioToOne), ratioStr(s.RatioToRaw), ratioStr(s.RatioToRawMajority), s.ClientCPU, s.ServersCPU, s.Errors)
		}
		fmt.Fprintln(w, "\nMedians over rounds of each run's percentiles; p50 × 1 master: median of the per-round ratios to the same library on one master; "+
			"p50 × raw, × raw-majority: the same against the raw floors on the same masters (SET NX PX and a compare-and-delete, in parallel on every master, waiting for every answer or for a majority). "+
			"killed: a redis-server that was killed (connection refused); blackholed: a proxy that drops every byte both ways (requests time out). "+
			"CPU: this process (getrusage, all threads) and the live masters' main threads (/proc/PID/schedstat), per cycle.")
		if r.Config.QuorumLatency != "" {
			fmt.Fprintf(w, "\nLatency: every live master, in every row and for every implementation, is reached through an in-process proxy that delivers each chunk %s after it read it, each way "+
				"(a round trip of twice that on top of loopback's, or more: a Go timer below a millisecond may fire up to a millisecond late); "+
				"measured PING round trip through it: median %.0f µs of 200. Killed masters are dialled directly (refused at once). "+
				"This process's CPU includes the proxies'.\n", r.Config.QuorumLatency, r.Config.QuorumRTTMicros)
		}
		fmt.Fprintln(w)
	}
	if len(r.TryMedians) > 0 {
		fmt.Fprintf(w, "### Quorum: TryLock with no live majority, %d attempts per run, per-master timeout %s%s\n\n", r.Config.TryAttempts, r.Config.NodeTimeout, r.latencyNote())
		fmt.Fprintln(w, "| implementation | masters | p50 ms | max ms | worst max ms | worst / per-master timeout | obtained | owners left on live masters |")
		fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|")
		for _, s := range r.TryMedians {
			node, _ := time.ParseDuration(r.Config.NodeTimeout)
			fmt.Fprintf(w, "| %s | %s | %.1f | %.1f | %.1f | %.2f× | %d | %d |\n",
				s.Impl, s.Config, s.P50Micros/1e3, s.MaxMicros/1e3, s.WorstMax/1e3, s.WorstMax*1e3/float64(node.Nanoseconds()), s.Obtained, s.OwnersLeft)
		}
		fmt.Fprintln(w, "\nowners left: live masters naming an owner of the key right after a failed TryLock, summed over attempts and rounds (must be 0).")
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "Settings:")
	fmt.Fprintln(w)
	for _, name := range r.Impls {
		fmt.Fprintf(w, "- %s: %s\n", name, r.Settings[name])
	}
	for _, s := range r.HotkeyMedians {
		if s.Overlaps > 0 {
			fmt.Fprintf(w, "\nWARNING: %s with %d waiters: %d acquisitions overlapped the previous holder.\n", s.Impl, s.Waiters, s.Overlaps)
		}
	}
}

// benchstat renders one line per run in the Go benchmark format, so
// `benchstat old.txt new.txt` compares two bench runs (and bench_test.go's
// output uses the same names).
func (r *report) benchstat() []byte {
	var b bytes.Buffer
	m := r.Machine
	fmt.Fprintf(&b, "goos: %s\ngoarch: %s\npkg: github.com/dlock-go/dlock/bench\ncpu: %s\n", m.GOOS, m.GOARCH, m.CPU)
	procs := ""
	if m.GOMAXPROCS > 1 {
		procs = fmt.Sprintf("-%d", m.GOMAXPROCS)
	}
	for _, u := range r.Uncontended {
		if u.Cycles == 0 {
			continue
		}
		nsop := u.Seconds * 1e9 / float64(u.Cycles)
		// allocs/op and B/op over all goroutines, as testing.B counts them.
		fmt.Fprintf(&b, "BenchmarkUncontended/impl=%s%s\t%d\t%.1f ns/op\t%.0f cycles/s\t%.1f allocs/op\t%.0f B/op\t%.1f serial-allocs/op\t%.1f serial-µs/op\n",
			u.Impl, procs, u.Cycles, nsop, u.CyclesPerSec, u.ParallelAllocsPerCycle, u.ParallelBytesPerCycle, u.AllocsPerCycle, u.SerialMicros)
	}
	for _, h := range r.Hotkey {
		if h.Handoffs == 0 {
			continue
		}
		nsop := h.WindowSeconds * 1e9 / float64(h.Handoffs)
		fmt.Fprintf(&b, "BenchmarkHotKey/impl=%s/waiters=%d%s\t%d\t%.0f ns/op\t%.1f handoffs/s\t%.4f efficiency\t%.3f wait-p50-ms\t%.3f wait-p99-ms\t%.3f wait-max-ms\t%.3f max-over-bound\n",
			h.Impl, h.Waiters, procs, h.Handoffs, nsop, h.HandoffsPerSec, h.Efficiency, h.WaitP50MS, h.WaitP99MS, h.WaitMaxMS, h.MaxOverBound)
	}
	// Runs with latency are named apart: benchstat must not compare them
	// with runs without.
	lat := ""
	if r.Config.QuorumLatency != "" {
		lat = "/latency=" + r.Config.QuorumLatency
	}
	for _, q := range r.Quorum {
		if q.Cycles == 0 {
			continue
		}
		fmt.Fprintf(&b, "BenchmarkQuorum/impl=%s/masters=%s%s%s\t%d\t%.0f ns/op\t%.1f p50-µs\t%.1f p99-µs\t%.1f client-cpu-µs/op\t%.1f redis-cpu-µs/op\n",
			q.Impl, quorumSlug(q.Config), lat, procs, q.Cycles, q.MeanMicros*1e3, q.P50Micros, q.P99Micros, q.ClientCPU, q.ServersCPU)
	}
	for _, q := range r.QuorumTry {
		fmt.Fprintf(&b, "BenchmarkQuorumTryLock/impl=%s/masters=%s%s%s\t%d\t%.0f ns/op\t%.2f p50-ms\t%.2f max-ms\n",
			q.Impl, quorumSlug(q.Config), lat, procs, q.Cycles, q.MeanMicros*1e3, q.P50Micros/1e3, q.MaxMicros/1e3)
	}
	return b.Bytes()
}

// quorumSlug is a configuration's benchstat value ("5, 2 killed" → "5-2killed").
func quorumSlug(name string) string {
	return strings.NewReplacer(", ", "-", " ", "").Replace(name)
}

// ratioStr formats a ratio with two decimals, or two significant digits
// below 0.1 (a fast path against a floor that waits out timeouts), or none
// from 100 on.
func ratioStr(x float64) string {
	switch {
	case math.IsNaN(x):
		return "—"
	case x < 0.1:
		return fmt.Sprintf("%.2g×", x)
	case x >= 100:
		return fmt.Sprintf("%.0f×", x)
	}
	return fmt.Sprintf("%.2f×", x)
}

// thousands formats x rounded, with a thin separator every three digits.
func thousands(x float64) string {
	if math.IsNaN(x) {
		return "—"
	}
	s := fmt.Sprintf("%.0f", x)
	var out strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			out.WriteByte(',')
		}
		out.WriteRune(c)
	}
	return out.String()
}
