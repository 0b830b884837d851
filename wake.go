package dlock

import (
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// A queue holds this Client's waiters for one lock, in arrival order. Only
// the head contends at Redis; the others wait for their turn, so a hot lock
// does not stampede and a process's own waiters are served in order.
type queue struct {
	key     string
	waiters []*waiter
	notify  chan struct{} // a release was seen (published, or local); buffered 1 so none is missed between attempts
	ready   chan struct{} // closed once the wake-up subscription is confirmed

	// Guarded by Client.mu.
	released uint64 // the highest fence seen released
	forced   bool   // releases may have been missed: the head must look
	users    int    // a hand-over channel's Fair waiters and lock queues (they wait in line at Redis)
	seq      uint64 // waiters ever queued: the last one's seq
	hand     *queue // a lock queue's hand-over channel, subscribed while the queue lives
}

type waiter struct {
	turn chan struct{}
	seq  uint64 // order of arrival in its queue, from 1

	// Guarded by Client.mu (see pass.go).
	ready  bool   // asleep in line: the lock may be passed to it
	token  string // its holding's, while ready
	ttlArg string // its lease's TTL in ms, while ready
	pass   *pass  // the lock was passed to it: a 0 is on its grant channel
}

func (c *Client) queued(key string) bool {
	c.mu.Lock()
	_, ok := c.queues[key]
	c.mu.Unlock()
	return ok
}

// enqueue adds a waiter to key's queue. The queue keeps this Client's
// hand-over channel for the lock subscribed while it lives, so that heads
// following each other need not subscribe again.
func (c *Client) enqueue(key, handover string) (*queue, *waiter) {
	w := &waiter{turn: make(chan struct{})}
	c.mu.Lock()
	defer c.mu.Unlock()
	q := c.queueFor(key)
	if q.hand == nil {
		q.hand = c.queueFor(handover)
		q.hand.users++
	}
	q.seq++
	w.seq = q.seq
	q.waiters = append(q.waiters, w)
	if len(q.waiters) == 1 {
		close(w.turn)
	}
	return q, w
}

func (c *Client) dequeue(q *queue, w *waiter) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, x := range q.waiters {
		if x != w {
			continue
		}
		copy(q.waiters[i:], q.waiters[i+1:])
		q.waiters[len(q.waiters)-1] = nil
		q.waiters = q.waiters[:len(q.waiters)-1]
		if i == 0 && len(q.waiters) > 0 {
			close(q.waiters[0].turn)
		}
		break
	}
	c.dropIfIdle(q)
}

// readyFor marks the head waiter w as asleep in line with the holding of
// token (whose lease is ttlArg ms): an Unlock of this Client may then pass
// the lock to it.
func (c *Client) readyFor(w *waiter, token, ttlArg string) {
	c.mu.Lock()
	w.ready, w.token, w.ttlArg = true, token, ttlArg
	c.mu.Unlock()
}

// claimed returns the pass made to w, if any; after it, none will be made
// until readyFor is called again.
func (c *Client) claimed(w *waiter) *pass {
	c.mu.Lock()
	defer c.mu.Unlock()
	w.ready = false
	return w.pass
}

// turnFrom returns the last waiter of the turn that a holding of q's lock
// taken through Redis begins: the lock may be passed to the waiters queued
// by now, and then goes back to the line at Redis.
func (c *Client) turnFrom(q *queue) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return q.seq
}

// queueFor returns key's queue, making it (and subscribing) if needed.
// Called with c.mu held.
func (c *Client) queueFor(key string) *queue {
	q := c.queues[key]
	if q == nil {
		q = &queue{key: key, notify: make(chan struct{}, 1)}
		q.ready = c.hub.want(c, key)
		c.queues[key] = q
	}
	return q
}

// dropIfIdle forgets q (and unsubscribes) once nobody waits on it. Called
// with c.mu held.
func (c *Client) dropIfIdle(q *queue) {
	if len(q.waiters) == 0 && q.users == 0 {
		delete(c.queues, q.key)
		c.hub.unwant(c, q.key)
		if h := q.hand; h != nil {
			q.hand = nil
			h.users--
			c.dropIfIdle(h)
		}
	}
}

// wakeLocal tells this Client's head waiter that a holding of ours was
// released, without waiting for the published message.
func (c *Client) wakeLocal(h *holding) {
	c.mu.Lock()
	if q := c.queues[h.key]; q != nil {
		q.wake(h.fence)
	}
	c.mu.Unlock()
}

// wake records that the holding with fence f was released. Called with Client.mu held.
func (q *queue) wake(f uint64) {
	q.released = max(q.released, f)
	poke(q.notify)
}

// released reports whether the head should look at the lock again: the
// holder it saw (fence seen) or a later one was released, or messages may
// have been missed.
func (c *Client) released(q *queue, seen uint64) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	fresh := q.forced || q.released >= seen
	q.forced = false
	return fresh
}

func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// wakeHub is the Client's one sharded pub/sub subscription. Each lock key
// with local waiters is subscribed (its channel is the key itself, so it
// lives on the key's shard). All fields are guarded by Client.mu.
//
// Redis answers (un)subscribe commands on one connection in order, so each
// channel has at most one command in flight and moves through
// pending → active → unsubscribing → gone; a want during unsubscribing
// subscribes again once the unsubscribe is confirmed. That way a confirmation
// is never mistaken for one that a later command cancelled.
type wakeHub struct {
	pss       []*redis.PubSub // one per shard, closed by closeHub
	closed    bool
	lastReset time.Time // of the last missedWake
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
	reset     bool // close every PubSub and subscribe again (see missedWake)
}

func (h *wakeHub) init() {
	h.subs = make(map[string]*sub)
	h.kick = make(chan struct{}, 1)
}

// want subscribes to key's channel (if not already) and returns a channel
// closed once the subscription is active.
func (h *wakeHub) want(c *Client, key string) chan struct{} {
	s := h.subs[key]
	if s == nil {
		s = &sub{phase: subPending, ready: make(chan struct{})}
		h.subs[key] = s
		h.send(c, subOp{subscribe: true, channel: key})
	}
	s.want = true
	return s.ready
}

func (h *wakeHub) unwant(c *Client, key string) {
	s := h.subs[key]
	if s == nil {
		return
	}
	s.want = false
	if s.phase == subActive {
		s.phase = subLeaving
		s.ready = make(chan struct{})
		h.send(c, subOp{subscribe: false, channel: key})
	}
}

func (h *wakeHub) send(c *Client, op subOp) {
	h.ops = append(h.ops, op)
	if !h.started {
		h.started = true
		c.goBg(c.subscriber)
	}
	poke(h.kick)
}

// closeHub closes the subscriptions; no new one is started afterwards.
func (c *Client) closeHub() {
	c.mu.Lock()
	pss := c.hub.pss
	c.hub.pss = nil
	c.hub.started, c.hub.closed = true, true
	c.mu.Unlock()
	for _, ps := range pss {
		_ = ps.Close()
	}
}

// shardOf names the server that serves channel: on a Cluster, the master of
// its slot (a sharded subscription lives on that node); otherwise "".
func (c *Client) shardOf(channel string) string {
	cc, ok := c.rdb.(*redis.ClusterClient)
	if !ok {
		return ""
	}
	node, err := cc.MasterForKey(c.bg, channel)
	if err != nil {
		return "" // the cluster is unreachable: any shard fails alike
	}
	return node.Options().Addr
}

// subscriber issues (un)subscribe commands in the order they were decided,
// on one PubSub connection per shard (one in all unless on a Cluster), each
// made with its first channel so that it connects to the node serving it.
func (c *Client) subscriber() {
	shards := map[string]*redis.PubSub{} // by shardOf
	where := map[string]*redis.PubSub{}  // subscribed channel -> its PubSub
	for {
		select {
		case <-c.bg.Done():
			return
		case <-c.hub.kick:
		}
		c.mu.Lock()
		ops := c.hub.ops
		c.hub.ops = nil
		c.mu.Unlock()
		for _, op := range ops {
			if op.reset {
				if !c.resubscribe(shards, where) {
					return
				}
				continue
			}
			var err error
			switch ps := where[op.channel]; {
			case !op.subscribe && ps != nil:
				delete(where, op.channel)
				err = ps.SUnsubscribe(c.bg, op.channel)
			case !op.subscribe:
				continue
			default:
				shard := c.shardOf(op.channel)
				if ps = shards[shard]; ps != nil {
					err = ps.SSubscribe(c.bg, op.channel)
				} else if ps = c.newShard(op.channel); ps == nil {
					return // closed
				} else {
					shards[shard] = ps
				}
				where[op.channel] = ps
			}
			if err != nil && c.bg.Err() == nil {
				// The PubSub reconnects and resubscribes what it tracks; the
				// receiver resets our state when it sees the broken connection.
				c.cfg.logger.Debug("dlock: wake-up (un)subscribe failed", "channel", op.channel, "err", err)
			}
		}
	}
}

// resubscribe closes every shard's PubSub and subscribes every channel
// again on new ones (their connections are made afresh, to the server that
// now serves each channel). It reports false if the Client has closed.
func (c *Client) resubscribe(shards, where map[string]*redis.PubSub) bool {
	c.mu.Lock()
	c.hub.pss = nil
	c.mu.Unlock()
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
		shard := c.shardOf(ch)
		ps := shards[shard]
		if ps != nil {
			if err := ps.SSubscribe(c.bg, ch); err != nil && c.bg.Err() == nil {
				c.cfg.logger.Debug("dlock: wake-up subscribe failed", "channel", ch, "err", err)
			}
		} else if ps = c.newShard(ch); ps == nil {
			return false
		} else {
			shards[shard] = ps
		}
		where[ch] = ps
	}
	// Unsubscribes sent on the closed connections will never be confirmed,
	// and messages were missed: the state machine and the waiters catch up.
	c.resetSubs()
	return true
}

// newShard starts a PubSub subscribed to channel, and its receiver; nil if
// the Client has closed.
func (c *Client) newShard(channel string) *redis.PubSub {
	ps := c.rdb.SSubscribe(c.bg, channel)
	c.mu.Lock()
	closed := c.hub.closed
	if !closed {
		c.hub.pss = append(c.hub.pss, ps)
	}
	c.mu.Unlock()
	if closed || !c.goBg(func() { c.receiver(ps) }) {
		_ = ps.Close()
		return nil
	}
	return ps
}

// receiver dispatches wake-ups and subscription confirmations.
func (c *Client) receiver(ps *redis.PubSub) {
	backoff := 10 * time.Millisecond
	for {
		msg, err := ps.Receive(c.bg)
		if err != nil {
			if c.bg.Err() != nil || errors.Is(err, redis.ErrClosed) {
				return
			}
			c.cfg.logger.Debug("dlock: wake-up subscription interrupted", "err", err)
			c.resetSubs()
			select {
			case <-c.bg.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 10 * time.Millisecond
		switch m := msg.(type) {
		case *redis.Message:
			if strings.HasPrefix(m.Payload, "g ") {
				c.handedOver(m.Payload)
				continue
			}
			f, err := strconv.ParseUint(m.Payload, 10, 64)
			c.mu.Lock()
			if q := c.queues[m.Channel]; q != nil {
				if err != nil {
					q.forced = true // not a dlock fence: look anyway
				}
				q.wake(f)
			}
			c.mu.Unlock()
		case *redis.Subscription:
			c.confirm(m.Kind, m.Channel)
		}
	}
}

// handedOver delivers a hand-over ("g FENCE TOKEN") to its waiter.
func (c *Client) handedOver(payload string) {
	fs, token, ok := strings.Cut(payload[2:], " ")
	f, err := strconv.ParseUint(fs, 10, 64)
	if !ok || err != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.late, token) // it came (see checkGrant)
	if ch := c.grants[token]; ch != nil {
		select {
		case ch <- f:
		default:
		}
	}
}

// missedWake makes every subscription again (at most once a second): a
// hand-over message never came, so they may be on the wrong server.
func (c *Client) missedWake() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if time.Since(c.hub.lastReset) < time.Second || c.hub.closed {
		return
	}
	c.hub.lastReset = time.Now()
	c.cfg.logger.Debug("dlock: a hand-over message was missed; subscribing again")
	c.hub.send(c, subOp{reset: true})
}

func (c *Client) confirm(kind, channel string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := &c.hub
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
			h.send(c, subOp{subscribe: false, channel: channel})
		}
	case kind == "sunsubscribe" && s.phase == subLeaving:
		if s.want {
			s.phase = subPending
			h.send(c, subOp{subscribe: true, channel: channel})
		} else {
			delete(h.subs, channel)
		}
	}
}

// resetSubs runs after the subscription connection broke: the PubSub
// resubscribes the channels it tracks on reconnect, but unsubscribes in
// flight will never be confirmed, and releases published meanwhile were
// missed, so every head waiter looks at its lock again.
func (c *Client) resetSubs() {
	c.mu.Lock()
	defer c.mu.Unlock()
	h := &c.hub
	for ch, s := range h.subs {
		if s.phase != subLeaving {
			continue
		}
		if s.want {
			s.phase = subPending
			h.send(c, subOp{subscribe: true, channel: ch})
		} else {
			delete(h.subs, ch)
		}
	}
	for _, q := range c.queues {
		q.forced = true
		poke(q.notify)
	}
}
