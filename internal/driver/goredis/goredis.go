// Package goredis is dlock's driver over go-redis v9 (see internal/driver).
// Command lines go to go-redis as they are ([]any, with *string arguments
// that go-redis writes without copying): the engine's prepared lines cost
// no allocation here beyond go-redis's own Cmd.
package goredis

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dlock-go/dlock/internal/driver"
	"github.com/redis/go-redis/v9"
)

// Conn is a driver.Conn over a go-redis single-node, failover (Sentinel),
// cluster client or Ring.
type Conn struct {
	rdb    redis.UniversalClient
	cc     *redis.ClusterClient // rdb, if it is one
	ap     *redis.AutoPipeliner // rdb's shared deferred autopipeliner, if used
	one    *node                // the one server, unless cc
	traits driver.Traits
}

var _ driver.Conn = (*Conn)(nil)

// New returns a Conn over rdb. autoPipeline: Submit goes through rdb's
// shared deferred autopipeliner (if rdb has one).
func New(rdb redis.UniversalClient, autoPipeline bool) *Conn {
	c := &Conn{rdb: rdb}
	c.cc, _ = rdb.(*redis.ClusterClient)
	if c.cc == nil {
		c.one = &node{uc: rdb}
	}
	t := &c.traits
	switch r := rdb.(type) {
	case *redis.Client:
		t.ContextAware, t.ReadTimeout = r.Options().ContextTimeoutEnabled, r.Options().ReadTimeout
	case *redis.ClusterClient:
		t.ContextAware, t.ReadTimeout = r.Options().ContextTimeoutEnabled, r.Options().ReadTimeout
		t.Cluster, t.Slots = r.Options().ClusterSlots == nil, true
	case *redis.Ring:
		t.ContextAware = r.Options().ContextTimeoutEnabled
	}
	switch rdb.(type) {
	case *redis.Client, *redis.ClusterClient:
	default:
		t.AckErr = fmt.Errorf("a %T is not supported: use a Client, a failover client or a ClusterClient", rdb)
	}
	t.Resends = true
	if autoPipeline {
		if ap, err := rdb.AsyncAutoPipeline(); err == nil {
			c.ap = ap
			t.Pipelined = true
		}
	}
	return c
}

// IsCluster reports whether rdb is a client of a Redis Cluster: a
// ClusterClient that reads its slot map from the servers. One given a
// ClusterSlots func instead may front servers that are no Cluster
// (redis.NewFailoverClusterClient makes one of a Sentinel-managed primary).
func IsCluster(rdb redis.UniversalClient) bool {
	cc, ok := rdb.(*redis.ClusterClient)
	return ok && cc.Options().ClusterSlots == nil
}

// Traits implements driver.Conn.
func (c *Conn) Traits() driver.Traits { return c.traits }

// Do implements driver.Conn.
func (c *Conn) Do(ctx context.Context, line []any, once bool) (any, error) {
	cmd := redis.NewCmd(ctx, line...)
	_ = c.rdb.Process(ctx, cmder(cmd, once))
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

// Pipe implements driver.Conn: a ClusterClient's pipeline routes each line
// by its key.
func (c *Conn) Pipe(ctx context.Context, lines [][]any, once bool) []driver.Reply {
	return pipe(ctx, c.rdb.Pipeline(), lines, once)
}

func pipe(ctx context.Context, p redis.Pipeliner, lines [][]any, once bool) []driver.Reply {
	out := make([]driver.Reply, len(lines))
	cmds := make([]*redis.Cmd, len(lines))
	for i, l := range lines {
		cmds[i] = redis.NewCmd(ctx, l...)
		_ = p.Process(ctx, cmder(cmds[i], once))
	}
	_, _ = p.Exec(ctx)
	for i := range cmds {
		out[i].Val, out[i].Err = cmds[i].Result()
	}
	return out
}

// Node implements driver.Conn.
func (c *Conn) Node(ctx context.Context, key string) (driver.Node, error) {
	if c.cc == nil {
		return c.one, nil
	}
	m, err := c.cc.MasterForKey(ctx, key)
	if err != nil {
		return nil, err
	}
	return &node{uc: m, addr: m.Options().Addr}, nil
}

// LoadScript implements driver.Conn: a ClusterClient loads it on every
// master.
func (c *Conn) LoadScript(ctx context.Context, src string) error {
	return c.rdb.ScriptLoad(ctx, src).Err()
}

// Submit implements driver.Conn, without a goroutine per call.
//
// Every line goes in sent once (see onceCmd), releases and acquires alike:
// go-redis's autopipeliner splits a batch where the retry policy changes and
// keeps commands that must not be resent out of its fastest path, which
// costs every call of a batch that mixes them (a quarter of the throughput
// with only releases marked). The engine resends what go-redis would have.
//
// stop is ignored: the future waits on a ctx only, and one that also ended
// at stop would cost every call a context and its registration with the
// Client's; a batch ends at the client's read timeout, which is what a
// pooled call to a stopped server waits for too.
func (c *Conn) Submit(ctx context.Context, line []any, late func(any, error), goBg func(func()) bool, _ <-chan struct{}) (any, error) {
	cmd := redis.NewCmd(ctx, line...)
	f := c.ap.Submit(ctx, onceCmd{cmd})
	if err := f.WaitContext(ctx); err != nil && ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		if late != nil {
			after := func() {
				_ = f.Wait()
				late(cmd.Result())
			}
			if !goBg(after) {
				after() // the Client is closing: the reply is acted on before the caller returns
			}
		}
		return nil, err
	}
	return cmd.Result()
}

// ReloadSlots implements driver.Conn. go-redis reloads the map by itself
// only after a MOVED, ASK or READONLY reply, and once a minute; a reload is
// cheap, runs in the background and is coalesced by go-redis (one at a
// time, 200 ms apart).
func (c *Conn) ReloadSlots() {
	if c.cc != nil {
		c.cc.ReloadState(context.Background())
	}
}

// node is one primary: the client itself off Cluster, a node's client on one.
type node struct {
	uc   redis.UniversalClient
	addr string
}

func (n *node) Addr() string { return n.addr }

func (n *node) Pipe(ctx context.Context, lines [][]any, once bool) []driver.Reply {
	return pipe(ctx, n.uc.Pipeline(), lines, once)
}

func (n *node) PubSub(ctx context.Context) driver.PubSub {
	return pubsub{n.uc.SSubscribe(ctx)} // without channels: a PubSub of either kind
}

// pubsub is a driver.PubSub over a go-redis PubSub.
type pubsub struct{ ps *redis.PubSub }

func (p pubsub) Subscribe(ctx context.Context, sharded bool, channel string) error {
	if sharded {
		return p.ps.SSubscribe(ctx, channel)
	}
	return p.ps.Subscribe(ctx, channel)
}

func (p pubsub) Unsubscribe(ctx context.Context, sharded bool, channel string) error {
	if sharded {
		return p.ps.SUnsubscribe(ctx, channel)
	}
	return p.ps.Unsubscribe(ctx, channel)
}

func (p pubsub) Ping(ctx context.Context) error { return p.ps.Ping(ctx) }

func (p pubsub) Close() error { return p.ps.Close() }

func (p pubsub) Receive(ctx context.Context, timeout time.Duration) (driver.Event, error) {
	msg, err := p.ps.ReceiveTimeout(ctx, timeout)
	switch m := msg.(type) {
	case *redis.Message:
		return driver.Event{Type: driver.Message, Channel: m.Channel, Payload: m.Payload}, nil
	case *redis.Subscription:
		return driver.Event{Type: driver.Subscription, Kind: m.Kind, Channel: m.Channel}, nil
	case *redis.Pong:
		return driver.Event{Type: driver.Pong}, nil
	}
	if err == nil {
		err = fmt.Errorf("unexpected %T from the server", msg)
	}
	return driver.Event{}, err
}
