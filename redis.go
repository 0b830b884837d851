package dlock

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/internal/wire"
	"github.com/redis/go-redis/v9"
)

// script is one of dlock's Lua scripts (internal/wire), run with EVALSHA
// and loaded on NOSCRIPT.
type script struct {
	name, src, sha string
}

func loadScript(s *wire.Script) *script { return &script{name: s.Name, src: s.Src, sha: s.SHA} }

var (
	acquireScript     = loadScript(wire.Acquire)
	releaseScript     = loadScript(wire.Release)
	extendScript      = loadScript(wire.Extend)
	pttlScript        = loadScript(wire.PTTL)
	passScript        = loadScript(wire.Pass)
	fairAcquireScript = loadScript(wire.FairAcquire)
	fairLeaveScript   = loadScript(wire.FairLeave)
	semScript         = loadScript(wire.Sem)
)

// cmdline holds a holding's acquire and release command lines, built once
// in place as {"evalsha", &sha, numkeys, keys..., args...}. The arguments
// are pointers to strings that live as long as the holding (its lock's, or
// its own), so go-redis neither copies nor boxes them: this is where the
// hot path's allocations are saved, and the only place that plays such
// tricks. A line that carries the Client's publish command (pubsub.arg) is
// sent only after pubsubReady: attempt, the first send of every holding,
// sees to that.
type cmdline struct {
	acq                  [18]any
	rel                  [11]any
	acqLen, relLen       int
	acqScript, relScript *script
	join                 string // "1" once the acquire takes a place in line, else "0"
	nArg                 string // a semaphore acquire's permits
}

func (c *cmdline) acquire() []any { return c.acq[:c.acqLen] }
func (c *cmdline) release() []any { return c.rel[:c.relLen] }

// setAcquire and setRelease build the command lines. A line is never
// changed while it may be in flight (only between attempts).
func (c *cmdline) setAcquire(s *script, args ...any) {
	c.acqScript = s
	c.acqLen = copy(c.acq[:], args)
}

func (c *cmdline) setRelease(s *script, args ...any) {
	c.relScript = s
	c.relLen = copy(c.rel[:], args)
}

func formatMillis(d time.Duration) string { return strconv.FormatInt(d.Milliseconds(), 10) }
func formatUint(u uint64) string          { return strconv.FormatUint(u, 10) }

// scripter is what running a script needs: a client, a pipeline or a transaction.
type scripter interface {
	EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd
	Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd
}

// run executes the script, sending its source only when the server does not
// have it cached (after a restart, failover or SCRIPT FLUSH).
func (s *script) run(ctx context.Context, r scripter, keys []string, args ...any) (any, error) {
	v, err := r.EvalSha(ctx, s.sha, keys, args...).Result()
	if err != nil && isNoScript(err) {
		v, err = r.Eval(ctx, s.src, keys, args...).Result()
	}
	return v, err
}

// processor sends a command: a client or a pipeline.
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// do runs a script from a prepared command line (see cmdline); once: see
// onceCmd.
func (s *script) do(ctx context.Context, r processor, args []any, once bool) (any, error) {
	v, err := process(ctx, r, args, once)
	if err != nil && isNoScript(err) {
		v, err = process(ctx, r, s.withSource(args), once)
	}
	return v, err
}

// withSource returns a copy of a prepared command line of s that sends the
// script's source (EVAL), for a server that does not have it cached.
func (s *script) withSource(args []any) []any {
	a := make([]any, len(args))
	copy(a, args)
	a[0], a[1] = "eval", s.src
	return a
}

func process(ctx context.Context, r processor, args []any, once bool) (any, error) {
	cmd := redis.NewCmd(ctx, args...)
	_ = r.Process(ctx, cmder(cmd, once))
	return cmd.Result()
}

// onceCmd is a command that go-redis must not send again by itself after a
// network error (it would, by default): a release that ran twice answers
// its second run "not the owner", which only the caller can tell from a
// lease lost before, if it knows that it sent the release again (see
// holding.release).
type onceCmd struct{ *redis.Cmd }

// NoRetry tells go-redis not to resend the command.
func (onceCmd) NoRetry() bool { return true }

func cmder(cmd *redis.Cmd, once bool) redis.Cmder {
	if once {
		return onceCmd{cmd}
	}
	return cmd
}

// clusterHint makes a ClusterClient reload its slot map after a call that
// could not reach its node or was redirected. go-redis reloads the map by
// itself only after a MOVED, ASK or READONLY reply, and once a minute: when
// a master dies, the calls for its slots would fail until then, though the
// cluster promoted a replica seconds after. A reload is cheap, runs in the
// background and is coalesced by go-redis (one at a time, 200 ms apart).
func (c *Client) clusterHint(err error) {
	cc, ok := c.rdb.(*redis.ClusterClient)
	if !ok || err == nil {
		return
	}
	var ne net.Error
	msg := err.Error()
	if errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		strings.HasPrefix(msg, "MOVED ") || strings.HasPrefix(msg, "ASK ") || strings.HasPrefix(msg, "CLUSTERDOWN") {
		cc.ReloadState(context.Background())
	}
}

func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// isForeign reports a script's refusal to touch a key that is not a dlock
// lock of its kind.
func isForeign(err error) bool {
	return err != nil && errors.Is(scriptErr("", "", err), ErrForeignKey)
}

// eval runs a script call for a caller that waits on ctx (see aside).
func (c *Client) eval(ctx context.Context, k call) (any, error) {
	return c.aside(ctx, func(ctx context.Context) (any, error) { return k.s.run(ctx, c.rdb, k.keys, k.args...) }, nil)
}

// pipelineAbove is how many lock-path calls must be in flight before a new
// one goes through the autopipeliner.
const pipelineAbove = 8

// runLine runs a prepared command line of script s. If the caller's ctx
// ends before the reply, late (if not nil) gets the reply when it comes.
// Urgent calls (a hand-off is waiting on them) skip the pipeliner. A call
// without doubt is sent once (see onceCmd): its caller resends it. One with
// doubt is resent after a failure as go-redis would: by go-redis itself on
// a pooled connection, by runLine through the pipeliner (which sends every
// call once, see submit), and then *doubt is set, for a send whose outcome
// is unknown may yet run.
func (c *Client) runLine(ctx context.Context, s *script, args []any, urgent bool, doubt *bool, late func(any, error)) (any, error) {
	// Calls go straight to a pooled connection unless many are in flight:
	// batching saves system calls only when there are round trips to
	// share, and costs every call a hop through the pipeliner's goroutine.
	n := c.inflight.Add(1)
	defer c.inflight.Add(-1)
	if n > pipelineAbove && c.ap != nil && !urgent {
		v, err := c.pipelined(ctx, s, args, late)
		if err != nil && doubt != nil {
			// Ask again with the same line, as on a pooled connection (an
			// acquire that ran finds the lock its token's).
			v, err = resend(ctx, v, err, func(error) { *doubt = true }, func() (any, error) { return c.pipelined(ctx, s, args, late) })
		}
		return v, err
	}
	once := doubt == nil
	if c.ctxAware || ctx.Done() == nil {
		return s.do(ctx, c.rdb, args, once) // as aside would, without making its closure
	}
	return c.aside(ctx, func(ctx context.Context) (any, error) { return s.do(ctx, c.rdb, args, once) }, late)
}

// pipelined runs a prepared command line of script s on the client's
// autopipeliner (see submit), loading s on NOSCRIPT.
func (c *Client) pipelined(ctx context.Context, s *script, args []any, late func(any, error)) (any, error) {
	v, err := c.submit(ctx, args, late)
	if err != nil && isNoScript(err) {
		// Load it (on every shard of a cluster) and send it again. The
		// load goes on a pooled connection: aside, so that a server that
		// stops answering does not hold the caller past ctx.
		if _, lerr := c.aside(ctx, func(ctx context.Context) (any, error) { return nil, c.rdb.ScriptLoad(ctx, s.src).Err() }, nil); lerr != nil {
			return nil, lerr
		}
		v, err = c.submit(ctx, args, late)
	}
	return v, err
}

// submit runs one prepared command line on the client's deferred
// autopipeliner and waits for it or for ctx, without a goroutine per call.
// If ctx ends first, the command still runs: late (if not nil) gets its
// reply when it comes.
//
// Every call goes in sent once (see onceCmd), releases and acquires alike:
// go-redis's autopipeliner splits a batch where the retry policy changes and
// keeps commands that must not be resent out of its fastest path, which
// costs every call of a batch that mixes them (a quarter of the throughput
// with only releases marked). The engine resends what go-redis would have
// (runLine: an acquire, with the same token; holding.release: a release).
func (c *Client) submit(ctx context.Context, args []any, late func(any, error)) (any, error) {
	cmd := redis.NewCmd(ctx, args...)
	f := c.ap.Submit(ctx, onceCmd{cmd})
	if err := f.WaitContext(ctx); err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		if late != nil {
			c.goBg(func() {
				_ = f.Wait()
				late(cmd.Result())
			})
		}
		return nil, err
	}
	return cmd.Result()
}

// aside runs f. go-redis bounds its socket I/O by ctx only when the client
// has ContextTimeoutEnabled; without it a paused server holds the caller
// for the client's own read timeout. Then f runs on a goroutine and the
// caller returns when ctx ends (f itself still ends at the client's
// timeout, and late gets its reply).
func (c *Client) aside(ctx context.Context, f func(context.Context) (any, error), late func(any, error)) (any, error) {
	if c.ctxAware || ctx.Done() == nil {
		return f(ctx)
	}
	type result struct {
		v   any
		err error
	}
	ch := make(chan result, 1)
	var gone, handed atomic.Bool // handed: late got the reply (exactly once)
	if !c.goBg(func() {
		v, err := f(ctx)
		ch <- result{v, err}
		if late != nil && gone.Load() && handed.CompareAndSwap(false, true) {
			late(v, err)
		}
	}) {
		return f(ctx) // the Client is closing: no goroutine may start
	}
	select {
	case r := <-ch:
		return r.v, r.err
	case <-ctx.Done():
		gone.Store(true)
		// The reply may have come at the same moment: hand it on.
		select {
		case r := <-ch:
			if late != nil && handed.CompareAndSwap(false, true) {
				late(r.v, r.err)
			}
		default:
		}
		return nil, ctx.Err()
	}
}

// contextAware reports whether rdb bounds socket I/O by the ctx deadline.
func contextAware(rdb redis.UniversalClient) bool {
	switch r := rdb.(type) {
	case *redis.Client:
		return r.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return r.Options().ContextTimeoutEnabled
	case *redis.Ring:
		return r.Options().ContextTimeoutEnabled
	}
	return false
}

// releaseCall sends h's release. One that is likely to hand the lock over
// (h was obtained after waiting) goes with a cheap read of the lock key in
// front of it in the same write: Redis then has output pending for us when
// the script publishes the hand-over, and writes pending output
// newest-first, so the next holder's message leaves before our reply and
// the next holder's process is woken first (bench/ -scenario hotkey). It is
// sent once (see onceCmd): the caller resends it.
func (c *Client) releaseCall(ctx context.Context, h *holding) (any, error) {
	if c.q != nil {
		return c.q.release(ctx, h)
	}
	args := h.cmd.release()
	if !h.contended {
		return c.runLine(ctx, h.cmd.relScript, args, false, nil, nil)
	}
	c.inflight.Add(1)
	defer c.inflight.Add(-1)
	return c.aside(ctx, func(ctx context.Context) (any, error) {
		pipe := c.rdb.Pipeline()
		pipe.Exists(ctx, h.lk.hash)
		cmd := redis.NewCmd(ctx, args...)
		_ = pipe.Process(ctx, onceCmd{cmd})
		_, _ = pipe.Exec(ctx)
		v, err := cmd.Result()
		if err != nil && isNoScript(err) {
			return h.cmd.relScript.do(ctx, c.rdb, args, true)
		}
		return v, err
	}, nil)
}
