package main

import (
	"context"
	"flag"
	"fmt"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/redisproc"
	"github.com/redis/go-redis/v9"
)

var testQuorumImpls = flag.String("quorum-impls", "", "implementations of BenchmarkQuorum, comma-separated (default: all that run on several masters)")

// BenchmarkQuorum: one goroutine's lock+unlock of one key on one master
// and on five, for each implementation of the quorum scenario, with what
// a cycle costs beside its time: the medians of Lock and of Unlock,
// goroutines started, this process's and the masters' CPU, and the
// requests the masters served. For a profile of
// one case:
//
//	go test -run '^$' -bench 'Quorum/impl=dlock$/masters=5$' -benchtime 5000x -cpuprofile cpu.out
//
// The log lines list the masters' INFO commandstats per cycle (commands a
// script calls count there too, under their own names).
func BenchmarkQuorum(b *testing.B) {
	ims := selectedImpls(b, *testQuorumImpls, true)
	var servers []*redisproc.Server
	defer func() {
		for _, s := range servers {
			_ = s.Close()
		}
	}()
	for range 5 {
		s, err := startServer("redis-server")
		if err != nil {
			b.Skipf("no redis-server: %v", err)
		}
		servers = append(servers, s)
	}
	e := &env{ttl: 10 * time.Second, retry: time.Millisecond}
	for _, im := range ims {
		for _, n := range []int{1, 5} {
			b.Run(fmt.Sprintf("impl=%s/masters=%d", im.name, n), func(b *testing.B) {
				benchQuorumCycles(b, im, e, servers[:n])
			})
		}
	}
}

func benchQuorumCycles(b *testing.B, im *impl, e *env, servers []*redisproc.Server) {
	ctx := context.Background()
	q := im.quorum
	var rdbs []*redis.Client
	var pids []int
	for _, s := range servers {
		opt := &redis.Options{Addr: s.Addr()}
		if q.options != nil {
			q.options(opt)
		}
		rdb := redis.NewClient(opt)
		defer rdb.Close()
		if q.prepare != nil {
			if err := q.prepare(ctx, rdb); err != nil {
				b.Fatal(err)
			}
		}
		rdbs, pids = append(rdbs, rdb), append(pids, s.PID())
	}
	l, err := q.open(e, rdbs, 50*time.Millisecond)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	key := fmt.Sprintf("bench:qb:%s:%d", im.name, len(rdbs))
	var lockTimes, unlockTimes []float64
	cycle := func() {
		t0 := time.Now()
		h, err := l.Lock(ctx, key)
		t1 := time.Now()
		if err == nil {
			err = h.Unlock(ctx)
		}
		if err != nil {
			b.Fatal(err)
		}
		lockTimes, unlockTimes = append(lockTimes, float64(t1.Sub(t0).Nanoseconds())), append(unlockTimes, float64(time.Since(t1).Nanoseconds()))
	}
	for range 50 { // connections, scripts, the key
		cycle()
	}
	time.Sleep(10 * time.Millisecond) // what the warm-up left running ends
	for _, r := range rdbs {
		if err := r.ConfigResetStat(ctx).Err(); err != nil {
			b.Fatal(err)
		}
	}
	lockTimes, unlockTimes = lockTimes[:0], unlockTimes[:0]
	created := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(created)
	self0, srv0 := cpuNow(pids)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		cycle()
	}
	b.StopTimer()
	self1, srv1 := cpuNow(pids)
	g0 := created[0].Value.Uint64()
	metrics.Read(created)
	ops := float64(b.N)
	b.ReportMetric(median(lockTimes)/1e3, "lock-p50-µs")
	b.ReportMetric(median(unlockTimes)/1e3, "unlock-p50-µs")
	b.ReportMetric(float64(created[0].Value.Uint64()-g0)/ops, "goroutines/op")
	b.ReportMetric(float64((self1-self0).Microseconds())/ops, "client-cpu-µs/op")
	b.ReportMetric(float64((srv1-srv0).Microseconds())/ops, "redis-cpu-µs/op")
	stats, err := commandStats(ctx, rdbs)
	if err != nil {
		b.Fatal(err)
	}
	var names []string
	for name := range stats {
		names = append(names, name)
	}
	slices.Sort(names)
	var lines []string
	for _, name := range names {
		s := stats[name]
		lines = append(lines, fmt.Sprintf("%s %.2f/op %.2fµs/call", name, float64(s.calls)/ops, s.usec/float64(s.calls)))
	}
	b.Logf("%d masters, INFO commandstats per cycle: %s", len(rdbs), strings.Join(lines, ", "))
}

// A commandStat is one command's calls and time on the masters.
type commandStat struct {
	calls int64
	usec  float64
}

// commandStats sums INFO commandstats over rdbs, by command name (a call
// of INFO counts once it has answered, so not in its own reply).
func commandStats(ctx context.Context, rdbs []*redis.Client) (map[string]commandStat, error) {
	out := map[string]commandStat{}
	for _, r := range rdbs {
		info, err := r.Info(ctx, "commandstats").Result()
		if err != nil {
			return nil, err
		}
		// cmdstat_evalsha:calls=5,usec=60,usec_per_call=12.00,...
		for _, line := range strings.Split(info, "\r\n") {
			name, fields, ok := strings.Cut(strings.TrimPrefix(line, "cmdstat_"), ":")
			if !ok || len(name) == len(line) || strings.HasPrefix(name, "config") { // CONFIG RESETSTAT
				continue
			}
			s := out[name]
			for _, f := range strings.Split(fields, ",") {
				k, v, _ := strings.Cut(f, "=")
				switch k {
				case "calls":
					n, _ := strconv.ParseInt(v, 10, 64)
					s.calls += n
				case "usec":
					u, _ := strconv.ParseFloat(v, 64)
					s.usec += u
				}
			}
			out[name] = s
		}
	}
	return out, nil
}
