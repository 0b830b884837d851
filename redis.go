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

	"github.com/dlock-go/dlock/internal/driver"
	"github.com/dlock-go/dlock/internal/wire"
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

// line returns the command line that runs s with keys and args by EVALSHA
// (see driver).
func (s *script) line(keys []string, args []any) []any {
	l := make([]any, 0, 3+len(keys)+len(args))
	l = append(l, "evalsha", s.sha, len(keys))
	for _, k := range keys {
		l = append(l, k)
	}
	return append(l, args...)
}

// run executes the script, sending its source only when the server does not
// have it cached (after a restart, failover or SCRIPT FLUSH).
//
// A call made this way may be sent again after a failure: go-redis does so
// by itself, and for a driver that does not (driver.Traits.Resends) run
// does so as go-redis would, up to releaseResends times while ctx lasts.
func (s *script) run(ctx context.Context, d driver.Conn, keys []string, args ...any) (any, error) {
	line := s.line(keys, args)
	v, err := s.do(ctx, d, line, false)
	if err != nil && !d.Traits().Resends {
		v, err = resend(ctx, v, err, nil, func() (any, error) { return s.do(ctx, d, line, false) })
	}
	return v, err
}

// do runs a script from a prepared command line (see cmdline); once: the
// driver must not resend it by itself (see driver.Conn.Do): a release that
// ran twice answers its second run "not the owner", which only the caller
// can tell from a lease lost before, if it knows that it sent the release
// again (see holding.release).
func (s *script) do(ctx context.Context, d driver.Conn, args []any, once bool) (any, error) {
	v, err := d.Do(ctx, args, once)
	if err != nil && isNoScript(err) {
		v, err = d.Do(ctx, s.withSource(args), once)
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

// clusterHint makes a Cluster client reload its slot map after a call that
// could not reach its node or was redirected. go-redis reloads the map by
// itself only after a MOVED, ASK or READONLY reply, and once a minute: when
// a master dies, the calls for its slots would fail until then, though the
// cluster promoted a replica seconds after. The driver reloads in the
// background, coalesced (see driver.Conn.ReloadSlots).
func (c *Client) clusterHint(err error) {
	if err == nil || !c.tr.Slots {
		return
	}
	var ne net.Error
	msg := err.Error()
	if errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		strings.HasPrefix(msg, "MOVED ") || strings.HasPrefix(msg, "ASK ") || strings.HasPrefix(msg, "CLUSTERDOWN") {
		c.drv.ReloadSlots()
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
	return c.aside(ctx, func(ctx context.Context) (any, error) { return k.s.run(ctx, c.drv, k.keys, k.args...) }, nil)
}

// pipelineAbove is how many lock-path calls must be in flight before a new
// one goes through the autopipeliner.
const pipelineAbove = 8

// runLine runs a prepared command line of script s. If the caller's ctx
// ends before the reply, late (if not nil) gets the reply when it comes.
// Urgent calls (a hand-off is waiting on them) skip the pipeliner. A call
// without doubt is sent once (see script.do): its caller resends it. One
// with doubt is resent after a failure as go-redis would: by a driver that
// resends by itself (go-redis on a pooled connection), else by runLine
// (through the pipeliner, which sends every call once, and on a driver
// that never resends), and then *doubt is set, for a send whose outcome is
// unknown may yet run.
func (c *Client) runLine(ctx context.Context, s *script, args []any, urgent bool, doubt *bool, late func(any, error)) (any, error) {
	// Calls go straight to a pooled connection unless many are in flight:
	// batching saves system calls only when there are round trips to
	// share, and costs every call a hop through the pipeliner's goroutine.
	// A driver whose Submit sends at once and waits without a goroutine
	// (driver.Traits.EagerSubmit) is cheaper than running the call aside,
	// so it takes every call that would run aside, urgent ones too.
	n := c.inflight.Add(1)
	defer c.inflight.Add(-1)
	if c.tr.Pipelined && (n > pipelineAbove && !urgent || c.tr.EagerSubmit && ctx.Done() != nil) {
		// An acquire (doubt) is a waiting call, which Close ends; a
		// release runs to its reply or ctx, as it would on a pooled
		// connection.
		var stop <-chan struct{}
		if doubt != nil {
			stop = c.bg.Done()
		}
		v, err := c.pipelined(ctx, s, args, late, stop)
		if err != nil && doubt != nil {
			// Ask again with the same line, as on a pooled connection (an
			// acquire that ran finds the lock its token's).
			v, err = resend(ctx, v, err, func(error) { *doubt = true }, func() (any, error) {
				if c.closed.Load() {
					return nil, ErrClosed // not sent: Close ends a waiting call
				}
				return c.pipelined(ctx, s, args, late, stop)
			})
		}
		return v, err
	}
	if doubt == nil || c.tr.Resends {
		return c.direct(ctx, s, args, doubt == nil, late)
	}
	v, err := c.direct(ctx, s, args, false, late)
	if err != nil {
		v, err = resend(ctx, v, err, func(error) { *doubt = true }, func() (any, error) {
			if c.closed.Load() {
				return nil, ErrClosed // not sent: Close ends a waiting call
			}
			return c.direct(ctx, s, args, false, late)
		})
	}
	return v, err
}

// direct runs a prepared command line of s on a pooled connection, aside
// unless the driver bounds its I/O by ctx.
func (c *Client) direct(ctx context.Context, s *script, args []any, once bool, late func(any, error)) (any, error) {
	if c.tr.ContextAware || ctx.Done() == nil {
		return s.do(ctx, c.drv, args, once) // as aside would, without making its closure
	}
	return c.aside(ctx, func(ctx context.Context) (any, error) { return s.do(ctx, c.drv, args, once) }, late)
}

// pipelined runs a prepared command line of script s on the driver's
// batching pipeliner (see driver.Conn.Submit), loading s on NOSCRIPT.
// Every call goes in sent once: the engine resends what go-redis would
// have (runLine: an acquire, with the same token; holding.release: a
// release). stop, if not nil, is c.bg's: the caller returns ErrClosed when
// the Client closes before the reply (late gets the reply then).
func (c *Client) pipelined(ctx context.Context, s *script, args []any, late func(any, error), stop <-chan struct{}) (any, error) {
	v, err := c.drv.Submit(ctx, args, late, c.spawn, stop)
	if err != nil && isNoScript(err) {
		// Load it (on every shard of a cluster) and send it again. The
		// load goes on a pooled connection: aside, so that a server that
		// stops answering does not hold the caller past ctx.
		if _, lerr := c.aside(ctx, func(ctx context.Context) (any, error) { return nil, c.drv.LoadScript(ctx, s.src) }, nil); lerr != nil {
			return nil, lerr
		}
		v, err = c.drv.Submit(ctx, args, late, c.spawn, stop)
	}
	if errors.Is(err, driver.ErrStopped) {
		return nil, ErrClosed
	}
	return v, err
}

// aside runs f. go-redis bounds its socket I/O by ctx only when the client
// has ContextTimeoutEnabled (driver.Traits.ContextAware); without it a paused server holds the caller
// for the client's own read timeout. Then f runs on a goroutine and the
// caller returns when ctx ends (f itself still ends at the client's
// timeout, and late gets its reply).
func (c *Client) aside(ctx context.Context, f func(context.Context) (any, error), late func(any, error)) (any, error) {
	if c.tr.ContextAware || ctx.Done() == nil {
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

// releaseCall sends h's release. One that is likely to hand the lock over
// (h was obtained after waiting) goes with a cheap read of the lock key in
// front of it in the same write: Redis then has output pending for us when
// the script publishes the hand-over, and writes pending output
// newest-first, so the next holder's message leaves before our reply and
// the next holder's process is woken first (bench/ -scenario hotkey). It is
// sent once (see script.do): the caller resends it.
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
		r := c.drv.Pipe(ctx, [][]any{{"exists", h.lk.hash}, args}, true)
		v, err := r[1].Val, r[1].Err
		if err != nil && isNoScript(err) {
			return h.cmd.relScript.do(ctx, c.drv, args, true)
		}
		return v, err
	}, nil)
}
