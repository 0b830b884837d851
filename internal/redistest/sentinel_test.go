package redistest

import (
	"strconv"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/faultproxy"
	"github.com/dlock-go/dlock/internal/redisproc"
)

// replicaPorts returns the ports sentinel s lists as replicas of the
// primary.
func replicaPorts(t *testing.T, s *Server) []string {
	t.Helper()
	reps, _ := s.Do(t, "SENTINEL", "REPLICAS", SentinelMaster).([]any)
	var ports []string
	for _, rep := range reps {
		ports = append(ports, fields(rep)["port"])
	}
	return ports
}

// waitKey waits, at most 10s, until s holds key with value want.
func waitKey(t *testing.T, s *Server, key, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.Do(t, "GET", key) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s on %s = %v after 10s, want %q", key, s.Addr(), s.Do(t, "GET", key), want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// With the replication link through a proxy, the sentinels still know the
// replica at its own address; a held link keeps writes from the replica;
// a crashed primary is replaced by the replica without them (fault 5 at
// the data level); and the old primary rejoins as a replica of the new one,
// through a new link.
func TestReplicatedVia(t *testing.T) {
	t.Parallel()
	r := StartReplicatedVia(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(r.Replica.info(ctx(t)))
			t.Log(r.Replica.Log())
			t.Log(r.Primary.Log())
			for _, s := range r.Sentinels {
				t.Log(s.Log())
			}
		}
	})
	if r.Link == nil || r.Link.Target() != r.Primary.Addr() {
		t.Fatalf("Link = %v, want a proxy to the primary %s", r.Link, r.Primary.Addr())
	}
	info := r.Replica.info(ctx(t))
	if got := redisproc.InfoField(info, "master_port"); got != strconv.Itoa(r.Link.Port()) {
		t.Fatalf("the replica replicates from port %s, want the link's %d", got, r.Link.Port())
	}
	for _, s := range r.Sentinels {
		if ports := replicaPorts(t, s); len(ports) != 1 || ports[0] != strconv.Itoa(r.Replica.Port()) {
			t.Fatalf("sentinel %s lists replicas at ports %v, want the replica's own %d (the link is %d)",
				s.Addr(), ports, r.Replica.Port(), r.Link.Port())
		}
	}

	r.Primary.Do(t, "SET", "before", "1")
	waitKey(t, r.Replica, "before", "1")
	r.Link.Hold(faultproxy.Downstream)
	r.Primary.Do(t, "SET", "held", "1")
	time.Sleep(300 * time.Millisecond) // a write on loopback replicates in well under this
	if v := r.Replica.Do(t, "GET", "held"); v != nil {
		t.Fatalf("a write made while the link was held reached the replica: %v", v)
	}

	took := r.CrashPrimary(t)
	t.Logf("promotion %v after the kill", took)
	if v := r.Primary.Do(t, "GET", "before"); v != "1" {
		t.Fatalf("the promoted replica lost a replicated write: before = %v", v)
	}
	if v := r.Primary.Do(t, "GET", "held"); v != nil {
		t.Fatalf("the promoted replica has the write it never received: held = %v", v)
	}
	r.Primary.Do(t, "SET", "after", "1")

	old := r.Link
	r.Rejoin(t)
	if r.Link == old || r.Link.Target() != r.Primary.Addr() {
		t.Fatalf("after Rejoin Link targets %s, want a new proxy to the new primary %s", r.Link.Target(), r.Primary.Addr())
	}
	waitKey(t, r.Replica, "after", "1")
	if v := r.Replica.Do(t, "GET", "held"); v != nil {
		t.Fatalf("the rejoined replica kept a write the new primary never had: held = %v", v)
	}
	for _, s := range r.Sentinels {
		if a, _ := s.Do(t, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SentinelMaster).([]any); len(a) != 2 || a[1] != strconv.Itoa(r.Primary.Port()) {
			t.Fatalf("sentinel %s names %v the primary, want port %d", s.Addr(), a, r.Primary.Port())
		}
	}
}
