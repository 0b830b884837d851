// Package faults injects seeded faults into the Lua script calls of a
// go-redis v9 client or a rueidis client, for tests that run against real
// redis-server processes.
//
// An Injector is a redis.Hook: add it to a client with AddHook before the
// client's first command (its DialHook wraps every connection the client
// makes, so that one can be cut). Or make a rueidis client with its
// NewRueidis, which wraps the client's Do and DoMulti and its dialer the
// same way (see there). For each EVALSHA or EVAL it sees, alone
// (ProcessHook, rueidis's Do) or in a pipeline (ProcessPipelineHook:
// Pipelined, Pipeline, and the batches of the client's AutoPipeline and
// AsyncAutoPipeline; rueidis's DoMulti), it names the script by its SHA1
// (or the SHA1 of the source sent with EVAL) from a Scripts table, and
// asks its Rules, in order, whether to inject:
//
//   - DelaySend: wait, then send (Redis runs the command late);
//   - DelayReply: send at once; the caller sees the reply late;
//   - LoseReply: send at once and let Redis run it; the caller gets an i/o
//     timeout (after the delay) instead of the reply;
//   - FailSend: never send; the caller gets a connection error (after the
//     delay);
//   - Cut: close the connection as soon as the command is written: Redis
//     runs it (and, in a pipeline, the whole batch), the caller gets a
//     closed-connection error;
//   - DelayWrite: let the client take a connection and write the command,
//     and hold the write back on its way: the command is committed, so
//     the caller's ctx ending no longer stops it, and Redis runs it late.
//   - RunLate: the caller gets an i/o timeout at once, and Redis runs the
//     command after the delay, answered to nobody (a request slow on the
//     network past the client's read timeout).
//
// A fault on a pipeline applies to the whole batch. A Rule fires at random
// with probability P (drawn from the Injector's seeded math/rand/v2 source,
// so a run is deterministic given the seed as far as goroutine scheduling
// allows), or on exact matching calls (Calls: "the 2nd call of pass").
// Every delay is bounded by the Injector's MaxDelay. Commands that are not
// script calls pass untouched, and so does everything while the Injector
// is disabled.
//
// Subscription faults (Config.Sub) are made at the connection instead, on
// whatever the client's subscription connections write: an SSUBSCRIBE written
// late, refused by the server, or followed by the connection's close, and
// an SUNSUBSCRIBE of a subscribed channel slipped in after a write, so that
// the server ends that subscription behind the client's back.
//
// Only tests import this package: the go-redis build of dlock never
// compiles rueidis.
//
// The Injector is safe for concurrent use.
package faults

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Kind is what happens to a command.
type Kind uint8

const (
	// None: the command is sent and answered as usual.
	None Kind = iota
	// DelaySend waits, then sends: Redis runs the command late.
	DelaySend
	// DelayReply sends at once; the caller sees the reply late.
	DelayReply
	// LoseReply sends at once and lets Redis run the command; after the
	// delay the caller gets an i/o timeout (ErrReplyLost) instead.
	LoseReply
	// FailSend never sends; after the delay the caller gets a connection
	// error (ErrNotSent).
	FailSend
	// Cut closes the connection once the command (or its whole pipeline) is
	// written: Redis runs it, the caller gets a closed-connection error.
	Cut
	// DelayWrite holds the connection write that carries the command (or
	// its whole pipeline) back for the delay: go-redis has taken a
	// connection and committed to the command, so a caller's ctx that ends
	// meanwhile no longer stops it (DelaySend's would: go-redis does not
	// send for an ended ctx). Redis runs it late. Keep the delay under the
	// client's write timeout (go-redis's WriteTimeout; rueidis's
	// ConnWriteTimeout, or the deadline of the caller's ctx when rueidis
	// writes a lone command itself).
	DelayWrite
	// RunLate fails the caller at once with ErrReplyLost, as a read
	// timeout would, and sends a copy of the command (or of its whole
	// pipeline) after the delay, with no caller: Redis runs it late, as
	// it runs a request that was slow on the network past the client's
	// read timeout. Unlike DelayWrite it needs no ended ctx, so a call
	// that a live caller sends again (with the same arguments) meets the
	// late run of the first.
	RunLate
)

var kindNames = [...]string{"none", "delay-send", "delay-reply", "lose-reply", "fail-send", "cut", "delay-write", "run-late"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", k)
}

// Via is how a command reached the client.
type Via uint8

const (
	// AnyVia matches both.
	AnyVia Via = iota
	// Single: one command (Do, EvalSha, Eval, Script.Run).
	Single
	// Batch: a pipeline (Pipelined, Pipeline.Exec) or an autopipelined batch.
	Batch
)

func (v Via) String() string {
	switch v {
	case Single:
		return "single"
	case Batch:
		return "batch"
	}
	return "any"
}

// A Rule decides faults for the script calls it matches.
type Rule struct {
	// Script names the script as the Scripts table does (the engine's by
	// name: "pass", "extend"). A multi-operation script's calls are named
	// SCRIPT.OP by their first argument when the Scripts table says so
	// (Ops), and "sem" then matches every "sem.OP". "" matches every
	// script call.
	Script string
	// Via restricts the rule to single commands or to batches.
	Via Via
	// Match, if set, restricts the rule further to the calls it accepts
	// (by their keys and arguments: a script's calls that take one path).
	Match func(Call) bool
	// Kind is the fault.
	Kind Kind
	// P is the chance that a matching call gets the fault. Ignored when
	// Calls is set.
	P float64
	// Calls lists the matching calls (counted from 1, per rule) that get
	// the fault, whatever P.
	Calls []int
	// Min and Max bound the delay, drawn uniformly (for DelaySend,
	// DelayReply, DelayWrite and RunLate: the delay; for LoseReply and FailSend: how
	// long until the error). Capped by the Injector's MaxDelay.
	Min, Max time.Duration
	// Limit caps the faults this rule injects (0: no cap).
	Limit int
}

func (r Rule) matches(c Call) bool {
	if r.Via != AnyVia && r.Via != c.Via || r.Match != nil && !r.Match(c) {
		return false
	}
	if r.Script == "" || r.Script == c.Script {
		return true
	}
	return strings.HasPrefix(c.Script, r.Script+".")
}

// Config configures an Injector.
type Config struct {
	// Seed seeds the random source of the rules' P draws and delays.
	Seed uint64
	// Scripts names the scripts the client runs (see EngineScripts).
	Scripts *Scripts
	// Rules are asked in order; the first that fires decides the fault.
	Rules []Rule
	// MaxDelay caps every delay. Default 2s.
	MaxDelay time.Duration
	// Epoch is time zero of Event.At. Default: when New was called.
	Epoch time.Time
	// EventLog is how many of the latest faults Events keeps. Default 4096.
	EventLog int
	// Sub decides faults on the client's sharded subscriptions.
	Sub SubFaults
}

// An Injector injects the faults its rules decide. It is a redis.Hook.
type Injector struct {
	scripts  *Scripts
	sub      SubFaults
	maxDelay time.Duration
	epoch    time.Time
	enabled  atomic.Bool

	mu       sync.Mutex
	rng      *rand.Rand
	rules    []Rule
	matched  []int // per rule: matching calls seen
	fired    []int // per rule: faults injected
	stats    map[string]int
	events   []Event // ring of the latest faults
	nEvents  int     // faults ever logged
	inflight map[uint64]Call
	seq      uint64

	armedN atomic.Int32 // write signatures armed: writes look only when > 0
	armed  map[uint64]*armedWrite

	late sync.WaitGroup // RunLate copies not yet answered
}

// WaitLate waits until every RunLate copy sent so far has been answered.
func (in *Injector) WaitLate() { in.late.Wait() }

// New returns an enabled Injector.
func New(cfg Config) *Injector {
	if cfg.MaxDelay <= 0 {
		cfg.MaxDelay = 2 * time.Second
	}
	if cfg.Epoch.IsZero() {
		cfg.Epoch = time.Now()
	}
	if cfg.EventLog <= 0 {
		cfg.EventLog = 4096
	}
	in := &Injector{
		scripts:  cfg.Scripts,
		sub:      cfg.Sub,
		maxDelay: cfg.MaxDelay,
		epoch:    cfg.Epoch,
		rng:      rand.New(rand.NewPCG(cfg.Seed, 0x6661756c7473)),
		rules:    slices.Clone(cfg.Rules),
		matched:  make([]int, len(cfg.Rules)),
		fired:    make([]int, len(cfg.Rules)),
		stats:    make(map[string]int),
		events:   make([]Event, 0, cfg.EventLog),
		inflight: make(map[uint64]Call),
		armed:    make(map[uint64]*armedWrite),
	}
	in.enabled.Store(true)
	return in
}

// SetEnabled turns fault injection on or off (calls are still tracked by
// InFlight).
func (in *Injector) SetEnabled(on bool) { in.enabled.Store(on) }

// A Call is one script call as the Injector saw it.
type Call struct {
	Script string // the script's name, "SCRIPT.OP" for an Ops script, "?SHA" if unknown
	Via    Via
	Keys   []string
	Args   []string
}

// Has reports whether s is one of the call's keys or arguments.
func (c Call) Has(s string) bool { return slices.Contains(c.Args, s) || slices.Contains(c.Keys, s) }

// An Event is one injected fault.
type Event struct {
	At    time.Duration // since the Injector's Epoch, when the fault was decided
	Kind  Kind
	Delay time.Duration
	Call  Call // the call that decided it (for a batch: its first script call)
	Batch int  // commands in the batch (1 for a single command)
}

func (e Event) String() string {
	return fmt.Sprintf("%9.3fs %-11s %-7v %-6s batch=%d keys=%q args=%q",
		e.At.Seconds(), e.Kind, e.Delay.Round(time.Millisecond), e.Call.Script, e.Batch, e.Call.Keys, e.Call.Args)
}

// decide asks the rules about the script calls of one command or batch.
// Every matching rule counts each call, and every matching P rule draws,
// whether or not a fault was already chosen, so that one rule's firing does
// not shift the others' counts and draws. The first (call, rule) that fires
// decides the fault for the whole command or batch.
func (in *Injector) decide(calls []Call, batch int) (Kind, time.Duration) {
	if !in.enabled.Load() {
		return None, 0
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	kind, delay, winner := None, time.Duration(0), -1
	var by Call
	for _, c := range calls {
		for i, r := range in.rules {
			if !r.matches(c) {
				continue
			}
			in.matched[i]++
			var fire bool
			if len(r.Calls) > 0 {
				fire = slices.Contains(r.Calls, in.matched[i])
			} else if r.P > 0 {
				fire = in.rng.Float64() < r.P
			}
			if !fire || winner >= 0 || (r.Limit > 0 && in.fired[i] >= r.Limit) {
				continue
			}
			winner, kind, by = i, r.Kind, c
			lo, hi := min(r.Min, in.maxDelay), min(max(r.Max, r.Min), in.maxDelay)
			delay = lo
			if hi > lo {
				delay += time.Duration(in.rng.Int64N(int64(hi - lo + 1)))
			}
		}
	}
	if winner < 0 || kind == None {
		return None, 0
	}
	in.fired[winner]++
	in.stats[by.Script+" "+kind.String()+" "+by.Via.String()]++
	e := Event{At: time.Since(in.epoch), Kind: kind, Delay: delay, Call: by, Batch: batch}
	if len(in.events) < cap(in.events) {
		in.events = append(in.events, e)
	} else {
		in.events[in.nEvents%cap(in.events)] = e
	}
	in.nEvents++
	return kind, delay
}

// count adds n to a named statistic.
func (in *Injector) count(what string, n int) {
	in.mu.Lock()
	in.stats[what] += n
	in.mu.Unlock()
}

// Stats returns how many faults were injected, by "SCRIPT KIND VIA", plus
// "cut-missed" (a Cut or DelayWrite whose command was never seen written)
// if any.
func (in *Injector) Stats() map[string]int {
	in.mu.Lock()
	defer in.mu.Unlock()
	out := make(map[string]int, len(in.stats))
	for k, v := range in.stats {
		out[k] = v
	}
	return out
}

// Summary is Stats as one sorted line.
func (in *Injector) Summary() string {
	st := in.Stats()
	keys := make([]string, 0, len(st))
	for k := range st {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s=%d", k, st[k])
	}
	return b.String()
}

// Events returns the latest injected faults, oldest first, that satisfy
// keep (all if keep is nil).
func (in *Injector) Events(keep func(Event) bool) []Event {
	in.mu.Lock()
	defer in.mu.Unlock()
	var all []Event
	if in.nEvents > cap(in.events) {
		i := in.nEvents % cap(in.events)
		all = append(slices.Clone(in.events[i:]), in.events[:i]...)
	} else {
		all = slices.Clone(in.events)
	}
	if keep == nil {
		return all
	}
	return slices.DeleteFunc(all, func(e Event) bool { return !keep(e) })
}

// InFlight reports whether a script call that satisfies match is in the
// hook now (waiting to be sent, at Redis, or waiting to be answered).
func (in *Injector) InFlight(match func(Call) bool) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	for _, c := range in.inflight {
		if match(c) {
			return true
		}
	}
	return false
}

// WaitInFlight waits, at most d, until InFlight(match) holds, looking every
// millisecond. It reports whether it did.
func (in *Injector) WaitInFlight(d time.Duration, match func(Call) bool) bool {
	end := time.Now().Add(d)
	for {
		if in.InFlight(match) {
			return true
		}
		if !time.Now().Before(end) {
			return false
		}
		time.Sleep(time.Millisecond)
	}
}

func (in *Injector) enter(calls []Call) uint64 {
	in.mu.Lock()
	defer in.mu.Unlock()
	first := in.seq + 1
	for _, c := range calls {
		in.seq++
		in.inflight[in.seq] = c
	}
	return first
}

func (in *Injector) leave(first uint64, n int) {
	in.mu.Lock()
	defer in.mu.Unlock()
	for i := 0; i < n; i++ {
		delete(in.inflight, first+uint64(i))
	}
}
