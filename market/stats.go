package market

import (
	"bufio"
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Latency summarizes the wall time of a set of purchase calls (lock wait and
// retries included; the ZRANGE that chose the item excluded). Zero when
// there were no calls.
type Latency struct {
	Mean time.Duration `json:"mean_ns"`
	P50  time.Duration `json:"p50_ns"`
	P99  time.Duration `json:"p99_ns"`
	Max  time.Duration `json:"max_ns"`
}

// summarize sorts samples in place and returns their summary.
func summarize(samples []time.Duration) Latency {
	if len(samples) == 0 {
		return Latency{}
	}
	slices.Sort(samples)
	var sum time.Duration
	for _, s := range samples {
		sum += s
	}
	return Latency{
		Mean: sum / time.Duration(len(samples)),
		P50:  quantile(samples, 0.50),
		P99:  quantile(samples, 0.99),
		Max:  samples[len(samples)-1],
	}
}

// quantile returns the nearest-rank q-quantile of sorted samples.
func quantile(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// serverStats is what the server says it did so far: per command, its
// calls and microseconds (INFO commandstats); the reads of client requests
// it made (INFO stats total_reads_processed: one per round trip, as a
// client's pipelined batch arrives in one read); and its CPU time (INFO
// cpu, user and system).
type serverStats struct {
	calls, usec map[string]int64
	reads       int64
	cpu         time.Duration
}

// readServerStats reads serverStats. Servers without INFO commandstats (the
// in-process fallback) are read from INFO stats total_commands_processed,
// as the single entry "*"; reads and cpu are then 0. The INFO calls that
// read the stats are not in them; the caller subtracts the ones it made
// before (see diffCounts).
func readServerStats(ctx context.Context, rdb redis.UniversalClient) (serverStats, error) {
	st := serverStats{calls: map[string]int64{}, usec: map[string]int64{}}
	info, err := rdb.Info(ctx, "commandstats", "stats", "cpu").Result()
	if err != nil {
		info, err = rdb.Info(ctx, "stats").Result()
		if err != nil {
			return st, err
		}
	}
	var cpu float64
	var total int64 = -1
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		name, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		switch name {
		case "total_commands_processed":
			total, _ = strconv.ParseInt(rest, 10, 64)
		case "total_reads_processed":
			st.reads, _ = strconv.ParseInt(rest, 10, 64)
		case "used_cpu_sys", "used_cpu_user":
			f, _ := strconv.ParseFloat(rest, 64)
			cpu += f
		}
		name, isCmd := strings.CutPrefix(name, "cmdstat_")
		if !isCmd {
			continue
		}
		for _, field := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(field, "=")
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				continue
			}
			switch k {
			case "calls":
				st.calls[name] = n
			case "usec":
				st.usec[name] = n
			}
		}
	}
	st.cpu = time.Duration(cpu * float64(time.Second))
	if len(st.calls) == 0 && total >= 0 {
		st.calls["*"] = total
	}
	return st, nil
}

// diffCounts returns after − before per command and the total, less the
// INFO call that took the before snapshot. Read per-command microseconds
// the same way: the INFO's own time is left in, a few µs.
func diffCounts(before, after map[string]int64) (map[string]int64, int64) {
	diff := map[string]int64{}
	var total int64
	for name, n := range after {
		d := n - before[name]
		if name == "info" || name == "*" {
			d-- // the INFO that read "before"
		}
		if d > 0 {
			diff[name] = d
			total += d
		}
	}
	return diff, total
}

// diffUsec returns after − before per command: the microseconds Redis spent
// in each (a script's include those of the commands it ran, which are also
// counted under their own names).
func diffUsec(before, after map[string]int64) map[string]int64 {
	diff := map[string]int64{}
	for name, n := range after {
		if d := n - before[name]; d > 0 {
			diff[name] = d
		}
	}
	return diff
}
