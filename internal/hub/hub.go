// Package hub keeps a reference-counted set of pub/sub subscriptions live on
// a single server, a Sentinel-managed primary or a Redis Cluster, and tells
// its Handler what it hears and when it may have missed something. They are
// sharded (SSUBSCRIBE) on a Cluster and on any server that has sharded
// pub/sub, and plain (SUBSCRIBE) on a single server without it (see Kind).
//
// The hub converges to the wanted set: it never trusts a subscription it has
// not seen confirmed, and it does not wait for a missed message to notice
// that one is gone. Each fault is seen, and each channel it touched repaired,
// like this:
//
//   - a dropped connection (CLIENT KILL, a restart, a Sentinel failover,
//     which kills the clients of the demoted primary): the read fails at
//     once; the hub closes the connection and subscribes its channels again
//     on a new one, one channel per SSUBSCRIBE. go-redis's own resubscription
//     after a reconnect is never relied on: it sends all of a connection's
//     channels in one SSUBSCRIBE, which a Cluster node refuses with CROSSSLOT
//     as soon as they span two slots.
//   - a connection that answers nothing (a paused server, a silent network):
//     every connection is pinged each second and read with a 3 s deadline,
//     so it is dropped as above within 3 s.
//   - a server-side sunsubscribe (a Cluster node stopped serving the slot:
//     resharding, failover): at once; the client reloads its slot map and the
//     channel is subscribed again where it now lives.
//   - a refused SSUBSCRIBE (MOVED, CLUSTERDOWN, a dial error...): the channel
//     is retried with jittered exponential backoff from 20 ms up to 1 s, for
//     as long as it is wanted; a redirection also reloads the slot map. The
//     channels of a lost connection share their jitter, so that a server
//     that is down is dialed once a round, not once per channel.
//   - a Cluster slot that moved without any of the above: each second the
//     hub compares where every channel is subscribed with the client's slot
//     map, which it reloads every 5 s while anything is wanted.
//
// The bound: once the fault has healed (the server serves the channel again
// and is reachable), every wanted channel is subscribed and confirmed again
// within about 1 s plus a dial and a round trip after a fault the server
// reports (a drop, an unsubscribe, a refusal: the next retry is at most 1 s
// away), within about 4 s after a silent connection (3 s to notice it), and
// within about 6 s after a silent slot move (5 s to reload the map, 1 s to
// compare). Until then Want's channel stays open, and it does close within
// that bound; the hub never gives up on a wanted channel. After every
// re-establishment that follows a failure or a doubt, Handler.Gap is called.
//
// On Sentinel the hub relies on the sentinels to end a subscription on a
// demoted primary: when they make it a replica they kill its pub/sub clients
// (CLIENT KILL TYPE pubsub, with the REPLICAOF), and the hub reconnects
// through the failover client to the new primary. An old primary cut off from
// the sentinels but not from this process keeps the subscription until they
// reach it again, and Suspect does not notice it (the old primary still
// confirms the channel).
//
// Connections: one PubSub connection per Cluster master that serves a wanted
// channel (one in all for a single server or Sentinel), whatever the number
// of channels, each with a reader and a writer goroutine, and one goroutine
// for the hub. A connection left without channels is closed after 30 s.
// Over go-redis, messages go from go-redis's reader straight to
// Handler.Message, with no other goroutine or allocation in between
// (BenchmarkMessage); the connections are the driver's (internal/driver).
//
// Commands and replies are matched by order: Redis answers the commands of
// one connection in order, so each connection keeps the commands it sent and
// the next reply answers the oldest. Anything that does not fit is taken to
// mean the connection is out of step, and it is dropped and made again.
//
// Plain pub/sub changes only the commands a connection sends (SUBSCRIBE and
// UNSUBSCRIBE where the above says SSUBSCRIBE and SUNSUBSCRIBE) and the reply
// kinds it expects. It exists only off Cluster, where every channel lives on
// the one server whatever the kind, so placement, confirmation, Suspect and
// the repairs above are the same (the Cluster-only faults do not arise).
package hub

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/dlock-go/dlock/internal/driver"
)

const (
	// tickEvery is how often every connection is pinged and, on a Cluster,
	// every channel's placement compared with the client's slot map.
	tickEvery = time.Second
	// readTimeout bounds how long a connection may stay silent (pings
	// included) before it counts as dead.
	readTimeout = 3 * time.Second
	// reloadTicks: on a Cluster the client's slot map is reloaded every this
	// many ticks while anything is wanted.
	reloadTicks = 5
	// idleTicks: a connection with no channel for this many ticks is closed.
	idleTicks = 30
	// minBackoff and maxBackoff bound the wait before a channel whose
	// subscription failed is tried again (doubling, with jitter).
	minBackoff = 20 * time.Millisecond
	maxBackoff = time.Second
	// recycleAfter: a connection in doubt (Suspect, one server) is made
	// again only if it is at least this old, so that late messages under
	// load cannot make the hub reconnect over and over.
	recycleAfter = time.Second
)

// Handler receives what the hub hears. Its methods must not block long; they
// may be called from the hub's goroutines concurrently, never with the hub's
// lock held (so they may call the hub), and never after Close has returned.
type Handler interface {
	// Message is a message published on a wanted channel. It may also come,
	// rarely, for a channel just unwanted, or twice for one publish while a
	// subscription moves between servers.
	Message(channel, payload string)
	// Gap says the channel's subscription was just established again after
	// it had failed or been in doubt: messages may have been missed, so
	// whoever waits for one must look at what it waits for again.
	Gap(channel string)
}

// Hub is a set of wanted channels and the subscriptions that carry them. Its
// methods are safe for concurrent use.
type Hub struct {
	drv     driver.Conn
	cluster bool // drv routes by a slot map (driver.Traits.Slots)
	kind    func(context.Context) (Kind, error)
	handler Handler
	log     *slog.Logger
	ctx     context.Context // ends at Close
	cancel  context.CancelFunc
	kick    chan struct{} // wakes the manager; buffered 1
	wg      sync.WaitGroup

	mu      sync.Mutex
	closed  bool
	started bool                // the manager runs
	chans   map[string]*entry   // the wanted channels
	todo    map[string]struct{} // wanted channels that are down or to be verified
	conns   map[string]*conn    // by server address ("" unless Cluster)
}

// never is what Want returns after Close: it is never closed.
var never = make(chan struct{})

// New returns a hub that subscribes through drv: a client of a single
// server, a failover (Sentinel) client or a cluster client. kind says which
// pub/sub to subscribe with (Sharded on a Cluster, see
// driver.Traits.Cluster; a cluster client of other servers may say Plain): the hub asks it before it
// places a channel, and a kind error counts as a failed subscription (retried
// after a backoff); nil means Sharded. It should give the same answer every
// time (see Detect). A nil logger logs nothing. New starts no goroutine
// until the first Want; Close ends them.
func New(drv driver.Conn, h Handler, logger *slog.Logger, kind func(context.Context) (Kind, error)) *Hub {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	if kind == nil {
		kind = func(context.Context) (Kind, error) { return Sharded, nil }
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Hub{
		drv:     drv,
		cluster: drv.Traits().Slots,
		kind:    kind,
		handler: h,
		log:     logger,
		ctx:     ctx,
		cancel:  cancel,
		kick:    make(chan struct{}, 1),
		chans:   map[string]*entry{},
		todo:    map[string]struct{}{},
		conns:   map[string]*conn{},
	}
}

// Want adds a reference to channel, subscribing to it if it had none. The
// returned channel is closed once the subscription is confirmed; if it is
// lost later, Handler.Gap tells when it is back, and a later Want returns a
// channel closed at that point. After Close, Want returns a channel that is
// never closed.
func (h *Hub) Want(channel string) <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return never
	}
	e := h.chans[channel]
	if e == nil {
		e = &entry{ready: make(chan struct{})}
		h.chans[channel] = e
		h.todo[channel] = struct{}{}
		if !h.started {
			h.started = true
			h.wg.Add(1)
			go h.manage()
		}
		poke(h.kick)
	}
	e.refs++
	return e.ready
}

// Unwant drops one reference to channel, unsubscribing once none is left.
// Unwant of a channel not wanted does nothing.
func (h *Hub) Unwant(channel string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	e := h.chans[channel]
	if e == nil {
		return
	}
	if e.refs--; e.refs > 0 {
		return
	}
	delete(h.chans, channel)
	delete(h.todo, channel)
	if e.on != nil {
		e.on.send(opUnsub, channel)
	}
}

// Suspect says a message that should have come on channel did not: the hub
// subscribes to it again (where the slot map now puts it), which the server
// confirms whether or not it was still subscribed, and calls Handler.Gap once
// it is confirmed. On a Cluster only that channel is touched. On one server
// (plain or Sentinel) the connection itself is made again if it is older
// than recycleAfter, since a failover leaves it on a demoted primary: every
// channel is placed again. A channel being subscribed or retried already,
// or not wanted, is left as it is.
func (h *Hub) Suspect(channel string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if e := h.chans[channel]; e != nil && e.state() == up && !e.verify {
		e.verify = true
		h.todo[channel] = struct{}{}
		poke(h.kick)
	}
}

// Close unsubscribes from everything, closes the connections and returns
// once every goroutine of the hub has ended. It is idempotent.
func (h *Hub) Close() {
	h.mu.Lock()
	var conns []*conn
	if !h.closed {
		h.closed = true
		h.cancel()
		for _, c := range h.conns {
			c.kill()
			conns = append(conns, c)
		}
		clear(h.conns)
	}
	h.mu.Unlock()
	for _, c := range conns {
		_ = c.ps.Close()
	}
	h.wg.Wait()
}
