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

// commandCounts returns the server's per-command call counts from INFO
// commandstats. Servers without that section (the in-process fallback) are
// read from INFO stats total_commands_processed, as the single entry "*".
// The INFO call that reads the counts is not in them; the caller subtracts
// the one it made before.
func commandCounts(ctx context.Context, rdb redis.UniversalClient) (map[string]int64, error) {
	counts := map[string]int64{}
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err == nil {
		sc := bufio.NewScanner(strings.NewReader(info))
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			name, rest, ok := strings.Cut(line, ":")
			name, isCmd := strings.CutPrefix(name, "cmdstat_")
			if !ok || !isCmd {
				continue
			}
			for _, field := range strings.Split(rest, ",") {
				if v, ok := strings.CutPrefix(field, "calls="); ok {
					n, err := strconv.ParseInt(v, 10, 64)
					if err == nil {
						counts[name] = n
					}
				}
			}
		}
		if len(counts) > 0 {
			return counts, nil
		}
	}
	info, err = rdb.Info(ctx, "stats").Result()
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "total_commands_processed:"); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err == nil {
				counts["*"] = n
				return counts, nil
			}
		}
	}
	return counts, nil
}

// diffCounts returns after − before per command and the total, less the
// INFO call that took the before snapshot.
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
