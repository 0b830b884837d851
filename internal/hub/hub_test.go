package hub_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/driver/goredis"
	"github.com/dlock-go/dlock/internal/hub"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// On one server, under both protocols and with both kinds of pub/sub (the
// hub's kind found by Detect: plain on a server without sharded pub/sub):
// churn leaves exactly the wanted channels subscribed; messages arrive;
// after CLIENT KILL TYPE pubsub they arrive again and Gap is called for
// every channel.
func TestSingleServer(t *testing.T) {
	for _, kind := range []hub.Kind{hub.Sharded, hub.Plain} {
		for _, proto := range []int{2, 3} {
			t.Run(kind.String()+"/RESP"+string(rune('0'+proto)), func(t *testing.T) {
				s := redistest.Start(t, redistest.Options{NoShardedPubSub: kind == hub.Plain})
				rdb := s.Client(t, func(o *redis.Options) { o.Protocol = proto })
				h, rec := startKind(t, rdb, func(ctx context.Context) (hub.Kind, error) { return hub.Detect(ctx, goredis.New(rdb, false), "probe") })
				wanted := names("lock:", 50)
				churn(h, names("churn:", 20), 8, 200)
				wantAll(t, h, wanted)
				churn(h, names("churn:", 20), 8, 200)
				subscribedOn(t, kind, []*redistest.Server{s}, wanted, nil)
				delivered(t, kind, rdb, rec, wanted)

				before := rec.gapsOf(wanted)
				killPubSub(t, s)
				gapsAtLeast(t, rec, wanted, before)
				subscribedOn(t, kind, []*redistest.Server{s}, wanted, nil)
				delivered(t, kind, rdb, rec, wanted)
			})
		}
	}
}

// Detect tells a server with sharded pub/sub from one without, and says
// when it cannot tell; a Cluster is sharded whatever the probe meets
// but a refusal.
func TestDetect(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, kind := range []hub.Kind{hub.Sharded, hub.Plain} {
		s := redistest.Start(t, redistest.Options{NoShardedPubSub: kind == hub.Plain})
		rdb := s.Client(t, func(o *redis.Options) { o.MaxRetries = -1 })
		if got, err := hub.Detect(ctx, goredis.New(rdb, false), "probe"); got != kind || err != nil {
			t.Errorf("Detect = %v, %v; want %v", got, err, kind)
		}
		s.Kill()
		if got, err := hub.Detect(ctx, goredis.New(rdb, false), "probe"); err == nil {
			t.Errorf("Detect with the server down = %v, want an error", got)
		}
	}
	unreachable := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer unreachable.Close()
	if got, err := hub.Detect(ctx, goredis.New(unreachable, false), "probe"); got != hub.Sharded || err != nil {
		t.Errorf("Detect on a Cluster = %v, %v; want sharded, whatever the probe met", got, err)
	}
}

// A kind that cannot be told yet fails the subscriptions like a refusal:
// they are retried until it can, then confirmed.
func TestKindErrorRetried(t *testing.T) {
	s := redistest.Start(t, redistest.Options{NoShardedPubSub: true})
	rdb := s.Client(t)
	var asked atomic.Int32
	h, rec := startKind(t, rdb, func(context.Context) (hub.Kind, error) {
		if asked.Add(1) <= 3 {
			return 0, errors.New("not yet")
		}
		return hub.Plain, nil
	})
	wanted := names("lock:", 10)
	wantAll(t, h, wanted)
	if n := asked.Load(); n <= 3 {
		t.Fatalf("kind asked %d times, want more than the 3 that failed", n)
	}
	delivered(t, hub.Plain, rdb, rec, wanted)
}

// churn runs workers goroutines that each want and unwant random channels
// of pool rounds times, leaving every reference dropped.
func churn(h *hub.Hub, pool []string, workers, rounds int) {
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			var held []string
			for range rounds {
				if len(held) > 0 && rand.IntN(2) == 0 {
					i := rand.IntN(len(held))
					h.Unwant(held[i])
					held = append(held[:i], held[i+1:]...)
					continue
				}
				ch := pool[rand.IntN(len(pool))]
				h.Want(ch)
				held = append(held, ch)
			}
			for _, ch := range held {
				h.Unwant(ch)
			}
		})
	}
	wg.Wait()
}

// Suspect subscribes the one channel again, which the server counts as one
// SSUBSCRIBE, calls Gap for it alone, and leaves it working.
func TestSuspectRepairsOnlyThatChannel(t *testing.T) {
	nodes := redistest.Cluster(t, 3)
	rdb := redistest.ClusterClient(t, nodes)
	h, rec := start(t, rdb)
	wanted := names("lock:", 200)
	wantAll(t, h, wanted)
	delivered(t, hub.Sharded, rdb, rec, wanted)

	calls := func() int {
		n := 0
		for _, s := range nodes {
			c, _ := commandCalls(t, s, "ssubscribe")
			n += c
		}
		return n
	}
	before, gaps := calls(), rec.gapsOf(wanted)
	suspect := wanted[17]
	// The node that serves it is paused, so that the second Suspect comes
	// while the first is surely still being verified: nothing more is sent.
	node := nodeFor(t, rdb, nodes, suspect)
	node.Pause()
	h.Suspect(suspect)
	time.Sleep(50 * time.Millisecond) // not an order: the manager may send its SSUBSCRIBE meanwhile, or not
	h.Suspect(suspect)
	node.Resume()
	gapsAtLeast(t, rec, []string{suspect}, gaps[17:18])
	if n := calls() - before; n != 1 {
		t.Errorf("Suspect sent %d SSUBSCRIBEs, want 1", n)
	}
	after := rec.gapsOf(wanted)
	for i, ch := range wanted {
		if ch != suspect && after[i] != gaps[i] {
			t.Errorf("Gap called for %s, which was not suspected", ch)
		}
	}
	delivered(t, hub.Sharded, rdb, rec, wanted)
}

// Close while subscriptions are in flight and connections are being killed
// ends every goroutine of the hub.
func TestCloseInFlight(t *testing.T) {
	nodes := redistest.Cluster(t, 3)
	rdb := redistest.ClusterClient(t, nodes)
	for round := range 5 {
		h := hub.New(goredis.New(rdb, false), newRecorder(), nil, nil)
		for _, ch := range names("lock:", 200) {
			h.Want(ch)
		}
		if round%2 == 1 {
			time.Sleep(time.Duration(round) * 5 * time.Millisecond)
			for _, s := range nodes {
				killPubSub(t, s)
			}
		}
		h.Suspect("lock:1")
		h.Close()
		h.Close() // idempotent
		if g := hubGoroutines(); g != "" {
			t.Fatalf("round %d: goroutines of the hub outlive Close:\n%s", round, g)
		}
		if ready := h.Want("after"); ready == nil {
			t.Fatal("Want after Close returned nil")
		}
	}
}

// hubGoroutines returns the stacks of the goroutines running hub code. A
// goroutine that has signalled its end to Close may still be returning from
// its last frame for a moment, so it looks again for up to a second (as
// goleak does).
func hubGoroutines() string {
	var out []string
	for try := 0; try < 50; try++ {
		if try > 0 {
			time.Sleep(20 * time.Millisecond)
		}
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		out = out[:0]
		for g := range strings.SplitSeq(string(buf), "\n\n") {
			if strings.Contains(g, "dlock/internal/hub.(*Hub)") {
				out = append(out, g)
			}
		}
		if len(out) == 0 {
			break
		}
	}
	return strings.Join(out, "\n\n")
}

// nodeFor returns the node of nodes that serves channel now.
func nodeFor(t *testing.T, rdb *redis.ClusterClient, nodes []*redistest.Server, channel string) *redistest.Server {
	t.Helper()
	m, err := rdb.MasterForKey(t.Context(), channel)
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range nodes {
		if s.Addr() == m.Options().Addr {
			return s
		}
	}
	t.Fatalf("no node at %s", m.Options().Addr)
	return nil
}
