package dlock

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock/internal/driver"
	"github.com/dlock-go/dlock/internal/hub"
	"github.com/dlock-go/dlock/internal/wire"
)

// How a waiter for a string lock (StringMutex) learns of a release that
// another library made: that library publishes nothing, so dlock listens to
// the server's keyspace notifications for the key (__keyspace@DB__:KEY,
// which Redis publishes on the node that holds the key, with plain pub/sub)
// when the server has them on; otherwise it polls. Keyspace notifications
// were chosen over client-side caching (CLIENT TRACKING): they need no
// RESP3 or redirect connection of the driver's, a waiter already holds a
// subscription connection per node, and a notification carries what
// happened (del, expired), so only a release wakes a waiter; their cost is
// the server's, paid on every write while they are on (docs/BENCHMARKS.md).

// stringPoll is the mean interval of a waiter's looks at a string lock
// when the server sends no keyspace notifications: each look waits a
// uniform 0.5 to 1.5 times it, so that the waiters of many processes do not
// look in step.
const stringPoll = 50 * time.Millisecond

// stringSubscribeWait bounds how long a waiter for a string lock waits for
// its subscriptions to be confirmed before it looks (subscribeWait for the
// others): it has no place in line to keep, a release it misses meanwhile
// costs it one look, and a channel that the ACL refuses (the key's, its
// keyspace channel, or CLIENT INFO) would otherwise hold every wait for
// subscribeWait, without a look, where it could poll.
const stringSubscribeWait = stringPoll

// notifyRecheck is how long an answer about notify-keyspace-events is
// trusted before it is asked again (an operator may change it at run time).
const notifyRecheck = 10 * time.Second

// strWait is a Client's state for waiting on string locks: the hub of its
// keyspace subscriptions, made at the first wait, and what it last learned
// of the server's notify-keyspace-events. On a Cluster each master has its
// own setting and publishes only its own keys' events, so the answer is
// kept per hash slot (asked of the slot's master); off Cluster there is one.
type strWait struct {
	hub *hub.Hub // guarded by Client.mu

	mu    sync.Mutex
	slots map[uint16]*notifyState // by slot on a Cluster, else slot 0
}

// notifyState is what a Client knows of one slot's notifications.
type notifyState struct {
	on     bool      // its master publishes the notifications a waiter needs
	at     time.Time // when that was learned (zero: never)
	asking bool      // a question is in flight
}

// notifyFor returns the state of key's slot. Called with w.mu held.
func (c *Client) notifyFor(key string) *notifyState {
	w := &c.sw
	var slot uint16
	if c.tr.Cluster {
		slot = wire.Slot(key)
	}
	if w.slots == nil {
		w.slots = map[uint16]*notifyState{}
	}
	s := w.slots[slot]
	if s == nil {
		s = &notifyState{}
		w.slots[slot] = s
	}
	return s
}

// keyspaceHub returns the hub of c's keyspace subscriptions, making it on
// first use. Called with c.mu held.
func (c *Client) keyspaceHub() *hub.Hub {
	if c.sw.hub == nil {
		plain := func(context.Context) (hub.Kind, error) { return hub.Plain, nil }
		c.sw.hub = hub.New(keyspaceConn{Conn: c.drv, cluster: c.tr.Cluster}, keyspaceHandler{c}, c.cfg.logger, plain)
		if c.closed.Load() {
			// A waiter that Close overtook: Close has passed closeKeyspace
			// (it sets closed first, and closeKeyspace takes c.mu), so
			// nobody would close a hub made now. A closed one starts nothing.
			c.sw.hub.Close()
		}
	}
	return c.sw.hub
}

// closeKeyspace ends the keyspace hub, if there is one (at Close).
func (c *Client) closeKeyspace() {
	c.mu.Lock()
	h := c.sw.hub
	c.mu.Unlock()
	if h != nil {
		h.Close()
	}
}

// secondWant subscribes the second channel a waiter for lk needs: this
// Client's hand-over channel, or for a string lock the key's keyspace
// notifications (whatever the server's setting: a server that sends none
// costs an idle subscription). Called with c.mu held.
func (c *Client) secondWant(lk *lock) <-chan struct{} {
	if lk.isString() {
		return c.keyspaceHub().Want(lk.hash)
	}
	return c.hub.Want(lk.handover)
}

// secondUnwant undoes secondWant. Called with c.mu held.
func (c *Client) secondUnwant(lk *lock) {
	if lk.isString() {
		c.keyspaceHub().Unwant(lk.hash)
		return
	}
	c.hub.Unwant(lk.handover)
}

// stringLeft bounds how long a waiter for the string lock lk sleeps before
// it looks again, given that the holder's lease has left: as any waiter's
// if the server sends keyspace notifications, else a jittered poll. It asks
// the server about its notifications in the background when its answer is
// stale (and polls until it knows).
func (c *Client) stringLeft(lk *lock, left time.Duration) time.Duration {
	w := &c.sw
	w.mu.Lock()
	s := c.notifyFor(lk.hash)
	on, stale := s.on, time.Since(s.at) > notifyRecheck && !s.asking
	if stale {
		s.asking = true
	}
	w.mu.Unlock()
	if stale && !c.goBg(func() { c.askNotify(lk.hash, s) }) {
		w.mu.Lock()
		s.asking = false
		w.mu.Unlock()
	}
	if on {
		return left
	}
	poll := stringPoll/2 + rand.N(stringPoll)
	return min(left, poll)
}

// askNotify asks the node of key for notify-keyspace-events and records in
// s (key's slot's) whether a waiter would hear a release there: K (keyspace events) and g
// (generic commands: DEL) or A (all). An error counts as no: the waiters
// poll.
func (c *Client) askNotify(key string, s *notifyState) {
	ctx, cancel := context.WithTimeout(c.bg, time.Second)
	defer cancel()
	v, err := c.aside(ctx, func(ctx context.Context) (any, error) {
		n, err := c.drv.Node(ctx, key)
		if err != nil {
			return nil, err
		}
		r := n.Pipe(ctx, [][]any{{"config", "get", "notify-keyspace-events"}}, false)
		return r[0].Val, r[0].Err
	}, nil)
	flags, _ := configValue(v)
	on := err == nil && strings.Contains(flags, "K") && strings.ContainsAny(flags, "gA")
	c.cfg.logger.Debug("dlock: keyspace notifications", "on", on, "flags", flags, "err", err)
	w := &c.sw
	w.mu.Lock()
	s.on, s.at, s.asking = on, time.Now(), false
	w.mu.Unlock()
}

// configValue reads the value of a CONFIG GET of one parameter, in either
// protocol's shape: a two-element array (RESP2) or a one-entry map (RESP3).
func configValue(v any) (string, bool) {
	switch r := v.(type) {
	case []any:
		if len(r) == 2 {
			s, ok := r[1].(string)
			return s, ok
		}
	case map[any]any:
		for _, e := range r {
			s, ok := e.(string)
			return s, ok
		}
	case map[string]any:
		for _, e := range r {
			s, ok := e.(string)
			return s, ok
		}
	}
	return "", false
}

// keyspaceHandler wakes the waiters for a key when its keyspace
// notification says it went (deleted, expired, evicted, renamed or moved
// away), and when the subscription had a gap.
type keyspaceHandler struct{ c *Client }

func (k keyspaceHandler) Message(key, event string) {
	switch event {
	case "del", "expired", "evicted", "rename_from", "move_from":
		k.c.released(key, 0, false)
	}
}

func (k keyspaceHandler) Gap(key string) { k.c.released(key, 0, false) }

// keyspaceConn is the driver of the keyspace hub: it wants channels named
// by the keys they are about, which it subscribes as those keys' keyspace
// channels, on the node that holds each key.
type keyspaceConn struct {
	driver.Conn
	cluster bool // a Cluster has only database 0
}

func (k keyspaceConn) Node(ctx context.Context, key string) (driver.Node, error) {
	n, err := k.Conn.Node(ctx, key)
	if err != nil {
		return nil, err
	}
	return keyspaceNode{Node: n, cluster: k.cluster}, nil
}

type keyspaceNode struct {
	driver.Node
	cluster bool
}

func (n keyspaceNode) PubSub(ctx context.Context) driver.PubSub {
	return &keyspacePubSub{PubSub: n.Node.PubSub(ctx), node: n.Node, cluster: n.cluster}
}

// keyspacePubSub subscribes __keyspace@DB__:KEY for KEY, where DB is the
// database the driver's connections use (CLIENT INFO), and gives back
// events about KEY.
type keyspacePubSub struct {
	driver.PubSub
	node    driver.Node
	cluster bool
	mu      sync.Mutex
	prefix  string // "__keyspace@DB__:" once known
}

func (p *keyspacePubSub) channel(ctx context.Context, key string) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.prefix == "" {
		db := "0"
		if !p.cluster {
			r := p.node.Pipe(ctx, [][]any{{"client", "info"}}, false)
			if r[0].Err != nil {
				return "", r[0].Err
			}
			s, _ := r[0].Val.(string)
			if i := strings.Index(s, " db="); i >= 0 {
				db, _, _ = strings.Cut(s[i+len(" db="):], " ")
			}
		}
		p.prefix = "__keyspace@" + db + "__:"
	}
	return p.prefix + key, nil
}

func (p *keyspacePubSub) Subscribe(ctx context.Context, _ bool, key string) error {
	ch, err := p.channel(ctx, key)
	if err != nil {
		return err
	}
	return p.PubSub.Subscribe(ctx, false, ch)
}

func (p *keyspacePubSub) Unsubscribe(ctx context.Context, _ bool, key string) error {
	ch, err := p.channel(ctx, key)
	if err != nil {
		return err
	}
	return p.PubSub.Unsubscribe(ctx, false, ch)
}

func (p *keyspacePubSub) Receive(ctx context.Context, timeout time.Duration) (driver.Event, error) {
	ev, err := p.PubSub.Receive(ctx, timeout)
	p.mu.Lock()
	prefix := p.prefix
	p.mu.Unlock()
	if prefix != "" {
		ev.Channel = strings.TrimPrefix(ev.Channel, prefix)
	}
	return ev, err
}
