package rueidisdlock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/driver"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/rueidis"
)

// movedCluster is a 3-master Cluster with a rueidis cluster client over it.
func movedCluster(t *testing.T) ([]*redistest.Server, *conn) {
	t.Helper()
	nodes := redistest.Cluster(t, 3)
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{nodes[0].Addr()}, DisableCache: true, ConnWriteTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	return nodes, newConn(rc)
}

func serverAt(t *testing.T, nodes []*redistest.Server, addr string) *redistest.Server {
	t.Helper()
	for _, s := range nodes {
		if s.Addr() == addr {
			return s
		}
	}
	t.Fatalf("no node at %s", addr)
	return nil
}

// next reads ps until an event other than a message, or an error, comes.
func next(t *testing.T, ctx context.Context, ps driver.PubSub) (driver.Event, error) {
	t.Helper()
	for range 100 {
		ev, err := ps.Receive(ctx, 5*time.Second)
		if err == nil && ev.Type == driver.Message {
			continue
		}
		return ev, err
	}
	t.Fatal("100 messages in a row")
	return driver.Event{}, nil
}

func isMoved(err error) bool {
	var re driver.ReplyError
	return errors.As(err, &re) && strings.HasPrefix(err.Error(), "MOVED ")
}

// TestPubSubAfterSlotMoved: a sharded subscription's slot moves to another
// master (the node sends sunsubscribe on its own), and the hub then sends,
// through rueidis, SUNSUBSCRIBE and SSUBSCRIBE of that channel on the old
// node's connection, which answers MOVED to both. rueidis must hand each
// MOVED to the command that drew it and keep the connection in step (it
// panics with "protocol bug, message handled out of order" on a reply it
// cannot match): Receive gives the server's sunsubscribe, then the two
// refusals in order, then the Pong of a Ping, and the connection still
// confirms a channel the node serves. Three round trips, the slot going
// back and forth.
func TestPubSubAfterSlotMoved(t *testing.T) {
	nodes, k := movedCluster(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const ch = "dlock:{moved}:wake"
	slot := redistest.KeySlot(t, nodes[0], ch)
	for round := range 3 {
		n, err := k.Node(ctx, ch)
		if err != nil {
			t.Fatal(err)
		}
		from := serverAt(t, nodes, n.Addr())
		to := nodes[(func() int {
			for i, s := range nodes {
				if s == from {
					return (i + 1) % len(nodes)
				}
			}
			return 0
		})()]
		ps := n.PubSub(ctx)
		if err := ps.Subscribe(ctx, true, ch); err != nil {
			t.Fatal(err)
		}
		if ev, err := next(t, ctx, ps); err != nil || ev.Type != driver.Subscription || ev.Kind != "ssubscribe" || ev.Channel != ch {
			t.Fatalf("round %d: after SSUBSCRIBE: %+v, %v", round, ev, err)
		}
		redistest.MigrateSlot(t, nodes, slot, from, to)
		if ev, err := next(t, ctx, ps); err != nil || ev.Type != driver.Subscription || ev.Kind != "sunsubscribe" || ev.Channel != ch {
			t.Fatalf("round %d: after the slot moved: %+v, %v; want the node's sunsubscribe", round, ev, err)
		}
		if err := ps.Unsubscribe(ctx, true, ch); err != nil {
			t.Fatalf("round %d: SUNSUBSCRIBE: %v", round, err)
		}
		if ev, err := next(t, ctx, ps); !isMoved(err) {
			t.Fatalf("round %d: after SUNSUBSCRIBE on the old node: %+v, %v; want MOVED", round, ev, err)
		}
		if err := ps.Subscribe(ctx, true, ch); err != nil {
			t.Fatalf("round %d: SSUBSCRIBE: %v", round, err)
		}
		if ev, err := next(t, ctx, ps); !isMoved(err) {
			t.Fatalf("round %d: after SSUBSCRIBE on the old node: %+v, %v; want MOVED", round, ev, err)
		}
		if err := ps.Ping(ctx); err != nil {
			t.Fatal(err)
		}
		if ev, err := next(t, ctx, ps); err != nil || ev.Type != driver.Pong {
			t.Fatalf("round %d: after PING: %+v, %v", round, ev, err)
		}
		// A channel the old node still serves.
		var other string
		for i := range 10000 {
			c := fmt.Sprintf("dlock:{other-%d}:wake", i)
			if s := redistest.KeySlot(t, nodes[0], c); s != slot {
				if m, err := k.slots.master(ctx, c); err == nil && m == from.Addr() {
					other = c
					break
				}
			}
		}
		if err := ps.Subscribe(ctx, true, other); err != nil {
			t.Fatal(err)
		}
		if ev, err := next(t, ctx, ps); err != nil || ev.Type != driver.Subscription || ev.Kind != "ssubscribe" || ev.Channel != other {
			t.Fatalf("round %d: after SSUBSCRIBE of %s: %+v, %v", round, other, ev, err)
		}
		_ = ps.Close()
		if err := k.slots.load(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
