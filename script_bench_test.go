package dlock_test

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// BenchmarkScriptCost measures what one uncontended lock+unlock costs Redis,
// per primitive, from INFO commandstats: the server time of each script call
// (redis-µs/call) and the commands the scripts run per cycle
// (redis-cmds/cycle). Redis is the bottleneck of the uncontended benchmark on
// two cores, so this is what sets a primitive's ratio to the raw floor there.
func BenchmarkScriptCost(b *testing.B) {
	kinds := []struct {
		name string
		lock func(c *dlock.Client, ctx context.Context) (*dlock.Lease, error)
	}{
		{"mutex", func(c *dlock.Client, ctx context.Context) (*dlock.Lease, error) { return c.Mutex("cost").Lock(ctx) }},
		{"fair", func(c *dlock.Client, ctx context.Context) (*dlock.Lease, error) {
			return c.Mutex("cost-fair", dlock.Fair()).Lock(ctx)
		}},
		{"rwmutex", func(c *dlock.Client, ctx context.Context) (*dlock.Lease, error) {
			return c.RWMutex("cost-rw").Lock(ctx)
		}},
		{"semaphore", func(c *dlock.Client, ctx context.Context) (*dlock.Lease, error) {
			return c.Semaphore("cost-sem", 4).Acquire(ctx, 1)
		}},
	}
	for _, k := range kinds {
		b.Run(k.name, func(b *testing.B) {
			s := redistest.Start(b)
			rdb := s.Client(b)
			c := dlock.New(rdb)
			defer c.Close()
			ctx := context.Background()
			if l, err := k.lock(c, ctx); err != nil { // load the scripts
				b.Fatal(err)
			} else {
				_ = l.Unlock(ctx)
			}
			rdb.ConfigResetStat(ctx)
			for b.Loop() {
				l, err := k.lock(c, ctx)
				if err != nil {
					b.Fatal(err)
				}
				if err := l.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
			}
			scripts, usec, cmds := commandStats(b, rdb.Info(ctx, "commandstats").Val())
			b.ReportMetric(usec/float64(scripts), "redis-µs/call")
			b.ReportMetric(float64(cmds)/float64(b.N), "redis-cmds/cycle")
		})
	}
}

// commandStats sums INFO commandstats: the calls and microseconds of
// EVALSHA/EVAL, and the calls of every other command (those the scripts ran)
// except the INFO and CONFIG of the benchmark itself.
func commandStats(b *testing.B, info string) (scripts int64, usec float64, cmds int64) {
	for line := range strings.SplitSeq(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var calls int64
		var us float64
		for f := range strings.SplitSeq(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "calls":
				calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				us, _ = strconv.ParseFloat(v, 64)
			}
		}
		switch name = strings.TrimPrefix(name, "cmdstat_"); name {
		case "evalsha", "eval":
			scripts += calls
			usec += us
		case "info", "config|resetstat", "ping", "hello", "client|setinfo":
		default:
			cmds += calls
		}
	}
	if scripts == 0 {
		b.Fatal("no script calls in INFO commandstats")
	}
	return scripts, usec, cmds
}
