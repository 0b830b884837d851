package hub

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/dlock-go/dlock/internal/driver"
)

// A conn is one PubSub connection to one server, with a writer goroutine
// that sends its commands and a reader goroutine that dispatches what comes
// back. A conn that fails in any way is dropped (its channels go down) and a
// new one is made when a channel needs that server again.
type conn struct {
	addr  string        // the server's address ("" unless Cluster)
	plain bool          // it subscribes with SUBSCRIBE rather than SSUBSCRIBE (Kind Plain)
	born  time.Time     // when it was made
	ps    driver.PubSub // closed by whoever drops the conn, after Hub.mu is released
	wake  chan struct{} // todo has commands; buffered 1
	done  chan struct{} // closed when dropped: the writer ends

	// Guarded by Hub.mu.
	dead    bool
	todo    []op           // to send, in order
	sent    []op           // sent or being sent, awaiting their replies, oldest first
	seq     uint64         // of the last op queued
	leaving map[string]int // SUNSUBSCRIBEs in todo or sent, by channel
	idle    int            // ticks in a row without a channel
}

type opKind uint8

const (
	opSub opKind = iota + 1
	opUnsub
	opPing
)

// An op is one command: one channel each, so that a Cluster node never
// sees two slots in one SSUBSCRIBE.
type op struct {
	kind    opKind
	channel string
	seq     uint64
}

// send queues a command for the writer and returns its sequence number.
// Called with Hub.mu held.
func (c *conn) send(kind opKind, channel string) uint64 {
	c.seq++
	c.todo = append(c.todo, op{kind, channel, c.seq})
	if kind == opUnsub {
		c.leaving[channel]++
	}
	poke(c.wake)
	return c.seq
}

// pop takes the oldest command awaiting a reply (the one the next reply
// answers), if kind and channel match it. Called with Hub.mu held.
func (c *conn) pop(kind opKind, channel string) (op, bool) {
	if len(c.sent) == 0 || c.sent[0].kind != kind || c.sent[0].channel != channel {
		return op{}, false
	}
	o := c.sent[0]
	c.sent[0] = op{}
	c.sent = c.sent[1:]
	if o.kind == opUnsub {
		if c.leaving[o.channel]--; c.leaving[o.channel] <= 0 {
			delete(c.leaving, o.channel)
		}
	}
	return o, true
}

// kill marks the conn dropped and ends its writer. Called with Hub.mu held.
func (c *conn) kill() {
	if !c.dead {
		c.dead = true
		close(c.done)
	}
}

func (c *conn) issue(ctx context.Context, o op) error {
	switch o.kind {
	case opPing:
		return c.ps.Ping(ctx)
	case opSub:
		return c.ps.Subscribe(ctx, !c.plain, o.channel)
	default:
		return c.ps.Unsubscribe(ctx, !c.plain, o.channel)
	}
}

// replyKinds returns the kinds of the replies that confirm c's subscribe
// and unsubscribe commands.
func (c *conn) replyKinds() (sub, unsub string) {
	if c.plain {
		return "subscribe", "unsubscribe"
	}
	return "ssubscribe", "sunsubscribe"
}

// write sends c's commands in the order they were queued. The first one
// dials; the reader starts after it, so that only the writer ever dials.
func (h *Hub) write(c *conn) {
	defer h.wg.Done()
	reading := false
	var batch []op
	for {
		select {
		case <-c.done:
			return
		case <-c.wake:
		}
		h.mu.Lock()
		if c.dead {
			h.mu.Unlock()
			return
		}
		batch = append(batch[:0], c.todo...)
		c.todo = c.todo[:0]
		// Listed before they are written: a reply can come at once.
		c.sent = append(c.sent, batch...)
		h.mu.Unlock()
		for _, o := range batch {
			if err := c.issue(h.ctx, o); err != nil {
				// The driver may already have reconnected and resubscribed on
				// its own (go-redis does); that connection is closed unread.
				h.lost(c, err)
				return
			}
		}
		if !reading && len(batch) > 0 {
			reading = true
			h.wg.Add(1)
			go h.read(c)
		}
	}
}

// read dispatches what c receives until c is dropped. Messages go straight
// to the Handler; replies are matched with the commands sent.
func (h *Hub) read(c *conn) {
	defer h.wg.Done()
	for {
		ev, err := c.ps.Receive(h.ctx, readTimeout)
		var ok bool
		switch {
		case err != nil:
			ok = h.refused(c, err)
		case ev.Type == driver.Message:
			h.handler.Message(ev.Channel, ev.Payload)
			continue
		case ev.Type == driver.Subscription:
			ok = h.confirm(c, ev.Kind, ev.Channel)
		case ev.Type == driver.Pong:
			ok = h.pong(c)
		default:
			ok = h.refused(c, fmt.Errorf("hub: unexpected event %d from the server", ev.Type))
		}
		if !ok {
			return
		}
	}
}

// errOutOfStep: a reply did not answer the command it should have.
var errOutOfStep = errors.New("hub: reply out of step with the commands sent")

// confirm handles an ssubscribe or sunsubscribe reply (or a sunsubscribe the
// server sent on its own), or on a plain conn a subscribe or unsubscribe
// reply. It reports false if c has been dropped.
func (h *Hub) confirm(c *conn, kind, channel string) bool {
	h.mu.Lock()
	if c.dead {
		h.mu.Unlock()
		return false
	}
	gap, ok := false, true
	switch sub, unsub := c.replyKinds(); kind {
	case sub:
		var o op
		if o, ok = c.pop(opSub, channel); ok {
			gap = h.subscribed(c, o)
		}
	case unsub:
		if _, mine := c.pop(opUnsub, channel); !mine {
			h.unsubscribedByServer(c, channel)
		}
	default:
		ok = false
	}
	h.mu.Unlock()
	if !ok {
		h.lost(c, fmt.Errorf("%w: %s %s", errOutOfStep, kind, channel))
		return false
	}
	if gap {
		h.handler.Gap(channel)
	}
	return true
}

// subscribed handles the confirmation of o on c and reports whether Gap is
// due. Called with h.mu held.
func (h *Hub) subscribed(c *conn, o op) (gap bool) {
	e := h.chans[o.channel]
	switch {
	case e != nil && e.on == c && e.seq == o.seq:
		return e.confirmed()
	case (e == nil || e.on != c) && c.leaving[o.channel] == 0:
		// Subscribed where it is not wanted (any more).
		c.send(opUnsub, o.channel)
	}
	// Otherwise a later SSUBSCRIBE of it on c is still to be confirmed.
	return false
}

// unsubscribedByServer handles a sunsubscribe the server sent on its own: a
// Cluster node does so for every channel of a slot it stops serving. Called
// with h.mu held.
func (h *Hub) unsubscribedByServer(c *conn, channel string) {
	if e := h.chans[channel]; e != nil && e.on == c {
		h.log.Debug("hub: unsubscribed by the server", "channel", channel, "addr", c.addr)
		h.failed(channel, e, rand.Float64())
		h.reload()
	}
}

// pong handles the reply to a ping. It reports false if c has been dropped.
func (h *Hub) pong(c *conn) bool {
	h.mu.Lock()
	_, ok := c.pop(opPing, "")
	dead := c.dead
	h.mu.Unlock()
	if dead {
		return false
	}
	if !ok {
		h.lost(c, fmt.Errorf("%w: pong", errOutOfStep))
	}
	return ok
}

// refused handles an error from Receive: a Redis error replies to the oldest
// command awaiting one; anything else (a closed or broken connection, a read
// timeout) drops c. It reports false if c has been dropped.
func (h *Hub) refused(c *conn, err error) bool {
	var rerr driver.ReplyError
	if !errors.As(err, &rerr) || reconnects(err, c.addr) {
		h.lost(c, err)
		return false
	}
	h.mu.Lock()
	if c.dead {
		h.mu.Unlock()
		return false
	}
	if len(c.sent) == 0 {
		h.mu.Unlock()
		h.lost(c, fmt.Errorf("%w: %w", errOutOfStep, err))
		return false
	}
	o, _ := c.pop(c.sent[0].kind, c.sent[0].channel)
	if o.kind == opSub {
		h.log.Debug("hub: subscription refused", "channel", o.channel, "addr", c.addr, "err", err)
		if e := h.chans[o.channel]; e != nil && e.on == c && e.seq == o.seq {
			h.failed(o.channel, e, rand.Float64())
		}
		if redirected(err) {
			h.reload()
		}
	}
	// A refused SUNSUBSCRIBE: the node does not serve the channel's slot, and
	// a node drops the subscriptions of a slot when it stops serving it.
	h.mu.Unlock()
	return true
}

// reconnects reports whether go-redis reconnects the PubSub on its own after
// this error reply (its isBadConn): the hub then drops the connection, which
// go-redis would otherwise resubscribe behind its back.
func reconnects(err error, addr string) bool {
	msg := err.Error()
	if strings.HasPrefix(msg, "READONLY ") {
		return true
	}
	moved, ok := strings.CutPrefix(msg, "MOVED ")
	if !ok || addr == "" {
		return false
	}
	_, to, _ := strings.Cut(moved, " ")
	return to == addr
}

// redirected reports whether err says the slot is served elsewhere or not at
// all: the client's slot map is then worth reloading.
func redirected(err error) bool {
	msg := err.Error()
	for _, p := range [...]string{"MOVED ", "ASK ", "CLUSTERDOWN ", "TRYAGAIN "} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return false
}

// lost drops c after err, if nobody has yet, and closes its PubSub.
func (h *Hub) lost(c *conn, err error) {
	h.mu.Lock()
	first := !c.dead
	if first {
		h.drop(c)
	}
	h.mu.Unlock()
	if first {
		h.log.Debug("hub: subscription connection dropped", "addr", c.addr, "err", err)
		_ = c.ps.Close()
	}
}
