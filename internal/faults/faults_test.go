package faults_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/faults"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/wire"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// setScript sets KEYS[1] to ARGV[1]: whether it ran is visible at Redis.
const setScript = "redis.call('SET', KEYS[1], ARGV[1]) return 1"

// incrScript counts its runs in KEYS[1].
const incrScript = "return redis.call('INCR', KEYS[1])"

func scripts() *faults.Scripts {
	s := faults.NewScripts()
	s.Add("set", setScript, false)
	s.Add("incr", incrScript, false)
	return s
}

// drivers are the clients an Injector reaches: go-redis through its hook
// (AddHook), rueidis through NewRueidis. The tests of what each fault does
// run over both: a fault means the same whichever client meets it.
var drivers = []string{"go-redis", "rueidis"}

// eachDriver runs f as a subtest per driver.
func eachDriver(t *testing.T, f func(t *testing.T, drv string)) {
	for _, drv := range drivers {
		t.Run(drv, func(t *testing.T) { f(t, drv) })
	}
}

// client runs the set script through one driver.
type client interface {
	// set runs it for key, alone.
	set(ctx context.Context, sha, key string) (any, error)
	// batch runs it for each key in one batch after a command that is no
	// script call, and returns every command's error.
	batch(ctx context.Context, sha string, keys ...string) []error
	// subscribe subscribes to ch on a connection of its own and waits for
	// the confirmation; the connection is closed when t ends.
	subscribe(t *testing.T, ctx context.Context, ch string) (subscription, error)
}

type goredisClient struct{ *redis.Client }

func (c goredisClient) set(ctx context.Context, sha, key string) (any, error) {
	return c.EvalSha(ctx, sha, []string{key}, "v").Result()
}

func (c goredisClient) batch(ctx context.Context, sha string, keys ...string) []error {
	cmds, _ := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Exists(ctx, "nothing")
		for _, k := range keys {
			p.EvalSha(ctx, sha, []string{k}, "v")
		}
		return nil
	})
	errs := make([]error, len(cmds))
	for i, cmd := range cmds {
		errs[i] = cmd.Err()
	}
	return errs
}

type rueidisClient struct{ rueidis.Client }

func (c rueidisClient) set(ctx context.Context, sha, key string) (any, error) {
	return c.Do(ctx, c.B().Evalsha().Sha1(sha).Numkeys(1).Key(key).Arg("v").Build()).ToAny()
}

func (c rueidisClient) batch(ctx context.Context, sha string, keys ...string) []error {
	cmds := rueidis.Commands{c.B().Exists().Key("nothing").Build()}
	for _, k := range keys {
		cmds = append(cmds, c.B().Evalsha().Sha1(sha).Numkeys(1).Key(k).Arg("v").Build())
	}
	var errs []error
	for _, r := range c.DoMulti(ctx, cmds...) {
		errs = append(errs, r.Error())
	}
	return errs
}

// setup starts a server and returns a client of it through drv that in
// injects faults into (the scripts loaded; sha is the set script's) and a
// plain client to look at Redis with.
func setup(t *testing.T, drv string, rules ...faults.Rule) (in *faults.Injector, c client, plain *redis.Client, sha string) {
	t.Helper()
	in, c, plain, sha = setupWith(t, drv, nil, rules...)
	return
}

// setupWith is setup with opt applied to a go-redis client's options.
func setupWith(t *testing.T, drv string, opt func(*redis.Options), rules ...faults.Rule) (*faults.Injector, client, *redis.Client, string) {
	t.Helper()
	s := redistest.Start(t)
	plain := s.Client(t)
	sha, err := plain.ScriptLoad(context.Background(), setScript).Result()
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.ScriptLoad(context.Background(), incrScript).Err(); err != nil {
		t.Fatal(err)
	}
	in := faults.New(faults.Config{Seed: 1, Scripts: scripts(), Rules: rules})
	return in, newClient(t, s, drv, in, opt), plain, sha
}

// newClient returns a client of s through drv with in's faults.
func newClient(t *testing.T, s *redistest.Server, drv string, in *faults.Injector, opt func(*redis.Options)) client {
	t.Helper()
	if drv == "rueidis" {
		rc, err := in.NewRueidis(rueidis.ClientOption{InitAddress: []string{s.Addr()}, ForceSingleClient: true, DisableCache: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(rc.Close)
		return rueidisClient{rc}
	}
	var opts []func(*redis.Options)
	if opt != nil {
		opts = append(opts, opt)
	}
	rdb := s.Client(t, opts...)
	rdb.AddHook(in)
	return goredisClient{rdb}
}

// call runs the set script for key in the background and reports its
// result and when it returned.
type result struct {
	v   any
	err error
	at  time.Duration
}

func call(c client, sha, key string) <-chan result { return callCtx(context.Background(), c, sha, key) }

func callCtx(ctx context.Context, c client, sha, key string) <-chan result {
	out := make(chan result, 1)
	start := time.Now()
	go func() {
		v, err := c.set(ctx, sha, key)
		out <- result{v, err, time.Since(start)}
	}()
	return out
}

func isSet(t *testing.T, plain *redis.Client, key string) bool {
	t.Helper()
	n, err := plain.Exists(context.Background(), key).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n == 1
}

// Each kind of fault is observable at Redis and by the caller, over
// either driver.
func TestKinds(t *testing.T) { eachDriver(t, testKinds) }

func testKinds(t *testing.T, drv string) {
	const d = 300 * time.Millisecond
	rule := func(k faults.Kind) faults.Rule {
		return faults.Rule{Script: "set", Kind: k, P: 1, Min: d, Max: d}
	}
	t.Run("delay-send", func(t *testing.T) {
		_, c, plain, sha := setup(t, drv, rule(faults.DelaySend))
		res := call(c, sha, "k")
		time.Sleep(d / 3)
		if isSet(t, plain, "k") {
			t.Fatal("the command ran before its delayed send")
		}
		r := <-res
		if r.err != nil || r.at < d || !isSet(t, plain, "k") {
			t.Fatalf("after a delayed send: %v %v after %v, set=%v", r.v, r.err, r.at, isSet(t, plain, "k"))
		}
	})
	t.Run("delay-reply", func(t *testing.T) {
		_, c, plain, sha := setup(t, drv, rule(faults.DelayReply))
		res := call(c, sha, "k")
		deadline := time.Now().Add(d / 2)
		for !isSet(t, plain, "k") {
			if time.Now().After(deadline) {
				t.Fatal("the command did not run at once")
			}
			time.Sleep(time.Millisecond)
		}
		select {
		case r := <-res:
			t.Fatalf("the reply came early: %+v", r)
		default:
		}
		if r := <-res; r.err != nil || r.v != int64(1) || r.at < d {
			t.Fatalf("delayed reply: %v %v after %v", r.v, r.err, r.at)
		}
	})
	t.Run("lose-reply", func(t *testing.T) {
		_, c, plain, sha := setup(t, drv, rule(faults.LoseReply))
		r := <-call(c, sha, "k")
		var ne net.Error
		if r.err == nil || !errors.As(r.err, &ne) || !ne.Timeout() || !errors.Is(r.err, os.ErrDeadlineExceeded) || r.at < d {
			t.Fatalf("lost reply: %v %v after %v, want an i/o timeout after %v", r.v, r.err, r.at, d)
		}
		if !isSet(t, plain, "k") {
			t.Fatal("the command whose reply was lost did not run")
		}
	})
	t.Run("run-late", func(t *testing.T) {
		in, c, plain, sha := setup(t, drv, rule(faults.RunLate))
		r := <-call(c, sha, "k")
		if !errors.Is(r.err, os.ErrDeadlineExceeded) || r.at >= d/2 {
			t.Fatalf("run late: %v %v after %v, want an i/o timeout at once", r.v, r.err, r.at)
		}
		if isSet(t, plain, "k") {
			t.Fatal("the command ran before its delay")
		}
		in.WaitLate()
		if !isSet(t, plain, "k") {
			t.Fatal("the command did not run after its delay")
		}
	})
	t.Run("fail-send", func(t *testing.T) {
		_, c, plain, sha := setup(t, drv, rule(faults.FailSend))
		if r := <-call(c, sha, "k"); r.err == nil || !errors.Is(r.err, faults.ErrNotSent) {
			t.Fatalf("failed send: %v %v", r.v, r.err)
		}
		if isSet(t, plain, "k") {
			t.Fatal("a command that was never sent ran")
		}
	})
	t.Run("cut", func(t *testing.T) {
		noRetry := func(o *redis.Options) { o.MaxRetries = -1 }
		in, c, plain, sha := setupWith(t, drv, noRetry, faults.Rule{Script: "set", Kind: faults.Cut, Calls: []int{2}})
		if r := <-call(c, sha, "k0"); r.err != nil {
			t.Fatal(r.err)
		}
		r := <-call(c, sha, "k")
		if r.err == nil || !strings.Contains(r.err.Error(), "closed") {
			t.Fatalf("cut: %v %v, want a closed-connection error", r.v, r.err)
		}
		if !isSet(t, plain, "k") {
			t.Fatal("the command on the cut connection did not run")
		}
		if in.Stats()["cut-missed"] != 0 {
			t.Fatal("the cut missed its command")
		}
		if r := <-call(c, sha, "k2"); r.err != nil {
			t.Fatalf("the next call after a cut: %v", r.err)
		}
	})
	t.Run("delay-write", func(t *testing.T) {
		// The caller's ctx ends while the write is held back: the command
		// runs late all the same. go-redis still reads its reply; rueidis
		// gives the caller up at its ctx's end (dlock's rueidis driver
		// sends its calls under no cancellation, and waits aside). The ctx
		// has no deadline: rueidis makes a ctx's deadline the socket's
		// when it writes a lone command itself, as go-redis does with its
		// WriteTimeout, and a write held past it fails.
		in, c, plain, sha := setup(t, drv, rule(faults.DelayWrite))
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		time.AfterFunc(d/3, cancel)
		res := callCtx(ctx, c, sha, "k")
		<-ctx.Done()
		if isSet(t, plain, "k") {
			t.Fatal("the command ran before its held-back write")
		}
		r := <-res
		if drv == "rueidis" && errors.Is(r.err, context.Canceled) {
			waitSet(t, plain, "k", 2*d)
		} else if r.err != nil || r.v != int64(1) || r.at < d || !isSet(t, plain, "k") {
			t.Fatalf("after a held-back write: %v %v after %v, set=%v", r.v, r.err, r.at, isSet(t, plain, "k"))
		}
		if in.Stats()["cut-missed"] != 0 {
			t.Fatal("the held-back write missed its command")
		}
	})
	t.Run("delay-send-ctx-ended", func(t *testing.T) {
		// Why DelayWrite exists: neither client sends a command whose ctx
		// ended before it was written.
		_, c, plain, sha := setup(t, drv, rule(faults.DelaySend))
		ctx, cancel := context.WithTimeout(context.Background(), d/3)
		defer cancel()
		if _, err := c.set(ctx, sha, "k"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a delayed send after its ctx ended: %v, want context.DeadlineExceeded", err)
		}
		if isSet(t, plain, "k") {
			t.Fatal("a command sent after its ctx ended ran")
		}
	})
	if drv == "go-redis" {
		t.Run("cut-retried", func(t *testing.T) {
			// go-redis (MaxRetries 3 by default) sends a command again on a
			// new connection when its connection breaks: Redis runs it
			// twice. (rueidis resends no EVAL or EVALSHA.)
			_, c, _, _ := setup(t, drv, faults.Rule{Script: "incr", Kind: faults.Cut, P: 1, Limit: 1})
			n, err := c.(goredisClient).Eval(context.Background(), incrScript, []string{"n"}).Int()
			if err != nil || n != 2 {
				t.Fatalf("a cut call retried by go-redis: %d %v, want 2 runs", n, err)
			}
		})
	}
}

// waitSet waits, at most d, for key to be set.
func waitSet(t *testing.T, plain *redis.Client, key string, d time.Duration) {
	t.Helper()
	end := time.Now().Add(d)
	for !isSet(t, plain, key) {
		if time.Now().After(end) {
			t.Fatalf("%s is not set %v later", key, d)
		}
		time.Sleep(time.Millisecond)
	}
}

// A fault on a pipeline applies to the whole batch; the watchdog's
// Pipelined renewals are batches, and so are the autopipeliner's, and
// rueidis's DoMulti.
func TestBatches(t *testing.T) {
	ctx := context.Background()
	eachDriver(t, func(t *testing.T, drv string) {
		t.Run("lose-reply", func(t *testing.T) {
			_, c, plain, sha := setup(t, drv, faults.Rule{Script: "set", Via: faults.Batch, Kind: faults.LoseReply, P: 1})
			for i, err := range c.batch(ctx, sha, "a", "b") {
				if !errors.Is(err, faults.ErrReplyLost) {
					t.Fatalf("command %d: %v, want the lost reply", i, err)
				}
			}
			if !isSet(t, plain, "a") || !isSet(t, plain, "b") {
				t.Fatal("a batch whose replies were lost did not run")
			}
			// Single calls do not match a Batch rule.
			if r := <-call(c, sha, "c"); r.err != nil {
				t.Fatal(r.err)
			}
		})
		t.Run("cut", func(t *testing.T) {
			noRetry := func(o *redis.Options) { o.MaxRetries = -1 }
			_, c, plain, sha := setupWith(t, drv, noRetry, faults.Rule{Script: "set", Via: faults.Batch, Kind: faults.Cut, P: 1})
			if errs := c.batch(ctx, sha, "a", "b"); errs[1] == nil || errs[2] == nil {
				t.Fatalf("a cut batch succeeded: %v", errs)
			}
			if !isSet(t, plain, "a") || !isSet(t, plain, "b") {
				t.Fatal("the cut batch did not run")
			}
		})
	})
	t.Run("go-redis/async-autopipeline", func(t *testing.T) {
		// The autopipeliner runs a batch of one through ProcessHook (a
		// single command), a bigger batch through ProcessPipelineHook.
		in, c, plain, sha := setup(t, "go-redis", faults.Rule{Script: "set", Kind: faults.LoseReply, P: 1})
		ap, err := c.(goredisClient).AsyncAutoPipeline()
		if err != nil {
			t.Fatal(err)
		}
		cmd := redis.NewCmd(ctx, "evalsha", &sha, "1", "k", "v")
		f := ap.Submit(ctx, cmd)
		_ = f.Wait()
		if !errors.Is(cmd.Err(), faults.ErrReplyLost) {
			t.Fatalf("submitted: %v %v, want the lost reply (does the hook see autopipelined batches?)", cmd.Val(), cmd.Err())
		}
		if !isSet(t, plain, "k") {
			t.Fatal("the submitted command did not run")
		}
		if st := in.Stats(); st["set lose-reply batch"]+st["set lose-reply single"] != 1 {
			t.Fatalf("stats: %v", in.Summary())
		}
	})
}

// Calls picks exact calls; Limit caps a rule; a disabled Injector injects
// nothing; InFlight sees a call held by a delay; delays are capped.
func TestExactCalls(t *testing.T) {
	in, c, plain, sha := setup(t, "go-redis",
		faults.Rule{Script: "set", Kind: faults.FailSend, Calls: []int{2}},
		faults.Rule{Script: "set", Kind: faults.DelaySend, Calls: []int{4}, Min: time.Hour, Max: time.Hour},
		faults.Rule{Script: "set", Kind: faults.FailSend, P: 1, Limit: 1},
	)
	want := []bool{false, false, true, true, true} // call 1: the third rule (then at its limit); 2: the first; 4: the second
	for i, ok := range want {
		key := "k" + string(rune('0'+i))
		if i == 3 {
			res := call(c, sha, key)
			if !in.WaitInFlight(time.Second, func(f faults.Call) bool { return f.Script == "set" && f.Has(key) }) {
				t.Fatal("the delayed call is not in flight")
			}
			if r := <-res; r.err != nil || r.at > 3*time.Second {
				t.Fatalf("call 4: %v after %v (MaxDelay is 2s)", r.err, r.at)
			}
			continue
		}
		r := <-call(c, sha, key)
		if (r.err == nil) != ok || isSet(t, plain, key) != ok {
			t.Fatalf("call %d: %v, set=%v, want ok=%v", i+1, r.err, isSet(t, plain, key), ok)
		}
	}
	in.SetEnabled(false)
	in2 := faults.New(faults.Config{Scripts: scripts(), Rules: []faults.Rule{{Kind: faults.FailSend, P: 1}}})
	in2.SetEnabled(false)
	c.(goredisClient).AddHook(in2)
	if r := <-call(c, sha, "off"); r.err != nil {
		t.Fatalf("disabled injectors: %v", r.err)
	}
	if n := len(in.Events(nil)); n != 3 {
		t.Fatalf("%d events, want 3: %v", n, in.Events(nil))
	}
}

// A rule with Match applies to the calls it accepts only, and counts only
// those: its second accepted call is the fourth call.
func TestMatch(t *testing.T) {
	_, c, plain, sha := setup(t, "go-redis", faults.Rule{Script: "set", Kind: faults.FailSend, Calls: []int{2},
		Match: func(f faults.Call) bool { return strings.HasPrefix(f.Keys[0], "yes") }})
	for i, key := range []string{"yes1", "no2", "no3", "yes4", "yes5"} {
		r := <-call(c, sha, key)
		if want := key != "yes4"; (r.err == nil) != want || isSet(t, plain, key) != want {
			t.Fatalf("call %d (%s): %v, set=%v, want ok=%v", i+1, key, r.err, isSet(t, plain, key), want)
		}
	}
}

// The same seed makes the same choices for the same calls.
func TestSeeded(t *testing.T) {
	s := redistest.Start(t)
	plain := s.Client(t)
	sha, err := plain.ScriptLoad(context.Background(), setScript).Result()
	if err != nil {
		t.Fatal(err)
	}
	run := func(seed uint64) []bool {
		in := faults.New(faults.Config{Seed: seed, Scripts: scripts(), Rules: []faults.Rule{{Script: "set", Kind: faults.FailSend, P: 0.5}}})
		rdb := s.Client(t)
		rdb.AddHook(in)
		var failed []bool
		for i := 0; i < 64; i++ {
			failed = append(failed, rdb.EvalSha(context.Background(), sha, []string{"k"}, "v").Err() != nil)
		}
		return failed
	}
	a, b, c := run(7), run(7), run(8)
	if !slices.Equal(a, b) {
		t.Fatal("one seed, two different runs")
	}
	if slices.Equal(a, c) {
		t.Fatal("two seeds, one run")
	}
}

// The engine's scripts are named by name, a script joined from two files
// (quorum_acquire) too, and sem.lua's calls by operation.
func TestEngineScripts(t *testing.T) {
	sc := faults.EngineScripts()
	s := redistest.Start(t)
	plain := s.Client(t)
	src, extend := wire.Sem.Src, wire.Extend.Src
	in := faults.New(faults.Config{Scripts: sc, Rules: []faults.Rule{
		{Script: "sem.t", Kind: faults.FailSend, P: 1},
		{Script: "extend", Kind: faults.FailSend, P: 1},
		{Script: "quorum_acquire", Kind: faults.FailSend, P: 1},
	}})
	rdb := s.Client(t)
	rdb.AddHook(in)
	ctx := context.Background()
	keys := []string{"s", "s:h", "s:q", "s:w"}
	// EVAL with the source, and EVALSHA as a prepared command line.
	if err := rdb.Eval(ctx, src, keys, "t", "tok").Err(); !errors.Is(err, faults.ErrNotSent) {
		t.Fatalf("sem.lua t by EVAL: %v", err)
	}
	sha, err := plain.ScriptLoad(ctx, src).Result()
	if err != nil {
		t.Fatal(err)
	}
	if v, err := rdb.Do(ctx, "evalsha", &sha, "4", "s", "s:h", "s:q", "s:w", "r", "tok", "1000").Result(); err != nil || v != int64(0) {
		t.Fatalf("sem.lua r: %v %v (only t is faulted)", v, err)
	}
	if err := rdb.Eval(ctx, extend, []string{"m"}, "tok", "100").Err(); !errors.Is(err, faults.ErrNotSent) {
		t.Fatalf("extend.lua: %v", err)
	}
	if err := rdb.EvalSha(ctx, wire.QuorumAcquire.SHA, []string{"m", "epoch"}, "tok", "100", "0", "0").Err(); !errors.Is(err, faults.ErrNotSent) {
		t.Fatalf("quorum_acquire: %v", err)
	}
	if got := in.Summary(); got != "extend fail-send single=1, quorum_acquire fail-send single=1, sem.t fail-send single=1" {
		t.Fatalf("stats: %s", got)
	}
}

// TestSubFaults: each subscription fault does at the server what it says,
// over either driver.
func TestSubFaults(t *testing.T) {
	s := redistest.Start(t)
	plain := s.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	subscribers := func(ch string) int64 {
		t.Helper()
		n, err := plain.PubSubShardNumSub(ctx, ch).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n[ch]
	}
	eachDriver(t, func(t *testing.T, drv string) {
		ch := func(name string) string { return drv + ":" + name }
		subscribe := func(t *testing.T, sub faults.SubFaults, ch string) (*faults.Injector, subscription, error) {
			in := faults.New(faults.Config{Seed: 1, Scripts: scripts(), Sub: sub})
			ps, err := newClient(t, s, drv, in, nil).subscribe(t, ctx, ch)
			return in, ps, err
		}
		t.Run("none", func(t *testing.T) {
			in, _, err := subscribe(t, faults.SubFaults{}, ch("c0"))
			if err != nil || subscribers(ch("c0")) != 1 || in.Summary() != "" {
				t.Fatalf("err %v, %d subscribers, faults %q: want nil, 1, none", err, subscribers(ch("c0")), in.Summary())
			}
		})
		t.Run("refuse", func(t *testing.T) {
			in, _, err := subscribe(t, faults.SubFaults{Refuse: 1}, ch("c1"))
			var rerr redis.Error
			_, isRueidis := rueidis.IsRedisErr(err)
			if !errors.As(err, &rerr) && !isRueidis || !strings.Contains(err.Error(), "unknown command") {
				t.Fatalf("confirmation: %v, want the server's unknown command error", err)
			}
			if n := subscribers(ch("c1")); n != 0 || in.Stats()["sub refuse"] != 1 {
				t.Fatalf("%d subscribers, faults %q: want 0 and one refusal", n, in.Summary())
			}
		})
		t.Run("drop", func(t *testing.T) {
			in, _, err := subscribe(t, faults.SubFaults{Drop: 1}, ch("c2"))
			if err == nil || in.Stats()["sub drop"] < 1 {
				t.Fatalf("confirmation: %v, faults %q: want an error from a closed connection", err, in.Summary())
			}
			waitZero := time.Now().Add(5 * time.Second)
			for subscribers(ch("c2")) != 0 && time.Now().Before(waitZero) {
				time.Sleep(10 * time.Millisecond)
			}
			if n := subscribers(ch("c2")); n != 0 {
				t.Fatalf("%d subscribers after the drop, want 0", n)
			}
		})
		t.Run("delay", func(t *testing.T) {
			start := time.Now()
			in, _, err := subscribe(t, faults.SubFaults{Delay: 1, MaxDelay: 300 * time.Millisecond}, ch("c3"))
			took := time.Since(start)
			ev := in.Events(nil)
			if err != nil || len(ev) != 1 || took < ev[0].Delay {
				t.Fatalf("err %v, events %v, confirmed after %v: want one delay no longer than that", err, ev, took)
			}
		})
		t.Run("unsubscribe", func(t *testing.T) {
			_, ps, err := subscribe(t, faults.SubFaults{Unsubscribe: 1}, ch("c4"))
			if err != nil || subscribers(ch("c4")) != 1 {
				t.Fatalf("err %v, %d subscribers: the SSUBSCRIBE itself must pass", err, subscribers(ch("c4")))
			}
			if err := ps.ping(ctx); err != nil { // the next write carries the unsubscribe
				t.Fatal(err)
			}
			var got []string
			for range 2 { // the PONG may come first
				ev, err := ps.next(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if got = append(got, ev); ev == "sunsubscribe "+ch("c4") {
					break
				}
			}
			if !slices.Contains(got, "sunsubscribe "+ch("c4")) || subscribers(ch("c4")) != 0 {
				t.Fatalf("heard %q, %d subscribers: want the server's sunsubscribe and none left", got, subscribers(ch("c4")))
			}
		})
	})
}

// subscription is one sharded subscription of a driver's.
type subscription interface {
	ping(ctx context.Context) error
	// next waits (2s at most) for the next thing heard: a subscription
	// event as "KIND CHANNEL", or "" for something else.
	next(ctx context.Context) (string, error)
}

func (c goredisClient) subscribe(t *testing.T, ctx context.Context, ch string) (subscription, error) {
	ps := c.SSubscribe(ctx)
	t.Cleanup(func() { _ = ps.Close() })
	if err := ps.SSubscribe(ctx, ch); err != nil {
		return goredisSub{ps}, err
	}
	_, err := goredisSub{ps}.next(ctx)
	return goredisSub{ps}, err
}

type goredisSub struct{ ps *redis.PubSub }

func (s goredisSub) ping(ctx context.Context) error { return s.ps.Ping(ctx) }

func (s goredisSub) next(ctx context.Context) (string, error) {
	msg, err := s.ps.ReceiveTimeout(ctx, 2*time.Second)
	if sub, ok := msg.(*redis.Subscription); ok {
		return sub.Kind + " " + sub.Channel, err
	}
	return "", err
}

// subscribe subscribes on a dedicated connection with pub/sub hooks, as
// dlock's rueidis driver does.
func (c rueidisClient) subscribe(t *testing.T, ctx context.Context, ch string) (subscription, error) {
	dc, cancel := c.Dedicate()
	t.Cleanup(func() { dc.Close(); cancel() })
	s := rueidisSub{dc: dc, events: make(chan string, 16)}
	s.lost = dc.SetPubSubHooks(rueidis.PubSubHooks{OnSubscription: func(m rueidis.PubSubSubscription) {
		s.events <- m.Kind + " " + m.Channel
	}})
	if err := dc.Do(ctx, dc.B().Ssubscribe().Channel(ch).Build()).Error(); err != nil {
		return s, err
	}
	_, err := s.next(ctx)
	return s, err
}

type rueidisSub struct {
	dc     rueidis.DedicatedClient
	events chan string
	lost   <-chan error
}

func (s rueidisSub) ping(ctx context.Context) error {
	return s.dc.Do(ctx, s.dc.B().Ping().Build()).Error()
}

func (s rueidisSub) next(ctx context.Context) (string, error) {
	select {
	case ev := <-s.events:
		return ev, nil
	case err := <-s.lost:
		return "", fmt.Errorf("connection lost: %v", err)
	case <-time.After(2 * time.Second):
		return "", errors.New("nothing heard in 2s")
	}
}
