package dlock_test

import (
	"bufio"
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/wire"
)

// BenchmarkWait prices one contended acquisition the way the market makes
// them: a holder locks a name never locked before, a second Lock of it
// waits (it is queued, its look has found the lock held), the holder
// unlocks, the waiter gets the lock and unlocks. What Redis spent on it is
// read from INFO (cpu and commandstats) before and after, and every script
// call the Clients sent is counted by script and number of keys, so the
// cost of the wait path can be told apart command by command:
//
//   - base: the same two lock+unlock cycles one after the other, nobody
//     waiting (what the two acquisitions cost without contention);
//   - one-client: the holder and the waiter are two goroutines of one Client
//     (the market's dlock rows: one Client, ten workers);
//   - two-clients: they are on two Clients (two processes).
//
// Metrics per iteration (one contended acquisition): redis-µs (INFO cpu),
// cmds (every command Redis ran, scripts' own included), and one metric per
// top-level command or script: "N-name" calls and "us-name" server µs
// (commandstats; scripts by SHA, counted on the client). The wait costs what
// one-client or two-clients costs beyond base.
//
//	go test -run '^$' -bench BenchmarkWait -benchtime 2000x -count 3 .
func BenchmarkWait(b *testing.B) {
	s := redistest.Start(b)
	admin := s.Client(b)
	ctx := context.Background()
	counts := newScriptCounter()
	newC := func() *dlock.Client {
		rdb := s.Client(b, func(o *redis.Options) { o.ContextTimeoutEnabled = true })
		rdb.AddHook(counts)
		c := dlock.New(rdb)
		b.Cleanup(func() { _ = c.Close() })
		return c
	}
	for _, mode := range []string{"base", "one-client", "two-clients"} {
		b.Run(mode, func(b *testing.B) {
			holderC := newC()
			waiterC := holderC
			if mode == "two-clients" {
				waiterC = newC()
			}
			cycle := func(i int) {
				name := fmt.Sprintf("wait-%s-%d", mode, i)
				l, err := holderC.Mutex(name).Lock(ctx)
				if err != nil {
					b.Fatal(err)
				}
				if mode == "base" {
					if err := l.Unlock(ctx); err != nil {
						b.Fatal(err)
					}
					l2, err := waiterC.Mutex(name).Lock(ctx)
					if err != nil {
						b.Fatal(err)
					}
					if err := l2.Unlock(ctx); err != nil {
						b.Fatal(err)
					}
					return
				}
				got := make(chan error, 1)
				go func() {
					l2, err := waiterC.Mutex(name).Lock(ctx)
					if err == nil {
						err = l2.Unlock(ctx)
					}
					got <- err
				}()
				// Unlock once the waiter sleeps, as a market holder does
				// after its critical section (bounded: 5 s).
				for deadline := time.Now().Add(5 * time.Second); ; {
					if _, asleep := dlock.QueuedLocally(waiterC, name); asleep || time.Now().After(deadline) {
						break
					}
					time.Sleep(20 * time.Microsecond)
				}
				if err := l.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
				if err := <-got; err != nil {
					b.Fatal(err)
				}
			}
			cycle(-1) // load the scripts, connect, detect the pub/sub kind
			time.Sleep(50 * time.Millisecond)
			st0 := readStats(b, admin)
			counts.reset()
			n := 0
			for b.Loop() {
				cycle(n)
				n++
			}
			// The last SUNSUBSCRIBEs go out as their waiters leave: let them land.
			time.Sleep(50 * time.Millisecond)
			st1 := readStats(b, admin)
			f := float64(n)
			b.ReportMetric((st1.cpu-st0.cpu)/f, "redis-µs")
			var cmds int64
			for name, v := range st1.calls {
				d := v - st0.calls[name]
				if name == "info" {
					d--
				}
				cmds += d
				switch name {
				case "evalsha", "eval", "info", "ping":
				default:
					if strings.Contains(name, "subscribe") || strings.Contains(name, "publish") {
						if d > 0 {
							b.ReportMetric(float64(d)/f, "N-"+name)
							b.ReportMetric(float64(st1.usec[name]-st0.usec[name])/f, "us-"+name)
						}
					}
				}
			}
			b.ReportMetric(float64(cmds)/f, "cmds")
			b.ReportMetric(float64(st1.usec["evalsha"]-st0.usec["evalsha"])/f, "us-evalsha")
			for name, v := range counts.snapshot() {
				b.ReportMetric(float64(v)/f, "N-"+name)
			}
		})
	}
}

// waitStats is what BenchmarkWait reads from INFO.
type waitStats struct {
	cpu         float64 // µs
	calls, usec map[string]int64
}

func readStats(b *testing.B, rdb *redis.Client) waitStats {
	info, err := rdb.Info(context.Background(), "commandstats", "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	st := waitStats{calls: map[string]int64{}, usec: map[string]int64{}}
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		name, rest, ok := strings.Cut(strings.TrimSpace(sc.Text()), ":")
		if !ok {
			continue
		}
		if name == "used_cpu_sys" || name == "used_cpu_user" {
			v, _ := strconv.ParseFloat(rest, 64)
			st.cpu += v * 1e6
			continue
		}
		cmd, isCmd := strings.CutPrefix(name, "cmdstat_")
		if !isCmd {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				st.calls[cmd] = n
			case "usec":
				st.usec[cmd] = n
			}
		}
	}
	return st
}

// scriptCounter is a go-redis hook that counts the EVALSHA calls sent, by
// script name and number of keys ("acquire/3").
type scriptCounter struct {
	mu    sync.Mutex
	names map[string]string // SHA → name
	n     map[string]int64
}

func newScriptCounter() *scriptCounter {
	sc := &scriptCounter{names: map[string]string{}, n: map[string]int64{}}
	for _, s := range wire.Scripts() {
		sc.names[s.SHA] = s.Name
	}
	return sc
}

func (sc *scriptCounter) reset() {
	sc.mu.Lock()
	clear(sc.n)
	sc.mu.Unlock()
}

func (sc *scriptCounter) snapshot() map[string]int64 {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	out := map[string]int64{}
	keys := make([]string, 0, len(sc.n))
	for k := range sc.n {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		out[k] = sc.n[k]
	}
	return out
}

func (sc *scriptCounter) note(cmd redis.Cmder) {
	args := cmd.Args()
	if len(args) < 3 || !strings.EqualFold(argString(args[0]), "evalsha") {
		return
	}
	name := sc.names[argString(args[1])]
	if name == "" {
		name = "unknown"
	}
	name += "/" + argString(args[2])
	sc.mu.Lock()
	sc.n[name]++
	sc.mu.Unlock()
}

// argString is an argument as sent: dlock's prepared command lines hold
// pointers to their strings.
func argString(a any) string {
	if p, ok := a.(*string); ok {
		return *p
	}
	return fmt.Sprint(a)
}

func (sc *scriptCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (sc *scriptCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		sc.note(cmd)
		return next(ctx, cmd)
	}
}

func (sc *scriptCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			sc.note(c)
		}
		return next(ctx, cmds)
	}
}
