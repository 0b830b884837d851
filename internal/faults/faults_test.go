package faults_test

import (
	"context"
	"errors"
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

// setup starts a server and returns a client with in as its hook (the
// scripts loaded; sha is the set script's) and a plain client to look at
// Redis with.
func setup(t *testing.T, rules ...faults.Rule) (in *faults.Injector, rdb, plain *redis.Client, sha string) {
	t.Helper()
	in, rdb, plain, sha = setupWith(t, nil, rules...)
	return
}

func setupWith(t *testing.T, opt func(*redis.Options), rules ...faults.Rule) (*faults.Injector, *redis.Client, *redis.Client, string) {
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
	var opts []func(*redis.Options)
	if opt != nil {
		opts = append(opts, opt)
	}
	rdb := s.Client(t, opts...)
	rdb.AddHook(in)
	return in, rdb, plain, sha
}

// call runs the set script for key in the background and reports its
// result and when it returned.
type result struct {
	v   any
	err error
	at  time.Duration
}

func call(rdb *redis.Client, sha, key string) <-chan result {
	out := make(chan result, 1)
	start := time.Now()
	go func() {
		v, err := rdb.EvalSha(context.Background(), sha, []string{key}, "v").Result()
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

// Each kind of fault is observable at Redis and by the caller.
func TestKinds(t *testing.T) {
	const d = 300 * time.Millisecond
	rule := func(k faults.Kind) faults.Rule {
		return faults.Rule{Script: "set", Kind: k, P: 1, Min: d, Max: d}
	}
	t.Run("delay-send", func(t *testing.T) {
		_, rdb, plain, sha := setup(t, rule(faults.DelaySend))
		res := call(rdb, sha, "k")
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
		_, rdb, plain, sha := setup(t, rule(faults.DelayReply))
		res := call(rdb, sha, "k")
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
		_, rdb, plain, sha := setup(t, rule(faults.LoseReply))
		r := <-call(rdb, sha, "k")
		var ne net.Error
		if r.err == nil || !errors.As(r.err, &ne) || !ne.Timeout() || !errors.Is(r.err, os.ErrDeadlineExceeded) || r.at < d {
			t.Fatalf("lost reply: %v %v after %v, want an i/o timeout after %v", r.v, r.err, r.at, d)
		}
		if !isSet(t, plain, "k") {
			t.Fatal("the command whose reply was lost did not run")
		}
	})
	t.Run("fail-send", func(t *testing.T) {
		_, rdb, plain, sha := setup(t, rule(faults.FailSend))
		if r := <-call(rdb, sha, "k"); r.err == nil || !errors.Is(r.err, faults.ErrNotSent) {
			t.Fatalf("failed send: %v %v", r.v, r.err)
		}
		if isSet(t, plain, "k") {
			t.Fatal("a command that was never sent ran")
		}
	})
	t.Run("cut", func(t *testing.T) {
		noRetry := func(o *redis.Options) { o.MaxRetries = -1 }
		in, rdb, plain, sha := setupWith(t, noRetry, faults.Rule{Script: "set", Kind: faults.Cut, Calls: []int{2}})
		if r := <-call(rdb, sha, "k0"); r.err != nil {
			t.Fatal(r.err)
		}
		r := <-call(rdb, sha, "k")
		if r.err == nil || !strings.Contains(r.err.Error(), "closed") {
			t.Fatalf("cut: %v %v, want a closed-connection error", r.v, r.err)
		}
		if !isSet(t, plain, "k") {
			t.Fatal("the command on the cut connection did not run")
		}
		if in.Stats()["cut-missed"] != 0 {
			t.Fatal("the cut missed its command")
		}
		if r := <-call(rdb, sha, "k2"); r.err != nil {
			t.Fatalf("the next call after a cut: %v", r.err)
		}
	})
	t.Run("delay-write", func(t *testing.T) {
		// The caller's ctx ends while the write is held back: the command
		// runs late all the same, and its reply still comes back.
		in, rdb, plain, sha := setup(t, rule(faults.DelayWrite))
		ctx, cancel := context.WithTimeout(context.Background(), d/3)
		defer cancel()
		res := make(chan result, 1)
		start := time.Now()
		go func() {
			v, err := rdb.EvalSha(ctx, sha, []string{"k"}, "v").Result()
			res <- result{v, err, time.Since(start)}
		}()
		<-ctx.Done()
		if isSet(t, plain, "k") {
			t.Fatal("the command ran before its held-back write")
		}
		if r := <-res; r.err != nil || r.v != int64(1) || r.at < d || !isSet(t, plain, "k") {
			t.Fatalf("after a held-back write: %v %v after %v, set=%v", r.v, r.err, r.at, isSet(t, plain, "k"))
		}
		if in.Stats()["cut-missed"] != 0 {
			t.Fatal("the held-back write missed its command")
		}
	})
	t.Run("delay-send-ctx-ended", func(t *testing.T) {
		// Why DelayWrite exists: go-redis does not send a command whose
		// ctx ended before it took a connection.
		_, rdb, plain, sha := setup(t, rule(faults.DelaySend))
		ctx, cancel := context.WithTimeout(context.Background(), d/3)
		defer cancel()
		if err := rdb.EvalSha(ctx, sha, []string{"k"}, "v").Err(); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a delayed send after its ctx ended: %v, want context.DeadlineExceeded", err)
		}
		if isSet(t, plain, "k") {
			t.Fatal("a command sent after its ctx ended ran")
		}
	})
	t.Run("cut-retried", func(t *testing.T) {
		// go-redis (MaxRetries 3 by default) sends a command again on a new
		// connection when its connection breaks: Redis runs it twice.
		_, rdb, _, _ := setup(t, faults.Rule{Script: "incr", Kind: faults.Cut, P: 1, Limit: 1})
		n, err := rdb.Eval(context.Background(), incrScript, []string{"n"}).Int()
		if err != nil || n != 2 {
			t.Fatalf("a cut call retried by go-redis: %d %v, want 2 runs", n, err)
		}
	})
}

// A fault on a pipeline applies to the whole batch; the watchdog's
// Pipelined renewals are batches, and so are the autopipeliner's.
func TestBatches(t *testing.T) {
	ctx := context.Background()
	t.Run("pipelined-lose-reply", func(t *testing.T) {
		_, rdb, plain, sha := setup(t, faults.Rule{Script: "set", Via: faults.Batch, Kind: faults.LoseReply, P: 1})
		cmds, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.EvalSha(ctx, sha, []string{"a"}, "1")
			p.Get(ctx, "nothing")
			p.EvalSha(ctx, sha, []string{"b"}, "2")
			return nil
		})
		if err == nil {
			t.Fatal("a batch whose replies were lost succeeded")
		}
		for _, c := range cmds {
			if !errors.Is(c.Err(), faults.ErrReplyLost) {
				t.Fatalf("%v: %v, want the lost reply", c.Args(), c.Err())
			}
		}
		if !isSet(t, plain, "a") || !isSet(t, plain, "b") {
			t.Fatal("a batch whose replies were lost did not run")
		}
		// Single calls do not match a Batch rule.
		if r := <-call(rdb, sha, "c"); r.err != nil {
			t.Fatal(r.err)
		}
	})
	t.Run("pipeline-cut", func(t *testing.T) {
		noRetry := func(o *redis.Options) { o.MaxRetries = -1 }
		_, rdb, plain, sha := setupWith(t, noRetry, faults.Rule{Script: "set", Via: faults.Batch, Kind: faults.Cut, P: 1})
		p := rdb.Pipeline()
		p.Exists(ctx, "a")
		p.EvalSha(ctx, sha, []string{"a"}, "1")
		p.EvalSha(ctx, sha, []string{"b"}, "2")
		if _, err := p.Exec(ctx); err == nil {
			t.Fatal("a cut batch succeeded")
		}
		if !isSet(t, plain, "a") || !isSet(t, plain, "b") {
			t.Fatal("the cut batch did not run")
		}
	})
	t.Run("async-autopipeline", func(t *testing.T) {
		// The autopipeliner runs a batch of one through ProcessHook (a
		// single command), a bigger batch through ProcessPipelineHook.
		in, rdb, plain, sha := setup(t, faults.Rule{Script: "set", Kind: faults.LoseReply, P: 1})
		ap, err := rdb.AsyncAutoPipeline()
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
	in, rdb, plain, sha := setup(t,
		faults.Rule{Script: "set", Kind: faults.FailSend, Calls: []int{2}},
		faults.Rule{Script: "set", Kind: faults.DelaySend, Calls: []int{4}, Min: time.Hour, Max: time.Hour},
		faults.Rule{Script: "set", Kind: faults.FailSend, P: 1, Limit: 1},
	)
	want := []bool{false, false, true, true, true} // call 1: the third rule (then at its limit); 2: the first; 4: the second
	for i, ok := range want {
		key := "k" + string(rune('0'+i))
		if i == 3 {
			res := call(rdb, sha, key)
			if !in.WaitInFlight(time.Second, func(c faults.Call) bool { return c.Script == "set" && c.Has(key) }) {
				t.Fatal("the delayed call is not in flight")
			}
			if r := <-res; r.err != nil || r.at > 3*time.Second {
				t.Fatalf("call 4: %v after %v (MaxDelay is 2s)", r.err, r.at)
			}
			continue
		}
		r := <-call(rdb, sha, key)
		if (r.err == nil) != ok || isSet(t, plain, key) != ok {
			t.Fatalf("call %d: %v, set=%v, want ok=%v", i+1, r.err, isSet(t, plain, key), ok)
		}
	}
	in.SetEnabled(false)
	in2 := faults.New(faults.Config{Scripts: scripts(), Rules: []faults.Rule{{Kind: faults.FailSend, P: 1}}})
	in2.SetEnabled(false)
	rdb.AddHook(in2)
	if r := <-call(rdb, sha, "off"); r.err != nil {
		t.Fatalf("disabled injectors: %v", r.err)
	}
	if n := len(in.Events(nil)); n != 3 {
		t.Fatalf("%d events, want 3: %v", n, in.Events(nil))
	}
}

// A rule with Match applies to the calls it accepts only, and counts only
// those: its second accepted call is the fourth call.
func TestMatch(t *testing.T) {
	_, rdb, plain, sha := setup(t, faults.Rule{Script: "set", Kind: faults.FailSend, Calls: []int{2},
		Match: func(c faults.Call) bool { return strings.HasPrefix(c.Keys[0], "yes") }})
	for i, key := range []string{"yes1", "no2", "no3", "yes4", "yes5"} {
		r := <-call(rdb, sha, key)
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

// TestSubFaults: each subscription fault does at the server what it says.
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
	subscribe := func(t *testing.T, sub faults.SubFaults, ch string) (*faults.Injector, *redis.PubSub, error) {
		in := faults.New(faults.Config{Seed: 1, Scripts: scripts(), Sub: sub})
		rdb := s.Client(t)
		rdb.AddHook(in)
		ps := rdb.SSubscribe(ctx)
		t.Cleanup(func() { _ = ps.Close() })
		if err := ps.SSubscribe(ctx, ch); err != nil {
			return in, ps, err
		}
		_, err := ps.ReceiveTimeout(ctx, 2*time.Second)
		return in, ps, err
	}
	t.Run("none", func(t *testing.T) {
		in, _, err := subscribe(t, faults.SubFaults{}, "c0")
		if err != nil || subscribers("c0") != 1 || in.Summary() != "" {
			t.Fatalf("err %v, %d subscribers, faults %q: want nil, 1, none", err, subscribers("c0"), in.Summary())
		}
	})
	t.Run("refuse", func(t *testing.T) {
		in, _, err := subscribe(t, faults.SubFaults{Refuse: 1}, "c1")
		var rerr redis.Error
		if !errors.As(err, &rerr) || !strings.Contains(err.Error(), "unknown command") {
			t.Fatalf("confirmation: %v, want the server's unknown command error", err)
		}
		if n := subscribers("c1"); n != 0 || in.Stats()["sub refuse"] != 1 {
			t.Fatalf("%d subscribers, faults %q: want 0 and one refusal", n, in.Summary())
		}
	})
	t.Run("drop", func(t *testing.T) {
		in, _, err := subscribe(t, faults.SubFaults{Drop: 1}, "c2")
		if err == nil || in.Stats()["sub drop"] < 1 {
			t.Fatalf("confirmation: %v, faults %q: want an error from a closed connection", err, in.Summary())
		}
		waitZero := time.Now().Add(5 * time.Second)
		for subscribers("c2") != 0 && time.Now().Before(waitZero) {
			time.Sleep(10 * time.Millisecond)
		}
		if n := subscribers("c2"); n != 0 {
			t.Fatalf("%d subscribers after the drop, want 0", n)
		}
	})
	t.Run("delay", func(t *testing.T) {
		start := time.Now()
		in, _, err := subscribe(t, faults.SubFaults{Delay: 1, MaxDelay: 300 * time.Millisecond}, "c3")
		took := time.Since(start)
		ev := in.Events(nil)
		if err != nil || len(ev) != 1 || took < ev[0].Delay {
			t.Fatalf("err %v, events %v, confirmed after %v: want one delay no longer than that", err, ev, took)
		}
	})
	t.Run("unsubscribe", func(t *testing.T) {
		_, ps, err := subscribe(t, faults.SubFaults{Unsubscribe: 1}, "c4")
		if err != nil || subscribers("c4") != 1 {
			t.Fatalf("err %v, %d subscribers: the SSUBSCRIBE itself must pass", err, subscribers("c4"))
		}
		if err := ps.Ping(ctx); err != nil { // the next write carries the unsubscribe
			t.Fatal(err)
		}
		var got []string
		for range 2 {
			msg, err := ps.ReceiveTimeout(ctx, 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if sub, ok := msg.(*redis.Subscription); ok {
				got = append(got, sub.Kind+" "+sub.Channel)
			}
		}
		if !slices.Contains(got, "sunsubscribe c4") || subscribers("c4") != 0 {
			t.Fatalf("heard %q, %d subscribers: want the server's sunsubscribe c4 and none left", got, subscribers("c4"))
		}
	})
}
