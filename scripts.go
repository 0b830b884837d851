package dlock

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"

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
	acquireScript = loadScript(wire.Acquire)
	releaseScript = loadScript(wire.Release)
	extendScript  = loadScript(wire.Extend)
	pttlScript    = loadScript(wire.PTTL)
	passScript    = loadScript(wire.Pass)

	fairAcquireScript = loadScript(wire.FairAcquire)
	fairLeaveScript   = loadScript(wire.FairLeave)

	semScript = loadScript(wire.Sem)
)

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

// doer sends an arbitrary command: a client or a pipeline.
type doer interface {
	Do(ctx context.Context, args ...any) *redis.Cmd
}

// submit runs one prepared command line on the client's deferred
// autopipeliner and waits for it or for ctx, without a goroutine per call.
// If ctx ends first, the command still runs: late (if not nil) gets its
// reply when it comes.
func (c *Client) submit(ctx context.Context, args []any, late func(any, error)) (any, error) {
	cmd := redis.NewCmd(ctx, args...)
	f := c.ap.Submit(ctx, cmd)
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

func isNoScript(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT")
}

// do runs a script from a prepared command line
// {"evalsha", &s.sha, numkeys, keys..., args...}. Building it in place (with
// pointers to strings the caller keeps) spares go-redis its own copy and a
// boxing allocation per argument on the hot path.
func (s *script) do(ctx context.Context, r doer, args []any) (any, error) {
	v, err := r.Do(ctx, args...).Result()
	if err != nil && isNoScript(err) {
		a := make([]any, len(args))
		copy(a, args)
		a[0], a[1] = "eval", s.src
		v, err = r.Do(ctx, a...).Result()
	}
	return v, err
}

// eval runs a script for a caller that waits on ctx. go-redis bounds its
// socket I/O by ctx only when the client has ContextTimeoutEnabled; without
// it a paused server holds the caller for the client's own read timeout. In
// that case the call runs aside and the caller returns when ctx ends (the
// call itself still ends at the client's timeout).
func (c *Client) eval(ctx context.Context, s *script, keys []string, args ...any) (any, error) {
	return c.aside(ctx, func(ctx context.Context) (any, error) { return s.run(ctx, c.rdb, keys, args...) }, nil)
}

// pipelineAbove is how many lock-path calls must be in flight before a new
// one goes through the autopipeliner.
const pipelineAbove = 8

// evalArgs is eval for a prepared command line (see script.do). If the
// caller's ctx ends before the reply, late (if not nil) gets the reply when
// it comes. Urgent calls (a hand-off is waiting on them) skip the pipeliner.
func (c *Client) evalArgs(ctx context.Context, s *script, args []any, urgent bool, late func(any, error)) (any, error) {
	// Callers go straight to a pooled connection unless many calls are in
	// flight: batching saves system calls only when there are round trips to
	// share, and costs every call a hop through the pipeliner's goroutine.
	// (With >1 as the bar, the market's 10 workers lost 15% of their
	// purchases to that hop; with >8, 64 goroutines still batch.)
	if c.inflight.Add(1) > pipelineAbove && c.ap != nil && !urgent {
		defer c.inflight.Add(-1)
		v, err := c.submit(ctx, args, late)
		if err != nil && isNoScript(err) {
			// Load it (on every shard of a cluster) and send it again.
			if lerr := c.rdb.ScriptLoad(ctx, s.src).Err(); lerr != nil {
				return nil, lerr
			}
			v, err = c.submit(ctx, args, late)
		}
		return v, err
	}
	defer c.inflight.Add(-1)
	if c.ctxAware || ctx.Done() == nil {
		return s.do(ctx, c.rdb, args)
	}
	return c.aside(ctx, func(ctx context.Context) (any, error) { return s.do(ctx, c.rdb, args) }, late)
}

// aside runs f, returning early with ctx's error when ctx ends first and
// the client would not notice that by itself.
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

// releaseHandingOver runs a release that is likely to hand the lock over. It
// sends a cheap read of the lock key in the same write, just before the
// script: Redis then has output pending for us when the script publishes the
// hand-over, and writes pending output newest-first, so the next holder's
// message leaves before our reply and the next holder's process is woken
// first (on two cores, our own wake-up competed with it: about 25 µs per
// hand-off, bench/ -scenario hotkey).
func (c *Client) releaseHandingOver(ctx context.Context, h *holding) (any, error) {
	c.inflight.Add(1)
	defer c.inflight.Add(-1)
	return c.aside(ctx, func(ctx context.Context) (any, error) {
		args := h.rel[:h.relLen]
		pipe := c.rdb.Pipeline()
		pipe.Exists(ctx, h.key)
		cmd := redis.NewCmd(ctx, args...)
		_ = pipe.Process(ctx, cmd)
		_, _ = pipe.Exec(ctx)
		v, err := cmd.Result()
		if err != nil && isNoScript(err) {
			return h.relScript.do(ctx, c.rdb, args)
		}
		return v, err
	}, nil)
}
