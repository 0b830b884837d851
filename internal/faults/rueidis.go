package faults

import (
	"context"
	"crypto/tls"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// NewRueidis returns a rueidis client made from o that the Injector
// injects faults into, as it does into a go-redis client it hooks: the
// script calls of Do and DoMulti (Single and Batch), on the client, on the
// clients of its Nodes and on its dedicated connections, get the rules'
// faults with the same meaning, and every connection it dials (through
// o.DialCtxFn, or as rueidis would without one) is wrapped as DialHook
// wraps go-redis's, for Cut, DelayWrite and the subscription faults.
//
// rueidis writes the commands of its concurrent callers together on one
// connection: a Cut there fails every command in flight on it, and a
// DelayWrite holds them all back, as a broken or slow network would.
func (in *Injector) NewRueidis(o rueidis.ClientOption) (rueidis.Client, error) {
	dial := o.DialCtxFn
	if dial == nil {
		dial = dialRueidis
	}
	o.DialCtxFn = func(ctx context.Context, addr string, d *net.Dialer, cfg *tls.Config) (net.Conn, error) {
		return in.wrapConn(dial(ctx, addr, d, cfg))
	}
	c, err := rueidis.NewClient(o)
	if c == nil {
		return nil, err
	}
	// rueidis returns a client with its error where it made one anyway (a
	// single server not reached yet, under ForceSingleClient).
	return wrapRueidis(c, in), err
}

// dialRueidis dials as rueidis does when ClientOption.DialCtxFn is nil.
func dialRueidis(ctx context.Context, addr string, d *net.Dialer, cfg *tls.Config) (net.Conn, error) {
	if cfg != nil {
		return (&tls.Dialer{NetDialer: d, Config: cfg}).DialContext(ctx, "tcp", addr)
	}
	return d.DialContext(ctx, "tcp", addr)
}

// rueidisLine is a rueidis command's line.
type rueidisLine []string

func (l rueidisLine) Len() int         { return len(l) }
func (l rueidisLine) Arg(i int) string { return l[i] }

// do is Do with the faults; c is the client or a dedicated connection.
func (in *Injector) do(ctx context.Context, c rueidis.CommandClient, cmd rueidis.Completed) rueidis.RedisResult {
	l := rueidisLine(cmd.Commands()) // read before Do, which recycles cmd
	call, ok := in.scripts.classify(l, Single)
	if !ok {
		return c.Do(ctx, cmd)
	}
	var r rueidis.RedisResult
	_ = in.inject([]Call{call}, 1, l,
		func() error { r = c.Do(ctx, cmd); return r.Error() },
		func(err error) { r = rueidis.NewErrorResult(err) },
		func() { _ = c.Do(context.Background(), rebuild(c.B(), l)) })
	return r
}

// doMulti is DoMulti with the faults: one for the whole batch.
func (in *Injector) doMulti(ctx context.Context, c rueidis.CommandClient, cmds []rueidis.Completed) []rueidis.RedisResult {
	var calls []Call
	var first rueidisLine
	lines := make([]rueidisLine, len(cmds)) // read before DoMulti, which recycles cmds
	for i, cmd := range cmds {
		l := rueidisLine(cmd.Commands())
		lines[i] = l
		if call, ok := in.scripts.classify(l, Batch); ok {
			calls = append(calls, call)
			if first == nil {
				first = l
			}
		}
	}
	if len(calls) == 0 {
		return c.DoMulti(ctx, cmds...)
	}
	var rs []rueidis.RedisResult
	_ = in.inject(calls, len(cmds), first,
		func() error { rs = c.DoMulti(ctx, cmds...); return nil },
		func(err error) {
			rs = make([]rueidis.RedisResult, len(cmds))
			for i := range rs {
				rs[i] = rueidis.NewErrorResult(err)
			}
		},
		func() {
			again := make([]rueidis.Completed, len(lines))
			for i, l := range lines {
				again[i] = rebuild(c.B(), l)
			}
			_ = c.DoMulti(context.Background(), again...)
		})
	return rs
}

// rebuild makes a command of line l again (a script call with its keys,
// so that a Cluster client sends it to their slot).
func rebuild(b rueidis.Builder, l rueidisLine) rueidis.Completed {
	if len(l) >= 3 && (strings.EqualFold(l[0], "EVALSHA") || strings.EqualFold(l[0], "EVAL")) {
		if n, err := strconv.Atoi(l[2]); err == nil && n >= 0 && 3+n <= len(l) {
			return b.Arbitrary(l[:3]...).Keys(l[3 : 3+n]...).Args(l[3+n:]...).Build()
		}
	}
	return b.Arbitrary(l...).Build()
}

// rueidisCore is what both wrappers share: the script calls' way, and
// Receive and Close untouched.
type rueidisCore[C rueidis.CoreClient] struct {
	c  C
	in *Injector
}

func (r rueidisCore[C]) B() rueidis.Builder { return r.c.B() }

func (r rueidisCore[C]) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	return r.in.do(ctx, r.c, cmd)
}

func (r rueidisCore[C]) DoMulti(ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
	return r.in.doMulti(ctx, r.c, multi)
}

func (r rueidisCore[C]) Receive(ctx context.Context, subscribe rueidis.Completed, fn func(rueidis.PubSubMessage)) error {
	return r.c.Receive(ctx, subscribe, fn)
}

func (r rueidisCore[C]) Close() { r.c.Close() }

// rueidisClient is a rueidis.Client with the Injector's faults; what is
// not a script call's way (caching, streams, Receive) passes untouched.
type rueidisClient struct{ rueidisCore[rueidis.Client] }

var _ rueidis.Client = rueidisClient{}

func wrapRueidis(c rueidis.Client, in *Injector) rueidis.Client {
	return rueidisClient{rueidisCore[rueidis.Client]{c: c, in: in}}
}

func (r rueidisClient) DoCache(ctx context.Context, cmd rueidis.Cacheable, ttl time.Duration) rueidis.RedisResult {
	return r.c.DoCache(ctx, cmd, ttl)
}

func (r rueidisClient) DoMultiCache(ctx context.Context, multi ...rueidis.CacheableTTL) []rueidis.RedisResult {
	return r.c.DoMultiCache(ctx, multi...)
}

func (r rueidisClient) DoStream(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResultStream {
	return r.c.DoStream(ctx, cmd)
}

func (r rueidisClient) DoMultiStream(ctx context.Context, multi ...rueidis.Completed) rueidis.MultiRedisResultStream {
	return r.c.DoMultiStream(ctx, multi...)
}

func (r rueidisClient) Dedicated(fn func(rueidis.DedicatedClient) error) error {
	return r.c.Dedicated(func(dc rueidis.DedicatedClient) error { return fn(r.dedicated(dc)) })
}

func (r rueidisClient) Dedicate() (rueidis.DedicatedClient, func()) {
	dc, cancel := r.c.Dedicate()
	return r.dedicated(dc), cancel
}

func (r rueidisClient) dedicated(dc rueidis.DedicatedClient) rueidis.DedicatedClient {
	return rueidisDedicated{rueidisCore[rueidis.DedicatedClient]{c: dc, in: r.in}}
}

// Nodes returns the clients of the nodes, each with the faults (a Cluster
// node's connections were dialed through the wrapped dialer too).
func (r rueidisClient) Nodes() map[string]rueidis.Client {
	nodes := r.c.Nodes()
	out := make(map[string]rueidis.Client, len(nodes))
	for addr, c := range nodes {
		out[addr] = wrapRueidis(c, r.in)
	}
	return out
}

func (r rueidisClient) Mode() rueidis.ClientMode { return r.c.Mode() }

// rueidisDedicated is a dedicated connection with the Injector's faults.
type rueidisDedicated struct {
	rueidisCore[rueidis.DedicatedClient]
}

var _ rueidis.DedicatedClient = rueidisDedicated{}

func (r rueidisDedicated) SetPubSubHooks(hooks rueidis.PubSubHooks) <-chan error {
	return r.c.SetPubSubHooks(hooks)
}

func (r rueidisDedicated) SetOnInvalidations(fn func([]rueidis.RedisMessage)) <-chan error {
	return r.c.SetOnInvalidations(fn)
}
