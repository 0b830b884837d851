package rueidisdlock

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/rueidis"
)

// stallingClient is a real rueidis client whose Nodes, once armed, stalls
// after it has read the primary, until release is closed: the look (see
// watch) of one call that read the primary just before a switch and is
// descheduled before it records what it read, while other calls' looks see
// the switch.
type stallingClient struct {
	rueidis.Client
	armed   atomic.Bool
	stalled chan string // what the stalled Nodes read
	release chan struct{}
}

func (s *stallingClient) Nodes() map[string]rueidis.Client {
	n := s.Client.Nodes()
	if s.armed.CompareAndSwap(true, false) {
		s.stalled <- nodesKey(n)
		<-s.release
	}
	return n
}

// TestRevFo14LookRecordsNoStalePrimary: two looks race across a switch.
// One read the primary (P) before SENTINEL FAILOVER made Q the primary;
// a later call's looks record Q; then the first finishes. It must not
// record P, which it read before Q was recorded: the watch would then name
// P while the client sends to Q. (With a look before every send that
// costs only spurious unknown outcomes, and gen still counts every
// change; TestRevFo14IdleThroughFailoverThenBack shows what a send that
// took seen as its mark would have believed.)
func TestRevFo14LookRecordsNoStalePrimary(t *testing.T) {
	r := redistest.StartReplicated(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rc, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:  r.Addrs(),
		Sentinel:     rueidis.SentinelOption{MasterSet: redistest.SentinelMaster},
		DisableCache: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	sc := &stallingClient{Client: rc, stalled: make(chan string, 1), release: make(chan struct{})}
	k := newConn(sc)
	p, q := r.Primary, r.Replica
	// A look (as every call makes, before its send and after its reply)
	// that read P and stalls.
	sc.armed.Store(true)
	done := make(chan struct{})
	go func() {
		k.prim.look()
		close(done)
	}()
	if got := <-sc.stalled; got != p.Addr() {
		t.Fatalf("the stalled look read %s, want the primary %s", got, p.Addr())
	}
	r.Failover(t)
	redistest.WaitUntil(t, ctx, "the client to move to "+q.Addr(), func() bool { return nodesKey(rc.Nodes()) == q.Addr() })
	if _, err := k.Do(ctx, []any{"exists", "revfo14-probe"}, true); err != nil && err != errReplaced {
		t.Fatal(err)
	}
	if s := *k.prim.seen.Load(); s != q.Addr() {
		t.Fatalf("after a call on %s the watch saw %s", q.Addr(), s)
	}
	close(sc.release) // the stalled look finishes
	<-done
	if s := *k.prim.seen.Load(); s != q.Addr() {
		t.Fatalf("the watch names %s while the client sends to %s: a look recorded the primary it read before the switch", s, q.Addr())
	}
}
