package hub_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/driver/goredis"
	"github.com/dlock-go/dlock/internal/hub"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// redistest keeps one OS thread for starting servers (so they die with it).
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/dlock-go/dlock/internal/redisproc.spawnLoop"))
}

// converge bounds every wait for the hub to reach a state: generous, far
// above the bound the hub states (about 6 s after a fault has healed).
const converge = 20 * time.Second

// recorder is the Handler of the tests: it keeps what it is told.
type recorder struct {
	mu   sync.Mutex
	msgs map[string]map[string]bool // channel → payloads received
	gaps map[string]int
}

func newRecorder() *recorder {
	return &recorder{msgs: map[string]map[string]bool{}, gaps: map[string]int{}}
}

func (r *recorder) Message(channel, payload string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.msgs[channel] == nil {
		r.msgs[channel] = map[string]bool{}
	}
	r.msgs[channel][payload] = true
}

func (r *recorder) Gap(channel string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.gaps[channel]++
}

func (r *recorder) got(channel, payload string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.msgs[channel][payload]
}

// gapsOf returns how many times Gap was called for each channel.
func (r *recorder) gapsOf(channels []string) []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := make([]int, len(channels))
	for i, ch := range channels {
		n[i] = r.gaps[ch]
	}
	return n
}

// start returns a hub over rdb with a recorder, closed when the test ends
// (before rdb); its debug log is printed if the test fails, or always with
// HUB_LOG=1 in the environment.
func start(t *testing.T, rdb redis.UniversalClient) (*hub.Hub, *recorder) {
	t.Helper()
	return startKind(t, rdb, nil)
}

// startKind is start with the hub's kind function (nil: Sharded).
func startKind(t *testing.T, rdb redis.UniversalClient, kind func(context.Context) (hub.Kind, error)) (*hub.Hub, *recorder) {
	t.Helper()
	var mu sync.Mutex
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	rec := newRecorder()
	h := hub.New(goredis.New(rdb, false), rec, logger, kind)
	t.Cleanup(func() {
		h.Close()
		if t.Failed() || os.Getenv("HUB_LOG") != "" {
			mu.Lock()
			t.Logf("hub log:\n%s", tail(buf.String(), 200))
			mu.Unlock()
		}
	})
	return h, rec
}

type lockedWriter struct {
	mu  *sync.Mutex
	buf *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func tail(s string, lines int) string {
	l := strings.Split(s, "\n")
	return strings.Join(l[max(0, len(l)-lines):], "\n")
}

// names returns n channel names, spread over the slots by their hash.
func names(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = prefix + strconv.Itoa(i)
	}
	return out
}

// wantAll wants every channel and waits until each is confirmed.
func wantAll(t *testing.T, h *hub.Hub, channels []string) {
	t.Helper()
	ready := make([]<-chan struct{}, len(channels))
	for i, ch := range channels {
		ready[i] = h.Want(ch)
	}
	timeout := time.After(converge)
	for i, r := range ready {
		select {
		case <-r:
		case <-timeout:
			t.Fatalf("channel %s not confirmed within %v", channels[i], converge)
		}
	}
}

// eventually polls cond every 20 ms until it holds, failing t after
// converge.
func eventually(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(converge)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %s", what, converge, why)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var probes int

// delivered publishes on every channel, with kind's publish command, until
// the hub has heard each: a message published before a subscription is back
// is lost, so the missing ones are published again every 100 ms, for at
// most converge.
func delivered(t *testing.T, kind hub.Kind, pub redis.UniversalClient, rec *recorder, channels []string) {
	t.Helper()
	probes++
	tag := fmt.Sprintf("probe%d", probes)
	missing := slices.Clone(channels)
	deadline := time.Now().Add(converge)
	for round := 0; len(missing) > 0; round++ {
		if time.Now().After(deadline) {
			t.Fatalf("%d channels never delivered a message within %v, e.g. %v", len(missing), converge, missing[:min(5, len(missing))])
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		for _, ch := range missing {
			// A publish may fail while the cluster moves a slot: the next
			// round publishes again.
			if kind == hub.Plain {
				_ = pub.Publish(ctx, ch, tag+"/"+strconv.Itoa(round)).Err()
			} else {
				_ = pub.SPublish(ctx, ch, tag+"/"+strconv.Itoa(round)).Err()
			}
		}
		cancel()
		time.Sleep(100 * time.Millisecond)
		missing = slices.DeleteFunc(missing, func(ch string) bool {
			for r := 0; r <= round; r++ {
				if rec.got(ch, tag+"/"+strconv.Itoa(r)) {
					return true
				}
			}
			return false
		})
	}
}

// shardChannels returns PUBSUB SHARDCHANNELS of s.
func shardChannels(t *testing.T, s *redistest.Server) map[string]bool {
	t.Helper()
	return channelsOn(t, s, hub.Sharded)
}

// channelsOn returns the channels of s subscribed with kind: PUBSUB
// SHARDCHANNELS, or PUBSUB CHANNELS for Plain.
func channelsOn(t *testing.T, s *redistest.Server, kind hub.Kind) map[string]bool {
	t.Helper()
	sub := "SHARDCHANNELS"
	if kind == hub.Plain {
		sub = "CHANNELS"
	}
	out := map[string]bool{}
	list, _ := s.Do(t, "PUBSUB", sub).([]any)
	for _, ch := range list {
		out[fmt.Sprint(ch)] = true
	}
	return out
}

// subscribedOn waits until, on every server in nodes, PUBSUB SHARDCHANNELS
// (CHANNELS for Plain) lists exactly the wanted channels it serves: on a
// Cluster (slots given), those whose slot it is the master of in nodes[0]'s
// view; otherwise all.
func subscribedOn(t *testing.T, kind hub.Kind, nodes []*redistest.Server, channels []string, slots map[string]int) {
	t.Helper()
	eventually(t, "PUBSUB "+kind.String()+" channels on every node are exactly its wanted channels", func() (bool, string) {
		home := func(string) *redistest.Server { return nodes[0] }
		if slots != nil {
			home = homes(t, nodes, slots)
		}
		want := map[*redistest.Server]map[string]bool{}
		for _, ch := range channels {
			s := home(ch)
			if want[s] == nil {
				want[s] = map[string]bool{}
			}
			want[s][ch] = true
		}
		for _, s := range nodes {
			if got := channelsOn(t, s, kind); !maps.Equal(got, want[s]) {
				return false, fmt.Sprintf("%s has %d channels, want %d", s.Addr(), len(got), len(want[s]))
			}
		}
		return true, ""
	})
}

// homes returns which of nodes is the master of each channel's slot, in
// nodes[0]'s view of the cluster.
func homes(t *testing.T, nodes []*redistest.Server, slots map[string]int) func(string) *redistest.Server {
	t.Helper()
	byAddr := map[string]*redistest.Server{}
	for _, s := range nodes {
		byAddr[s.Addr()] = s
	}
	view := redistest.ClusterView(t, nodes[0])
	return func(ch string) *redistest.Server {
		for _, n := range view {
			if !n.Replica() && n.Serves(slots[ch]) {
				return byAddr[n.Addr]
			}
		}
		return nil
	}
}

// slotsOf returns each channel's hash slot, as s computes it.
func slotsOf(t *testing.T, s *redistest.Server, channels []string) map[string]int {
	t.Helper()
	rdb := s.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cmds, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, ch := range channels {
			p.ClusterKeySlot(ctx, ch)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for i, c := range cmds {
		out[channels[i]] = int(c.(*redis.IntCmd).Val())
	}
	return out
}

// commandCalls returns the calls and rejected calls of cmd on s (INFO
// commandstats).
func commandCalls(t *testing.T, s *redistest.Server, cmd string) (calls, rejected int) {
	t.Helper()
	info, _ := s.Do(t, "INFO", "commandstats").(string)
	for line := range strings.SplitSeq(info, "\n") {
		stats, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":")
		if !ok {
			continue
		}
		for kv := range strings.SplitSeq(stats, ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.Atoi(v)
			switch k {
			case "calls":
				calls = n
			case "rejected_calls":
				rejected = n
			}
		}
	}
	return calls, rejected
}

// killPubSub drops every pub/sub connection of s.
func killPubSub(t *testing.T, s *redistest.Server) {
	t.Helper()
	s.Do(t, "CLIENT", "KILL", "TYPE", "pubsub")
}

// gapsAtLeast waits until Gap has been called at least once more than in
// before for every channel.
func gapsAtLeast(t *testing.T, rec *recorder, channels []string, before []int) {
	t.Helper()
	eventually(t, "Gap for every channel", func() (bool, string) {
		now := rec.gapsOf(channels)
		for i := range channels {
			if now[i] <= before[i] {
				return false, "no Gap yet for " + channels[i]
			}
		}
		return true, ""
	})
}
