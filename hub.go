package dlock

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock/internal/wire"
	"github.com/redis/go-redis/v9"
)

// hubHandler receives what the hub hears.
type hubHandler interface {
	Message(channel, payload string) // a message on a wanted channel
	Gap(channel string)              // messages on channel may have been missed: waiters must look again
}

// hub is the Client's sharded pub/sub subscription: one PubSub per shard
// (one in all unless on a Cluster), made with its first channel so that it
// connects to the node serving it.
//
// Redis answers (un)subscribe commands on one connection in order, so each
// channel has at most one command in flight and moves through
// pending → active → leaving → gone; a want during leaving subscribes again
// once the unsubscribe is confirmed. That way a confirmation is never
// mistaken for one that a later command cancelled.
type hub struct {
	rdb     redis.UniversalClient
	handler hubHandler
	logger  *slog.Logger
	goBg    func(func()) bool
	bg      context.Context

	mu        sync.Mutex
	pss       []*redis.PubSub
	closed    bool
	lastReset time.Time
	subs      map[string]*sub
	ops       []subOp
	kick      chan struct{}
	started   bool
}

type subPhase uint8

const (
	subPending subPhase = iota
	subActive
	subLeaving
)

type sub struct {
	phase subPhase
	want  bool
	ready chan struct{}
}

type subOp struct {
	subscribe bool
	channel   string
	reset     bool // close every PubSub and subscribe again (see Suspect)
}

func newHub(bg context.Context, rdb redis.UniversalClient, handler hubHandler, logger *slog.Logger, goBg func(func()) bool) *hub {
	return &hub{rdb: rdb, handler: handler, logger: logger, goBg: goBg, bg: bg,
		subs: make(map[string]*sub), kick: make(chan struct{}, 1)}
}

// Want subscribes to channel and returns a channel closed once the
// subscription is active.
func (h *hub) Want(channel string) <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.subs[channel]
	if s == nil {
		s = &sub{phase: subPending, ready: make(chan struct{})}
		h.subs[channel] = s
		h.send(subOp{subscribe: true, channel: channel})
	}
	s.want = true
	return s.ready
}

// Unwant unsubscribes from channel.
func (h *hub) Unwant(channel string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.subs[channel]
	if s == nil {
		return
	}
	s.want = false
	if s.phase == subActive {
		s.phase = subLeaving
		s.ready = make(chan struct{})
		h.send(subOp{subscribe: false, channel: channel})
	}
}

// Suspect: a message that should have come on channel never came; every
// subscription is made again (at most once a second).
func (h *hub) Suspect(string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if time.Since(h.lastReset) < time.Second || h.closed {
		return
	}
	h.lastReset = time.Now()
	h.logger.Debug("dlock: a hand-over message was missed; subscribing again")
	h.send(subOp{reset: true})
}

// Close closes the subscriptions; no new one is started afterwards.
func (h *hub) Close() {
	h.mu.Lock()
	pss := h.pss
	h.pss = nil
	h.started, h.closed = true, true
	h.mu.Unlock()
	for _, ps := range pss {
		_ = ps.Close()
	}
}

// send queues op for the subscriber goroutine. Called with h.mu held.
func (h *hub) send(op subOp) {
	h.ops = append(h.ops, op)
	if !h.started {
		h.started = true
		h.goBg(h.subscriber)
	}
	poke(h.kick)
}

// shardOf names the server that serves channel: on a Cluster, the master of
// its slot (a sharded subscription lives on that node); otherwise "".
func (h *hub) shardOf(channel string) string {
	cc, ok := h.rdb.(*redis.ClusterClient)
	if !ok {
		return ""
	}
	node, err := cc.MasterForKey(h.bg, channel)
	if err != nil {
		return "" // the cluster is unreachable: any shard fails alike
	}
	return node.Options().Addr
}

// subscriber issues (un)subscribe commands in the order they were decided.
func (h *hub) subscriber() {
	shards := map[string]*redis.PubSub{} // by shardOf
	where := map[string]*redis.PubSub{}  // subscribed channel -> its PubSub
	for {
		select {
		case <-h.bg.Done():
			return
		case <-h.kick:
		}
		h.mu.Lock()
		ops := h.ops
		h.ops = nil
		h.mu.Unlock()
		for _, op := range ops {
			if op.reset {
				if !h.resubscribe(shards, where) {
					return
				}
				continue
			}
			var err error
			switch ps := where[op.channel]; {
			case !op.subscribe && ps != nil:
				delete(where, op.channel)
				err = ps.SUnsubscribe(h.bg, op.channel)
			case !op.subscribe:
				continue
			default:
				shard := h.shardOf(op.channel)
				if ps = shards[shard]; ps != nil {
					err = ps.SSubscribe(h.bg, op.channel)
				} else if ps = h.newShard(op.channel); ps == nil {
					return // closed
				} else {
					shards[shard] = ps
				}
				where[op.channel] = ps
			}
			if err != nil && h.bg.Err() == nil {
				h.logger.Debug("dlock: wake-up (un)subscribe failed", "channel", op.channel, "err", err)
			}
		}
	}
}

// resubscribe closes every shard's PubSub and subscribes every channel
// again on new ones. It reports false if the hub has closed.
func (h *hub) resubscribe(shards, where map[string]*redis.PubSub) bool {
	h.mu.Lock()
	h.pss = nil
	h.mu.Unlock()
	for _, ps := range shards {
		_ = ps.Close()
	}
	clear(shards)
	chans := make([]string, 0, len(where))
	for ch := range where {
		chans = append(chans, ch)
	}
	clear(where)
	for _, ch := range chans {
		shard := h.shardOf(ch)
		ps := shards[shard]
		if ps != nil {
			if err := ps.SSubscribe(h.bg, ch); err != nil && h.bg.Err() == nil {
				h.logger.Debug("dlock: wake-up subscribe failed", "channel", ch, "err", err)
			}
		} else if ps = h.newShard(ch); ps == nil {
			return false
		} else {
			shards[shard] = ps
		}
		where[ch] = ps
	}
	h.gap()
	return true
}

// newShard starts a PubSub subscribed to channel, and its receiver; nil if
// the hub has closed.
func (h *hub) newShard(channel string) *redis.PubSub {
	ps := h.rdb.SSubscribe(h.bg, channel)
	h.mu.Lock()
	closed := h.closed
	if !closed {
		h.pss = append(h.pss, ps)
	}
	h.mu.Unlock()
	if closed || !h.goBg(func() { h.receiver(ps) }) {
		_ = ps.Close()
		return nil
	}
	return ps
}

// receiver dispatches messages and subscription confirmations.
func (h *hub) receiver(ps *redis.PubSub) {
	backoff := 10 * time.Millisecond
	for {
		msg, err := ps.Receive(h.bg)
		if err != nil {
			if h.bg.Err() != nil || errors.Is(err, redis.ErrClosed) {
				return
			}
			h.logger.Debug("dlock: wake-up subscription interrupted", "err", err)
			h.gap()
			select {
			case <-h.bg.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 10 * time.Millisecond
		switch m := msg.(type) {
		case *redis.Message:
			h.handler.Message(m.Channel, m.Payload)
		case *redis.Subscription:
			h.confirm(m.Kind, m.Channel)
		}
	}
}

func (h *hub) confirm(kind, channel string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s := h.subs[channel]
	if s == nil {
		return
	}
	switch {
	case kind == "ssubscribe" && s.phase == subPending:
		s.phase = subActive
		close(s.ready)
		if !s.want {
			s.phase = subLeaving
			s.ready = make(chan struct{})
			h.send(subOp{subscribe: false, channel: channel})
		}
	case kind == "sunsubscribe" && s.phase == subLeaving:
		if s.want {
			s.phase = subPending
			h.send(subOp{subscribe: true, channel: channel})
		} else {
			delete(h.subs, channel)
		}
	}
}

// gap runs after the subscription connection broke: the PubSub
// resubscribes the channels it tracks on reconnect, but unsubscribes in
// flight will never be confirmed, and messages published meanwhile were
// missed, so every wanted channel has a gap.
func (h *hub) gap() {
	h.mu.Lock()
	var wanted []string
	for ch, s := range h.subs {
		if s.want {
			wanted = append(wanted, ch)
		}
		if s.phase != subLeaving {
			continue
		}
		if s.want {
			s.phase = subPending
			h.send(subOp{subscribe: true, channel: ch})
		} else {
			delete(h.subs, ch)
		}
	}
	h.mu.Unlock()
	for _, ch := range wanted {
		h.handler.Gap(ch)
	}
}

// clientHandler routes what the hub hears to the Client's waiters.
type clientHandler struct{ c *Client }

func (ch clientHandler) Message(channel, payload string) {
	if f, token, ok := wire.ParseHandOver(payload); ok {
		ch.c.handOver(token, f)
		return
	}
	f, ok := wire.ParseWake(payload)
	ch.c.released(channel, f, ok)
}

func (ch clientHandler) Gap(channel string) {
	key, _ := strings.CutSuffix(channel, wire.InfixHandOver+ch.c.id)
	ch.c.released(key, 0, false)
}
