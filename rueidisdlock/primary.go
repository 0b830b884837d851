package rueidisdlock

import (
	"errors"
	"sort"
	"strings"
	"sync/atomic"

	"github.com/redis/rueidis"
)

// errReplaced is the error a reply is turned into when it may have come
// from a primary that Sentinel replaced while it was awaited.
var errReplaced = errors.New("rueidisdlock: the primary was replaced (Sentinel) while the reply was awaited: the reply may come from the old primary, so its outcome is unknown")

// watch tells, on a Sentinel client, whether the primary that rueidis sends
// to changed while a reply was awaited; a reply that may have come from
// the replaced one is not trusted (errReplaced).
//
// Why: when rueidis hears of a switch (+switch-master) it sends new
// commands to the promoted replica at once, but closes its connections to
// the old primary gracefully, reading their replies for up to a second per
// connection. An old primary that was stopped (SIGSTOP) past a lease's TTL
// and resumed in that second runs the acquires it had queued: one of them
// takes the lock there (the holder's lease expired by its clock), and its
// reply would reach a waiter that the promoted replica does not know as
// the holder, while another waiter wins there: two holders at once. The
// old primary's write is lost as soon as it replicates the promoted one,
// so the grant is worth nothing. go-redis's failover client closes its
// connections to the old primary when it learns of the switch, so such a
// reply is lost there: an unknown outcome, which the engine resolves by
// asking the promoted replica again with the same token (or giving the
// lock back if the caller left). errReplaced makes rueidis's late reply
// the same: a reply is kept only if the primary the client sends to, as
// looked at after it came, is the one looked at just before it was sent.
//
// rueidis moves its primary connection to the promoted replica (what
// Nodes reports) before it starts closing the old one, so a reply read
// from the old connection after the switch is seen after the move. What
// no client can tell is a reply that came before rueidis heard of the
// switch: a Client cut off from the sentinels with the old primary
// (docs/SAFETY.md, fault 6).
//
// Both ends of a round trip look: the send just before rueidis picks the
// connection, the reply once it came. A send that took the primary the
// latest look saw, without looking, would be wrong after a switch that no
// look saw (the Client idle through it): its mark would name the old
// primary while it went to the new one, and a switch back during the call
// would look like no change to the look after its reply, whose reply from
// the replaced primary would be believed. A look (Nodes) costs about
// 300 ns and three allocations, so a round trip pays twice that; a switch
// between the send's look and rueidis's pick makes a spurious unknown
// outcome, resolved as any other (an acquire or a release is asked again
// with its token). Only Sentinel clients pay.
//
// A primary is named by its address, so a failover there and back (A to
// B to A) within one reply would look like no change; gen counts every
// change of primary any look of this client saw, so such a round trip is
// caught whenever a look in between saw B (the looks of every call and
// of every subscription event of the Client take part).
type watch struct {
	c    rueidis.Client
	seen atomic.Pointer[string] // the primary the latest look saw
	gen  atomic.Uint64          // bumped by each look that saw a primary other than seen
}

// mark is one look at the primary.
type mark struct {
	addr string
	gen  uint64
}

// newWatch returns a watch for a Sentinel client, nil for any other (a
// single server has no failover; a Cluster client reads its own slot map,
// see conn.Node).
func newWatch(c rueidis.Client) *watch {
	if c.Mode() != rueidis.ClientModeSentinel {
		return nil
	}
	w := &watch{c: c}
	w.look() // seen is never nil from here on
	return w
}

// look says which primary the client sends to now. Nodes on a Sentinel
// client is the primary alone (with its replica under SendToReplicas, a
// replica alone under ReplicaOnly): its addresses, together, name it.
//
// seen is loaded before Nodes is read, and replaced only if it is still
// what was loaded: a look that read the primary before a switch must not
// record it after a concurrent look recorded the switch, or seen would
// name the old primary while the client sends to the new one, and the
// next switch, back to it (a primary and one replica know no other),
// would look like no change to a call sent before it. A look whose
// replacement lost to another's reads Nodes again.
func (w *watch) look() mark {
	for {
		s := w.seen.Load()
		addr := nodesKey(w.c.Nodes())
		if s != nil && *s == addr {
			return mark{addr: addr, gen: w.gen.Load()}
		}
		p := new(string) // allocated only on a change: &addr would move addr to the heap on every look
		*p = addr
		if w.seen.CompareAndSwap(s, p) {
			w.gen.Add(1)
			return mark{addr: addr, gen: w.gen.Load()}
		}
	}
}

// moved reports whether the primary changed since m was taken (nil w:
// never).
func (w *watch) moved(m mark) bool {
	return w != nil && w.look() != m
}

// start takes the mark a send is checked against: a look, just before
// the send (nil w: none).
func (w *watch) start() mark {
	if w == nil {
		return mark{}
	}
	return w.look()
}

func nodesKey(nodes map[string]rueidis.Client) string {
	if len(nodes) == 1 {
		for a := range nodes {
			return a
		}
	}
	addrs := make([]string, 0, len(nodes))
	for a := range nodes {
		addrs = append(addrs, a)
	}
	sort.Strings(addrs)
	return strings.Join(addrs, ",")
}
