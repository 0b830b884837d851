package main

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dlock-go/dlock/internal/faultproxy"
	"github.com/dlock-go/dlock/internal/redisproc"
	"github.com/redis/go-redis/v9"
)

// Scenario 3: quorum (Redlock over independent masters). Five private
// redis-servers; each library locks on one of them, on all five, and on
// five of which two are down, serially (one goroutine, one key), and
// TryLocks on five of which three are down. "killed": a redis-server that
// was started and killed, so its port refuses connections; "blackholed":
// a fault proxy in front of a live server that drops every byte both ways
// (connections open, requests time out). With -quorum-latency, every live
// master of every configuration is reached through a fault proxy that
// delays each direction by that much, for every implementation alike: the
// masters as if on machines of their own, where the round trip rather than
// the CPU the masters and the client share here is what a cycle waits for.

// quorumImpl is what an implementation needs to run on several masters.
type quorumImpl struct {
	// settings says in one line how it runs on several masters.
	settings func(e *env, node time.Duration) string
	// open returns a locker over rdbs: one master, or a quorum of them,
	// each request to a master bounded by node.
	open func(e *env, rdbs []*redis.Client, node time.Duration) (tryLocker, error)
	// prepare readies a live master before the runs (nil: nothing).
	prepare func(ctx context.Context, rdb *redis.Client) error
	// held reports whether rdb names an owner of key.
	held func(ctx context.Context, rdb *redis.Client, key string) (bool, error)
	// options adjusts the go-redis options of its clients (nil: defaults).
	options func(*redis.Options)
}

// tryLocker is a locker that can also try once.
type tryLocker interface {
	locker
	TryLock(ctx context.Context, key string) (held, error)
}

// A quorumConfig is a set of masters: live ones first, then down ones.
type quorumConfig struct {
	name   string // as in the tables: "1", "5", "5, 2 killed", ...
	live   int
	down   int
	killed bool // down by being killed (else blackholed)
}

var (
	quorumSerialConfigs = []quorumConfig{
		{"1", 1, 0, false},
		{"5", 5, 0, false},
		{"5, 2 killed", 3, 2, true},
		{"5, 2 blackholed", 3, 2, false},
	}
	quorumTryConfigs = []quorumConfig{
		{"5, 3 killed", 2, 3, true},
		{"5, 3 blackholed", 2, 3, false},
	}
)

// quorumServers are the servers of the scenario: live masters, killed
// ones, and blackholing proxies in front of the last live masters.
type quorumServers struct {
	live    []*redisproc.Server
	killed  []*redisproc.Server
	proxies []*faultproxy.Proxy // proxies[j] fronts live[len(live)-len(proxies)+j]
	// delayed[i] fronts live[i], adding the latency each way (none: no
	// latency, the clients dial the masters).
	delayed []*faultproxy.Proxy
}

// startQuorumServers starts the masters and the proxies; latency > 0 puts
// every live master behind a proxy that delays each direction by it. The
// killed masters are dialled directly whatever the latency: a refused dial
// across a network costs one round trip, but go-redis stops dialling an
// address once a pool's worth of dials failed (it returns the last error
// at once), so a refusal that is immediate changes little, and a proxy
// would turn the refused dial into an accepted connection that resets.
func startQuorumServers(bin string, latency time.Duration) (*quorumServers, error) {
	s := &quorumServers{}
	for range 5 {
		srv, err := startServer(bin)
		if err != nil {
			s.Close()
			return nil, err
		}
		s.live = append(s.live, srv)
	}
	for range 3 {
		srv, err := startServer(bin)
		if err != nil {
			s.Close()
			return nil, err
		}
		srv.Kill()
		s.killed = append(s.killed, srv)
	}
	for _, srv := range s.live[2:] {
		p, err := faultproxy.Start(srv.Addr())
		if err != nil {
			s.Close()
			return nil, err
		}
		p.Drop(faultproxy.Both)
		s.proxies = append(s.proxies, p)
	}
	if latency > 0 {
		for _, srv := range s.live {
			p, err := faultproxy.Start(srv.Addr())
			if err != nil {
				s.Close()
				return nil, err
			}
			p.SetLatency(faultproxy.Both, latency)
			s.delayed = append(s.delayed, p)
		}
		// Nothing gets through a blackhole, but should a byte ever be
		// let through, it comes as late as a live master's.
		for _, p := range s.proxies {
			p.SetLatency(faultproxy.Both, latency)
		}
	}
	return s, nil
}

// addrs lists c's masters: its live ones, then its down ones.
func (s *quorumServers) addrs(c quorumConfig) []string {
	var out []string
	for i, srv := range s.live[:c.live] {
		if s.delayed != nil {
			out = append(out, s.delayed[i].Addr())
		} else {
			out = append(out, srv.Addr())
		}
	}
	for j := range c.down {
		if c.killed {
			out = append(out, s.killed[j].Addr())
		} else {
			out = append(out, s.proxies[len(s.proxies)-c.down+j].Addr())
		}
	}
	return out
}

// pids are the live masters' processes, for their CPU time.
func (s *quorumServers) pids(c quorumConfig) []int {
	var out []int
	for _, srv := range s.live[:c.live] {
		out = append(out, srv.PID())
	}
	return out
}

// quiesce readies the next run: what the last one left running ends (its
// requests to masters that are down, each bounded by node), the
// blackholing proxies' connections are reset, and the garbage collected.
// It returns how many proxy connections it reset. A dropping proxy keeps a
// connection that its client closed (it delivers no end of stream either),
// so every request that timed out against it leaves two descriptors of
// this process open: the implementations that return at a majority and
// leave requests to time out would otherwise run the bench out of them, and
// every later dial to a blackholed master would fail at once (too many open
// files) instead of timing out. Without the waits, the aftermath of a run
// against blackholed masters (thousands of resets, lingering goroutines)
// falls on the next run (in the rotation, a one-master run: the base of
// the ratios).
func (s *quorumServers) quiesce(node time.Duration) int {
	time.Sleep(2*node + 50*time.Millisecond)
	n := 0
	for _, p := range s.proxies {
		n += p.Open()
		p.ResetAll()
	}
	time.Sleep(50 * time.Millisecond)
	runtime.GC()
	return n
}

func (s *quorumServers) Close() {
	for _, p := range append(s.proxies, s.delayed...) {
		_ = p.Close()
	}
	for _, srv := range append(s.live, s.killed...) {
		_ = srv.Close()
	}
}

// quorumRun is one serial run of one implementation on one configuration.
type quorumRun struct {
	Impl        string  `json:"impl"`
	Config      string  `json:"config"`
	Round       int     `json:"round"`
	Cycles      int     `json:"cycles"`
	Seconds     float64 `json:"seconds"`
	P50Micros   float64 `json:"p50_us"`
	P90Micros   float64 `json:"p90_us"`
	P99Micros   float64 `json:"p99_us"`
	MaxMicros   float64 `json:"max_us"`
	MeanMicros  float64 `json:"mean_us"`
	ClientCPU   float64 `json:"client_cpu_us_per_cycle"` // this process, all threads
	ServersCPU  float64 `json:"servers_cpu_us_per_cycle"`
	Errors      int     `json:"errors"`
	FirstError  string  `json:"first_error,omitempty"`
	Obtained    int     `json:"obtained,omitempty"`     // TryLock runs: must be 0
	OwnersLeft  int     `json:"owners_left,omitempty"`  // TryLock runs: live masters naming an owner after a failed TryLock
	NodeTimeout string  `json:"node_timeout,omitempty"` // TryLock runs
	LoadAvg     float64 `json:"loadavg_1m"`
}

// quorumRunner is one implementation opened on one configuration.
type quorumRunner struct {
	im   *impl
	cfg  quorumConfig
	l    tryLocker
	rdbs []*redis.Client // live masters' clients, for checks
	pids []int
}

func quorumScenario(o *options, e *env, rep *report) error {
	srv, err := startQuorumServers(o.redisServer, o.quorumLatency)
	if err != nil {
		return err
	}
	defer srv.Close()
	logf("quorum: 5 masters, 3 killed, 3 blackholing proxies started")
	if o.quorumLatency > 0 {
		// What the proxy adds is what the Go runtime's timers give: one
		// below a millisecond may fire up to a millisecond late (the
		// netpoller waits in whole milliseconds), so the round trip is
		// measured and reported beside the latency asked for.
		rdb := redis.NewClient(&redis.Options{Addr: srv.addrs(quorumSerialConfigs[0])[0]})
		rtt, err := measureRTT(rdb, 200)
		_ = rdb.Close()
		if err != nil {
			return fmt.Errorf("PING through the latency proxy: %w", err)
		}
		rep.Config.QuorumLatency, rep.Config.QuorumRTTMicros = o.quorumLatency.String(), rtt/1e3
		logf("quorum: every live master behind a proxy adding %v each way; PING round trip through it: median %.0fµs", o.quorumLatency, rtt/1e3)
	}
	ctx := context.Background()
	var serial, try []*quorumRunner
	var clients []*redis.Client
	defer func() {
		for _, r := range append(serial, try...) {
			_ = r.l.Close()
		}
		for _, c := range clients {
			_ = c.Close()
		}
	}()
	open := func(im *impl, c quorumConfig) (*quorumRunner, error) {
		q := im.quorum
		r := &quorumRunner{im: im, cfg: c, pids: srv.pids(c)}
		var rdbs []*redis.Client
		for i, a := range srv.addrs(c) {
			opt := &redis.Options{Addr: a}
			if q.options != nil {
				q.options(opt)
			}
			rdb := redis.NewClient(opt)
			clients = append(clients, rdb)
			rdbs = append(rdbs, rdb)
			if i < c.live {
				r.rdbs = append(r.rdbs, rdb)
				if q.prepare != nil {
					if err := q.prepare(ctx, rdb); err != nil {
						return nil, err
					}
				}
			}
		}
		l, err := q.open(e, rdbs, o.nodeTimeout)
		if err != nil {
			return nil, fmt.Errorf("open %s on %s: %w", im.name, c.name, err)
		}
		r.l = l
		return r, nil
	}
	for _, im := range o.quorumImpls {
		for _, c := range quorumSerialConfigs {
			r, err := open(im, c)
			if err != nil {
				return err
			}
			serial = append(serial, r)
			// Warm-up, not recorded: connections, scripts, the first keys.
			if w := runQuorumSerial(r, 50, 5*time.Second); w.Cycles == 0 {
				return fmt.Errorf("%s on %s: no cycle completed in warm-up: %s", im.name, c.name, w.FirstError)
			}
		}
		for _, c := range quorumTryConfigs {
			r, err := open(im, c)
			if err != nil {
				return err
			}
			try = append(try, r)
		}
	}
	rep.Config.QuorumCycles, rep.Config.NodeTimeout, rep.Config.TryAttempts = o.quorumCycles, o.nodeTimeout.String(), o.tryAttempts
	for round := range o.rounds {
		for i := range serial {
			r := serial[(i+round)%len(serial)]
			links := srv.quiesce(o.nodeTimeout)
			run := runQuorumSerial(r, o.quorumCycles, o.duration)
			run.Round = round + 1
			rep.Quorum = append(rep.Quorum, run)
			logf("quorum round %d/%d %-12s %-16s p50 %6.0fµs p99 %6.0fµs max %7.0fµs  cpu client %4.0fµs servers %4.0fµs  errors %d %s (proxy links reset before: %d)",
				round+1, o.rounds, r.im.name, r.cfg.name, run.P50Micros, run.P99Micros, run.MaxMicros, run.ClientCPU, run.ServersCPU, run.Errors, run.FirstError, links)
		}
		for _, r := range try {
			srv.quiesce(o.nodeTimeout)
			run := runQuorumTry(r, o.tryAttempts, o.nodeTimeout)
			run.Round = round + 1
			rep.QuorumTry = append(rep.QuorumTry, run)
			logf("quorum round %d/%d %-12s %-16s TryLock p50 %5.1fms max %5.1fms (node timeout %v) obtained %d owners left %d errors %s",
				round+1, o.rounds, r.im.name, r.cfg.name, run.P50Micros/1e3, run.MaxMicros/1e3, o.nodeTimeout, run.Obtained, run.OwnersLeft, run.FirstError)
		}
	}
	return nil
}

// quorumKey is the key of an implementation on a configuration: distinct
// for each, since they share masters.
func quorumKey(im *impl, c quorumConfig) string {
	return "bench:q:" + im.name + ":" + quorumSlug(c.name)
}

// cpuNow returns this process's CPU time (all threads) and the main
// threads' CPU time of the given server processes (redis-server does its
// work on its main thread), from getrusage and /proc/PID/schedstat.
func cpuNow(pids []int) (self, servers time.Duration) {
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
		if err != nil {
			continue
		}
		if f := strings.Fields(string(b)); len(f) > 0 {
			ns, _ := strconv.ParseInt(f[0], 10, 64)
			servers += time.Duration(ns)
		}
	}
	return self, servers
}

// runQuorumSerial runs up to n lock+unlock cycles on one goroutine, for at
// most maxTime, timing each.
func runQuorumSerial(r *quorumRunner, n int, maxTime time.Duration) quorumRun {
	ctx := context.Background()
	key := quorumKey(r.im, r.cfg)
	run := quorumRun{Impl: r.im.name, Config: r.cfg.name, LoadAvg: loadAvg()}
	times := make([]float64, 0, n)
	self0, srv0 := cpuNow(r.pids)
	start := time.Now()
	deadline := start.Add(maxTime)
	for i := 0; i < n && (i%16 != 0 || time.Now().Before(deadline)); i++ {
		t0 := time.Now()
		h, err := r.l.Lock(ctx, key)
		if err == nil {
			err = h.Unlock(ctx)
		}
		if err != nil {
			run.Errors++
			if run.FirstError == "" {
				run.FirstError = err.Error()
			}
			time.Sleep(time.Millisecond) // do not spin on a failing set of masters
			continue
		}
		times = append(times, float64(time.Since(t0).Nanoseconds()))
	}
	elapsed := time.Since(start)
	self1, srv1 := cpuNow(r.pids)
	run.Seconds, run.Cycles = elapsed.Seconds(), len(times)
	if len(times) > 0 {
		c := float64(len(times))
		slices.Sort(times)
		run.P50Micros, run.P90Micros = sortedQuantile(times, 0.5)/1e3, sortedQuantile(times, 0.9)/1e3
		run.P99Micros, run.MaxMicros = sortedQuantile(times, 0.99)/1e3, times[len(times)-1]/1e3
		run.MeanMicros = mean(times) / 1e3
		run.ClientCPU = float64((self1 - self0).Microseconds()) / c
		run.ServersCPU = float64((srv1 - srv0).Microseconds()) / c
	}
	return run
}

// runQuorumTry makes n TryLocks on a configuration without a live
// majority, timing each, and after each counts the live masters that name
// an owner of the key (a partial lock left behind).
func runQuorumTry(r *quorumRunner, n int, node time.Duration) quorumRun {
	ctx := context.Background()
	key := quorumKey(r.im, r.cfg)
	run := quorumRun{Impl: r.im.name, Config: r.cfg.name, NodeTimeout: node.String(), LoadAvg: loadAvg()}
	var times []float64
	start := time.Now()
	for range n {
		t0 := time.Now()
		h, err := r.l.TryLock(ctx, key)
		times = append(times, float64(time.Since(t0).Nanoseconds()))
		if err == nil {
			run.Obtained++
			_ = h.Unlock(ctx)
		} else if run.FirstError == "" {
			run.FirstError = err.Error()
		}
		for _, rdb := range r.rdbs {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			held, err := r.im.quorum.held(cctx, rdb, key)
			cancel()
			if err != nil || held {
				run.OwnersLeft++
			}
		}
	}
	run.Seconds, run.Cycles = time.Since(start).Seconds(), len(times)
	slices.Sort(times)
	run.P50Micros, run.P90Micros = sortedQuantile(times, 0.5)/1e3, sortedQuantile(times, 0.9)/1e3
	run.P99Micros, run.MaxMicros = sortedQuantile(times, 0.99)/1e3, times[len(times)-1]/1e3
	run.MeanMicros = mean(times) / 1e3
	return run
}
