package rueidisdlock

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/driver"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/rueidis"
)

// TestSubscribeBeforeReceive: the hub sends its first batch of commands on
// a new connection before it reads (driver.PubSub lets Subscribe run while
// nobody calls Receive), and each Subscribe here waits for its
// confirmation: 200 of them must all return, and Receive must then give
// the 200 confirmations in the order they were sent.
func TestSubscribeBeforeReceive(t *testing.T) {
	s := redistest.Start(t)
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.Addr()}, DisableCache: true, ForceSingleClient: true, ConnWriteTimeout: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n, err := newConn(rc).Node(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	ps := n.PubSub(ctx)
	defer ps.Close()
	const count = 200
	sent := make(chan error, 1)
	go func() {
		for i := range count {
			if err := ps.Subscribe(ctx, true, fmt.Sprintf("ch-%d", i)); err != nil {
				sent <- fmt.Errorf("Subscribe %d: %w", i, err)
				return
			}
		}
		sent <- nil
	}()
	select {
	case err := <-sent:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%d Subscribes sent before any Receive did not return within 10s", count)
	}
	for i := range count {
		ev, err := ps.Receive(ctx, 5*time.Second)
		if err != nil {
			t.Fatalf("Receive %d: %v", i, err)
		}
		if want := fmt.Sprintf("ch-%d", i); ev.Type != driver.Subscription || ev.Kind != "ssubscribe" || ev.Channel != want {
			t.Fatalf("event %d: %+v, want the ssubscribe of %s", i, ev, want)
		}
	}
}
