package hub

import (
	"math/rand/v2"
	"time"

	"github.com/dlock-go/dlock/internal/driver"
)

// manage places the channels that are down or to be verified, when their
// retry is due, and does the periodic checks.
func (h *Hub) manage() {
	defer h.wg.Done()
	ticker := time.NewTicker(tickEvery)
	defer ticker.Stop()
	retry := time.NewTimer(time.Hour)
	defer retry.Stop()
	for ticks := 1; ; {
		select {
		case <-h.ctx.Done():
			return
		case <-h.kick:
		case <-retry.C:
		case <-ticker.C:
			h.tick(ticks)
			ticks++
		}
		if next := h.place(); next > 0 {
			retry.Reset(next)
		}
	}
}

// place subscribes the channels in todo whose retry is due, on the server
// that serves each now, and returns how long until the next retry is due
// (0 if none is waiting).
func (h *Hub) place() time.Duration {
	now := time.Now()
	var due []string
	var next time.Duration
	h.mu.Lock()
	for name := range h.todo {
		e := h.chans[name]
		if wait := e.retry.Sub(now); e.on == nil && wait > 0 {
			if next == 0 || wait < next {
				next = wait
			}
			continue
		}
		due = append(due, name)
	}
	h.mu.Unlock()
	if len(due) == 0 {
		return next
	}
	where := make([]target, len(due))
	for i, name := range due {
		if i > 0 && !h.cluster {
			where[i] = where[0] // one server, one answer: ask kind once
			continue
		}
		where[i] = h.locate(name)
	}
	var dropped []*conn
	defer func() {
		for _, c := range dropped {
			_ = c.ps.Close()
		}
	}()
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, name := range due {
		e := h.chans[name]
		if e == nil || h.closed {
			continue
		}
		delete(h.todo, name)
		t := where[i]
		switch {
		case t.err != nil:
			h.log.Debug("hub: cannot locate channel", "channel", name, "err", t.err)
			if e.on == nil {
				h.failed(name, e, rand.Float64())
			}
			e.verify = false
		case e.on == nil:
			e.verify = false
			h.subscribe(name, e, h.connTo(t))
		case e.verify && !h.cluster:
			// One server, so the connection itself is in doubt: after a
			// Sentinel failover it may still be on the demoted primary,
			// which hears nothing until the sentinels reconfigure it
			// (seconds later). A new connection dials the primary of now;
			// every channel on the old one is placed again (with a Gap).
			e.verify = false
			if c := e.on; e.state() == up && time.Since(c.born) >= recycleAfter {
				h.log.Debug("hub: connection in doubt, making it again", "channel", name)
				h.drop(c)
				dropped = append(dropped, c)
			}
		case e.verify:
			e.verify = false
			if e.state() == up {
				h.move(name, e, t)
			}
		}
	}
	return next
}

// tick pings every connection, closes those left without channels, and on
// a Cluster moves the channels that the slot map places elsewhere now.
func (h *Hub) tick(n int) {
	type placed struct {
		name string
		on   *conn
	}
	var check []placed
	var idle []*conn
	h.mu.Lock()
	used := make(map[*conn]bool, len(h.conns))
	for name, e := range h.chans {
		if e.on != nil {
			used[e.on] = true
			if h.cluster {
				check = append(check, placed{name, e.on})
			}
		}
	}
	for addr, c := range h.conns {
		if used[c] || len(c.leaving) > 0 {
			c.idle = 0
		} else if c.idle++; c.idle >= idleTicks {
			c.kill()
			delete(h.conns, addr)
			idle = append(idle, c)
			continue
		}
		c.send(opPing, "")
	}
	reload := h.cluster && len(h.chans) > 0 && n%reloadTicks == 0
	h.mu.Unlock()
	for _, c := range idle {
		_ = c.ps.Close()
	}
	if reload {
		h.drv.ReloadSlots()
	}
	var moves []placed
	var to []target
	for _, p := range check {
		if t := h.locate(p.name); t.err == nil && t.addr != p.on.addr {
			moves = append(moves, p)
			to = append(to, t)
		}
	}
	if len(moves) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for i, m := range moves {
		if e := h.chans[m.name]; e != nil && e.on == m.on && !h.closed {
			h.log.Debug("hub: channel moved", "channel", m.name, "from", m.on.addr, "to", to[i].addr)
			h.move(m.name, e, to[i])
		}
	}
}

// target is where a channel is to be subscribed: the server's address, the
// node that makes PubSubs to it, and with which kind of pub/sub.
type target struct {
	addr  string
	plain bool
	src   driver.Node
	err   error
}

// locate returns where channel lives now: on a Cluster, the master of its
// slot in the client's slot map; otherwise the one server, where a
// connection of either kind hears every channel.
func (h *Hub) locate(channel string) target {
	k, err := h.kind(h.ctx) // Sharded at once on a Cluster (see driver.Traits.Cluster)
	if err != nil {
		return target{err: err}
	}
	node, err := h.drv.Node(h.ctx, channel) // the one server unless h.cluster
	if err != nil {
		return target{err: err}
	}
	return target{addr: node.Addr(), plain: k == Plain, src: node}
}

// connTo returns the live connection to t, making it if needed. Called with
// h.mu held; it does no I/O (the writer dials on its first command).
func (h *Hub) connTo(t target) *conn {
	if c := h.conns[t.addr]; c != nil {
		return c
	}
	c := &conn{
		addr:    t.addr,
		plain:   t.plain,
		born:    time.Now(),
		ps:      t.src.PubSub(h.ctx), // without channels: a PubSub of either kind
		leaving: map[string]int{},
		wake:    make(chan struct{}, 1),
		done:    make(chan struct{}),
	}
	h.conns[t.addr] = c
	h.wg.Add(1)
	go h.write(c)
	return c
}

// subscribe sends channel's SSUBSCRIBE on c. Called with h.mu held.
func (h *Hub) subscribe(name string, e *entry, c *conn) {
	e.on, e.seq = c, c.send(opSub, name)
}

// move subscribes channel again at t, leaving its old connection if that is
// elsewhere. Called with h.mu held, for a channel that is placed.
func (h *Hub) move(name string, e *entry, t target) {
	e.doubt()
	c := h.connTo(t)
	if e.on != c {
		e.on.send(opUnsub, name)
	}
	h.subscribe(name, e, c)
}

// failed takes a channel down after its subscription failed or was lost; it
// is tried again after its backoff, stretched by jitter (0 to 1) by up to
// half. Called with h.mu held.
func (h *Hub) failed(name string, e *entry, jitter float64) {
	e.doubt()
	e.on, e.seq = nil, 0
	e.backoff = min(max(2*e.backoff, minBackoff), maxBackoff)
	e.retry = time.Now().Add(e.backoff/2 + time.Duration(jitter*float64(e.backoff/2)))
	h.todo[name] = struct{}{}
	poke(h.kick)
}

// drop forgets the dead connection c: its channels are down. They share one
// jitter, so that they are retried together, on one new connection, rather
// than each dialing a server that may still be down. Called with h.mu held;
// the caller closes c.ps after unlocking.
func (h *Hub) drop(c *conn) {
	c.kill()
	if h.conns[c.addr] == c {
		delete(h.conns, c.addr)
	}
	jitter := rand.Float64()
	for name, e := range h.chans {
		if e.on == c {
			h.failed(name, e, jitter)
		}
	}
}

// reload asks a Cluster client to reload its slot map (in the background).
func (h *Hub) reload() {
	if h.cluster {
		h.drv.ReloadSlots()
	}
}

func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
