package rueidisdlock

import (
	"testing"

	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/rueidis"
)

// TestWatchCost: only a Sentinel client is watched, and a call's check
// (a look before the send, another after the reply) costs the allocations
// of rueidis's Nodes alone (three each), none of its own.
func TestWatchCost(t *testing.T) {
	r := redistest.StartReplicated(t)
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: r.Addrs(), Sentinel: rueidis.SentinelOption{MasterSet: redistest.SentinelMaster}, DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	single, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{r.Primary.Addr()}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		t.Fatal(err)
	}
	defer single.Close()
	if newWatch(single) != nil {
		t.Fatal("a single-server client is watched")
	}
	w := newWatch(rc)
	if w == nil {
		t.Fatal("a Sentinel client is not watched")
	}
	m := w.start()
	if m.addr != r.Primary.Addr() {
		t.Fatalf("the watch saw primary %q, want %s", m.addr, r.Primary.Addr())
	}
	if w.moved(m) {
		t.Fatal("moved with no failover")
	}
	allocs := testing.AllocsPerRun(200, func() {
		if w.moved(w.start()) {
			t.Error("moved with no failover")
		}
	})
	if allocs > 6 {
		t.Errorf("a call's check: %v allocations, want at most 6 (Nodes', twice)", allocs)
	}
}
