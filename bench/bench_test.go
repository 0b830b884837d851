package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/redisproc"
	"github.com/redis/go-redis/v9"
)

// The testing.B side of the bench, for benchstat:
//
//	cd bench && go test -run '^$' -bench . -benchtime 2s -count 6 | tee new.txt; benchstat new.txt
//
// Flags after -args: -impls (default: every compiled-in implementation),
// -redis URL (default: a private redis-server on a free loopback port),
// -goroutines (default 64).

var (
	testImpls      = flag.String("impls", "", "implementations to benchmark, comma-separated (default: all compiled in)")
	testRedis      = flag.String("redis", "", "Redis URL (default: start a private redis-server)")
	testGoroutines = flag.Int("goroutines", 64, "goroutines of BenchmarkUncontended (via SetParallelism)")
)

var (
	testEnv     *env
	testEnvErr  error
	testLockers = map[string]locker{}
)

func TestMain(m *testing.M) {
	flag.Parse()
	url := *testRedis
	var srv *redisproc.Server
	if url == "" {
		srv, testEnvErr = startServer("redis-server")
		if testEnvErr == nil {
			url = "redis://" + srv.Addr()
		}
	}
	if testEnvErr == nil {
		testEnv, testEnvErr = newEnv(url, 0, 10*time.Second, time.Millisecond)
	}
	code := m.Run()
	for _, l := range testLockers {
		_ = l.Close()
	}
	if testEnv != nil {
		_ = testEnv.rdb.Close()
	}
	if srv != nil {
		_ = srv.Close()
	}
	os.Exit(code)
}

// selectedImpls parses list (empty: every implementation compiled in) for
// the quorum scenario (quorum) or the others.
func selectedImpls(tb testing.TB, list string, quorum bool) []*impl {
	if list == "" {
		list = strings.Join(knownImpls(quorum), ",")
	}
	ims, err := parseImpls(list, quorum)
	if err != nil {
		tb.Fatal(err)
	}
	return ims
}

// lockerFor opens im once per test binary run.
func lockerFor(tb testing.TB, im *impl) locker {
	if testEnvErr != nil {
		tb.Skipf("no Redis: %v", testEnvErr)
	}
	if l, ok := testLockers[im.name]; ok {
		return l
	}
	l, err := im.open(testEnv)
	if err != nil {
		tb.Fatalf("open %s: %v", im.name, err)
	}
	testLockers[im.name] = l
	return l
}

// BenchmarkUncontended: 64 goroutines (SetParallelism × GOMAXPROCS), each
// lock+unlock on its own key. ns/op is wall time per cycle of the whole
// group (the inverse of cycles/s); allocs/op counts every goroutine's.
func BenchmarkUncontended(b *testing.B) {
	procs := runtime.GOMAXPROCS(0)
	par := max(1, (*testGoroutines+procs-1)/procs)
	for _, im := range selectedImpls(b, *testImpls, false) {
		b.Run("impl="+im.name, func(b *testing.B) {
			l := lockerFor(b, im)
			ctx := context.Background()
			var next atomic.Int64
			b.SetParallelism(par)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				key := uncontendedKey(im.name, int(next.Add(1)))
				for pb.Next() {
					h, err := l.Lock(ctx, key)
					if err != nil {
						b.Error(err)
						return
					}
					if err := h.Unlock(ctx); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "cycles/s")
		})
	}
}

// BenchmarkSerial: one goroutine, lock+unlock on one key: the latency of a
// cycle and its allocations with nothing else running.
func BenchmarkSerial(b *testing.B) {
	for _, im := range selectedImpls(b, *testImpls, false) {
		b.Run("impl="+im.name, func(b *testing.B) {
			l := lockerFor(b, im)
			ctx := context.Background()
			key := uncontendedKey(im.name, 0)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				h, err := l.Lock(ctx, key)
				if err != nil {
					b.Fatal(err)
				}
				if err := h.Unlock(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestExclusion checks each adapter before it is measured: a held key makes
// a second Lock wait until its ctx ends, and a released key can be locked.
func TestExclusion(t *testing.T) {
	for _, im := range selectedImpls(t, *testImpls, false) {
		t.Run(im.name, func(t *testing.T) {
			l := lockerFor(t, im)
			key := fmt.Sprintf("bench:test:%s:%d", im.name, time.Now().UnixNano())
			h, err := l.Lock(context.Background(), key)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
			defer cancel()
			if h2, err := l.Lock(ctx, key); err == nil {
				_ = h2.Unlock(context.Background())
				t.Fatal("second Lock of a held key succeeded")
			} else if !errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
				t.Fatalf("second Lock: %v before its ctx ended", err)
			}
			if err := h.Unlock(context.Background()); err != nil {
				t.Fatal(err)
			}
			h, err = l.Lock(context.Background(), key)
			if err != nil {
				t.Fatal(err)
			}
			if err := h.Unlock(context.Background()); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestAnalyzeHotkey checks the hot-key arithmetic on a made-up history.
func TestAnalyzeHotkey(t *testing.T) {
	ms := int64(time.Millisecond)
	start := time.Unix(100, 0)
	s := start.UnixNano()
	p := hotkeyParams{waiters: 3, window: 10 * time.Millisecond, tail: 5 * time.Millisecond, rttNanos: 0}
	results := []workerResult{
		{Acquired: []acquisition{
			{0, s, s, s + 1*ms, s + 1*ms},               // waited 0
			{1, s, s + 2*ms, s + 3*ms, s + 3*ms},        // waited 2ms; gap 1ms
			{0, s + 1*ms, s + 4*ms, s + 5*ms, s + 5*ms}, // waited 3ms; gap 1ms
		}},
		{Pending: []pending{{2, s + 2*ms}}}, // censored: waited 15−2 = 13ms
	}
	var run hotkeyRun
	analyzeHotkey(&run, p, start, results)
	if run.Handoffs != 3 || run.Censored != 1 || run.Requests != 4 || run.Overlaps != 0 {
		t.Fatalf("handoffs %d censored %d requests %d overlaps %d", run.Handoffs, run.Censored, run.Requests, run.Overlaps)
	}
	if run.HandoffsPerSec != 300 || run.HoldMeanMS != 1 || run.WaitMaxMS != 13 || run.GapP50MS != 1 {
		t.Fatalf("hps %v hold %v max %v gap %v", run.HandoffsPerSec, run.HoldMeanMS, run.WaitMaxMS, run.GapP50MS)
	}
	if run.Efficiency != 0.3 || run.BoundMS != 2 || run.MinPerWaiter != 0 || run.MaxPerWaiter != 2 {
		t.Fatalf("eff %v bound %v min %d max %d", run.Efficiency, run.BoundMS, run.MinPerWaiter, run.MaxPerWaiter)
	}
	// An acquisition inside another holder's hold is counted as an overlap.
	results[0].Acquired = append(results[0].Acquired, acquisition{2, s, s + 4*ms + ms/2, s + 6*ms, s + 6*ms})
	run = hotkeyRun{}
	analyzeHotkey(&run, p, start, results[:1])
	if run.Overlaps != 1 {
		t.Fatalf("overlaps %d, want 1", run.Overlaps)
	}
}

func TestMarshalIndentNaN(t *testing.T) {
	type inner struct {
		X float64 `json:"x"`
		Y float64 `json:"y,omitempty"`
		S string  `json:"s,omitempty"`
	}
	v := struct {
		A []inner        `json:"a"`
		M map[string]int `json:"m"`
		P *inner         `json:"p"`
		N [2]int64       `json:"n"`
		Z float64        `json:"-"`
	}{A: []inner{{X: math.NaN()}, {X: 1.5, Y: math.Inf(1), S: "q"}}, M: map[string]int{"b": 2, "a": 1}, N: [2]int64{3, 4}}
	b, err := marshalIndent(v)
	if err != nil {
		t.Fatal(err)
	}
	var got any
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatalf("%v in %s", err, b)
	}
	want := `{"a":[{"x":null},{"x":1.5,"y":null,"s":"q"}],"m":{"a":1,"b":2},"p":null,"n":[3,4]}`
	var c bytes.Buffer
	if err := json.Compact(&c, b); err != nil || c.String() != want {
		t.Fatalf("got %s, want %s", c.String(), want)
	}
}

// TestSummarizeQuorum checks the quorum medians and the per-round ratio to
// the same implementation on one master.
func TestSummarizeQuorum(t *testing.T) {
	runs := []quorumRun{
		{Impl: "a", Config: "1", Round: 1, P50Micros: 100, MaxMicros: 300},
		{Impl: "a", Config: "5", Round: 1, P50Micros: 150, MaxMicros: 900},
		{Impl: "a", Config: "1", Round: 2, P50Micros: 200, MaxMicros: 400},
		{Impl: "a", Config: "5", Round: 2, P50Micros: 500, MaxMicros: 700, Errors: 1},
		{Impl: "a", Config: "5", Round: 3, P50Micros: 400, MaxMicros: 800},
		{Impl: "a", Config: "1", Round: 3, P50Micros: 100, MaxMicros: 200},
		{Impl: "a", Config: "5", Round: 4, P50Micros: 50, MaxMicros: 50}, // no one-master run that round
		{Impl: "b", Config: "5", Round: 1, P50Micros: 100, OwnersLeft: 2},
	}
	got := summarizeQuorum(runs)
	if len(got) != 3 || got[0].Config != "1" || got[1].Config != "5" || got[2].Impl != "b" {
		t.Fatalf("summaries %+v", got)
	}
	a5 := got[1]
	if a5.Rounds != 4 || a5.P50Micros != 275 || a5.MaxMicros != 750 || a5.WorstMax != 900 || a5.Errors != 1 {
		t.Fatalf("a on 5: %+v", a5)
	}
	if a5.RatioToOne != 2.5 { // median of 1.5, 2.5 and 4 (round 4 has no one-master run)
		t.Fatalf("ratio %v, want 2.5", a5.RatioToOne)
	}
	if got[0].RatioToOne != 1 || !math.IsNaN(got[2].RatioToOne) || got[2].OwnersLeft != 2 {
		t.Fatalf("one master %+v, b %+v", got[0], got[2])
	}
	if !math.IsNaN(a5.RatioToRaw) || !math.IsNaN(a5.RatioToRawMajority) {
		t.Fatalf("ratios to raw floors that did not run: %+v", a5)
	}
	// The raw floors: per round, on the same masters.
	runs = append(runs,
		quorumRun{Impl: "raw", Config: "5", Round: 1, P50Micros: 50},
		quorumRun{Impl: "raw", Config: "5", Round: 2, P50Micros: 100},
		quorumRun{Impl: "raw", Config: "1", Round: 2, P50Micros: 400},
		quorumRun{Impl: "raw-majority", Config: "5", Round: 3, P50Micros: 200},
	)
	got = summarizeQuorum(runs)
	if a5 := got[1]; a5.RatioToRaw != 4 || a5.RatioToRawMajority != 2 { // median of 3 and 5; 2 alone
		t.Fatalf("a on 5 against the raw floors: %+v", a5)
	}
	if a1 := got[0]; a1.RatioToRaw != 0.5 || !math.IsNaN(a1.RatioToRawMajority) {
		t.Fatalf("a on 1 against the raw floors: %+v", a1)
	}
	if s := quorumSlug("5, 2 blackholed"); s != "5-2blackholed" {
		t.Fatalf("slug %q", s)
	}
}

// TestRawQuorum checks the raw floors on several masters before they are
// measured: a lock is on a majority, excludes a second attempt, and is
// gone after Unlock; a failed attempt gives back what it got; with no
// majority alive, Lock fails rather than retrying.
func TestRawQuorum(t *testing.T) {
	var live, killed []*redis.Client
	for i := range 5 {
		srv, err := startServer("redis-server")
		if err != nil {
			t.Skipf("no redis-server: %v", err)
		}
		t.Cleanup(func() { _ = srv.Close() })
		opt := &redis.Options{Addr: srv.Addr()}
		registry["raw"].quorum.options(opt)
		rdb := redis.NewClient(opt)
		t.Cleanup(func() { _ = rdb.Close() })
		if i < 3 {
			live = append(live, rdb)
		} else {
			srv.Kill()
			killed = append(killed, rdb)
		}
	}
	ctx := context.Background()
	e := &env{ttl: 10 * time.Second, retry: time.Millisecond}
	// on counts the masters that have key.
	on := func(rdbs []*redis.Client, key string) int {
		n := 0
		for _, r := range rdbs {
			if v, err := r.Exists(ctx, key).Result(); err != nil {
				t.Fatal(err)
			} else {
				n += int(v)
			}
		}
		return n
	}
	for _, name := range []string{"raw", "raw-majority"} {
		t.Run(name, func(t *testing.T) {
			q := registry[name].quorum
			for _, r := range live {
				if err := q.prepare(ctx, r); err != nil {
					t.Fatal(err)
				}
			}
			l, err := q.open(e, live, 50*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			key := "bench:test:" + name
			h, err := l.Lock(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if n := on(live, key); n < 2 {
				t.Fatalf("held on %d of 3 masters", n)
			}
			if _, err := l.TryLock(ctx, key); !errors.Is(err, errRawNotObtained) {
				t.Fatalf("second TryLock: %v", err)
			}
			if err := h.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			// raw-majority's last delete may still be on its way.
			for deadline := time.Now().Add(time.Second); on(live, key) > 0; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("still on %d masters after Unlock", on(live, key))
				}
			}
			// Held by another on two masters: the third's grant is given back.
			for _, r := range live[:2] {
				if err := r.Set(ctx, key, "other", 0).Err(); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := l.TryLock(ctx, key); !errors.Is(err, errRawNotObtained) {
				t.Fatalf("TryLock held on 2 of 3: %v", err)
			}
			if n := on(live[2:], key); n != 0 {
				t.Fatal("a failed TryLock left its grant")
			}
			if err := live[0].Del(ctx, key).Err(); err != nil {
				t.Fatal(err)
			}
			if h, err = l.Lock(ctx, key); err != nil { // 2 of 3 free again
				t.Fatal(err)
			}
			if err := h.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			// One master: the same commands in sequence.
			one, err := q.open(e, live[:1], 50*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			if h, err = one.Lock(ctx, key); err != nil {
				t.Fatal(err)
			}
			if _, err := one.TryLock(ctx, key); !errors.Is(err, errRawNotObtained) {
				t.Fatalf("second TryLock on one master: %v", err)
			}
			if err := h.Unlock(ctx); err != nil || on(live[:1], key) != 0 {
				t.Fatalf("Unlock on one master: %v, key left: %d", err, on(live[:1], key))
			}
			// No majority alive: an error, nothing left on the live master.
			down, err := q.open(e, append(live[:1:1], killed[:2]...), 50*time.Millisecond)
			if err != nil {
				t.Fatal(err)
			}
			lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			if _, err := down.Lock(lctx, key+":down"); err == nil || errors.Is(err, errRawNotObtained) || lctx.Err() != nil {
				t.Fatalf("Lock with 2 of 3 masters down: %v (ctx %v)", err, lctx.Err())
			}
			if n := on(live[:1], key+":down"); n != 0 {
				t.Fatal("a failed Lock left its grant on the live master")
			}
		})
	}
}

func TestRatioStr(t *testing.T) {
	for x, want := range map[float64]string{math.NaN(): "—", 0.0021345: "0.0021×", 0.5: "0.50×", 1.234: "1.23×", 421.55: "422×"} {
		if got := ratioStr(x); got != want {
			t.Errorf("ratioStr(%v) = %q, want %q", x, got, want)
		}
	}
}
