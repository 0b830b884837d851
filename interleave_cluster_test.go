package dlock_test

// The Cluster topology of TestInterleavings (interleave_test.go): three
// masters without replicas, each Client of the run a dlock Client over a
// ClusterClient of its own whose node connections get the run's faults,
// the run's names in slots of more than one master, and chaos of its own:
// a master paused (CLIENT PAUSE, far below the node timeout: nothing fails
// over), its pub/sub connections killed, a slot of the run migrated to
// another master and, now and then, back.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/wire"
)

// TestInterleavingsCluster is TestInterleavings on a Redis Cluster of three
// masters, no replicas: every Client is a dlock Client over a ClusterClient
// (a rueidis one under DLOCK_DRIVER=rueidis) with the run's seeded faults
// on its connections to every node, subscriptions included. A
// single-name run's lock lives on the second or third master, drawn from
// the seed; a MultiLock run's pool of four names spans two slots on two
// masters, so that its calls take each slot's names with a script of
// their own. Besides the chaos of TestInterleavings (Clients closed and
// replaced), a master stops serving clients for up to a third of a second
// (CLIENT PAUSE, far below the node timeout: no failover, which a Cluster
// without replica acknowledgement cannot survive, see Limits), the pub/sub
// connections of some masters are killed, and a slot of the run is
// migrated to another master (as redis-cli --cluster reshard does), and
// sometimes back, while its lock is held, waited for and released. Every
// check of TestInterleavings applies, Redis read where the slot is served
// at the time; once every caller returned, the lock must be free there
// within one TTL, and no key of the run's slots may be left on a master
// that no longer serves them. (Over rueidis the subscription faults leave
// out the server-side unsubscribe, which rueidis cannot take on a Cluster:
// see injector. The migrations make the server's own.)
//
// make test runs four of the primitives, drawn at random, for 2 s each,
// two over each driver; DLOCK_CHAOS_ROUNDS (make chaos) or DLOCK_SEED runs
// them all, DLOCK_CHAOS sets the duration, and a failure prints the
// command that replays it.
func TestInterleavingsCluster(t *testing.T) {
	interleavings(t, "TestInterleavingsCluster", ilCluster, clusterKinds(), "")
}

const (
	ilClusterMasters = 3
	// ilClusterDur is the default length of a Cluster run (DLOCK_CHAOS
	// sets it): a Cluster takes a second or two to start.
	ilClusterDur = 2 * time.Second
	// ilClusterShare is how many primitives make test's Cluster runs
	// lock, drawn at random (half over each driver).
	ilClusterShare = 4
	// ilMigrations bounds the slot migrations of a run (a migration back
	// counts as one).
	ilMigrations = 6
)

// clusterKinds returns the primitives a Cluster run may lock:
// ilClusterShare of them drawn at random, which interleavings shares out
// as it does every run's (see passShare): in make test, whose two passes
// draw the same ones (from DLOCK_SPLIT), half over each driver; all of
// them with DLOCK_CHAOS_ROUNDS (make chaos) or DLOCK_SEED (a replay).
func clusterKinds() []string {
	kinds := slices.Clone(ilKinds)
	if os.Getenv("DLOCK_CHAOS_ROUNDS") != "" || os.Getenv("DLOCK_SEED") != "" {
		return kinds
	}
	r := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	if split, ok := envSplit(); ok {
		r = rand.New(rand.NewPCG(split, uint64(ilCluster)))
	}
	r.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	return kinds[:ilClusterShare]
}

// ilSlot is a slot the run's names live in, and the master that serves it
// now (an index of w.masters; only the chaos moves it).
type ilSlot struct {
	slot, owner int
}

// startCluster starts the Cluster of a run, a plain client of each master
// and a plain ClusterClient, and names the run's locks: a single name whose
// slot is on master 1 or 2 (drawn from the seed), or a MultiLock pool of
// two names in a slot of that master and two in a slot of another.
func (w *interleaving) startCluster() {
	t := w.t
	w.masters = redistest.Cluster(t, ilClusterMasters)
	for _, s := range w.masters {
		w.plains = append(w.plains, s.Client(t))
	}
	w.cplain = redistest.ClusterClient(t, w.masters)
	home := 1 + int(w.seed%2)
	if w.kind != "multi" {
		name := func(tag string) string { return fmt.Sprintf("il,%s {%s}:\n\xff", w.kind, tag) }
		w.name = name(w.tagOn(home, name))
		w.pool = []string{w.name}
	} else {
		other := (home + 1) % ilClusterMasters
		pool := func(tag string) string { return fmt.Sprintf("il,multi {%s}:1", tag) }
		a, b := w.tagOn(home, pool), w.tagOn(other, pool)
		w.pool = []string{"il,multi {" + a + "}:1", "il,multi {" + a + "}:2\n\xff", "il,multi {" + b + "}:1", "il,multi {" + b + "}:2 \xff"}
		w.name = w.pool[0]
	}
	seen := map[int]bool{}
	for _, name := range w.pool {
		slot := int(wire.Slot(w.hashOf(name)))
		if !seen[slot] {
			seen[slot] = true
			w.cslots = append(w.cslots, &ilSlot{slot: slot, owner: initialOwner(slot)})
		}
	}
	for _, s := range w.cslots {
		t.Logf("slot %d on master %d (%s)", s.slot, s.owner, w.masters[s.owner].Addr())
	}
}

// tagOn returns the first of a few short tags whose name (as name makes
// it) has its keys on master i.
func (w *interleaving) tagOn(i int, name func(tag string) string) string {
	const letters = "xyzabcdefghijklmnopqrstuvw"
	for n := range 26 * 27 {
		tag := letters[n%26 : n%26+1]
		if n >= 26 {
			tag += letters[n/26-1 : n/26]
		}
		if initialOwner(int(wire.Slot(w.hashOf(name(tag))))) == i {
			return tag
		}
	}
	w.t.Fatalf("no tag puts %q on master %d", name("?"), i)
	return ""
}

// initialOwner is the master that redistest.Cluster gives slot: the
// slots are split evenly in order.
func initialOwner(slot int) int {
	for i := ilClusterMasters - 1; i > 0; i-- {
		if slot >= i*16384/ilClusterMasters {
			return i
		}
	}
	return 0
}

// pauseMaster stops a master from serving clients for d (CLIENT PAUSE
// ALL): half the time the one that serves a slot of the run, else any.
// The cluster bus goes on, and d is far below the node timeout (2 s):
// nobody takes the master for failed.
func (w *interleaving) pauseMaster(r *rand.Rand, d time.Duration) {
	i := r.IntN(len(w.masters))
	if r.IntN(2) == 0 {
		w.mu.Lock()
		i = w.cslots[r.IntN(len(w.cslots))].owner
		w.mu.Unlock()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := w.plains[i].Do(ctx, "CLIENT", "PAUSE", d.Milliseconds(), "ALL").Err(); err != nil {
		w.t.Logf("CLIENT PAUSE: %v", err)
		return
	}
	time.Sleep(d)
	w.count("pause master")
}

// migrate moves a slot of the run to another master, and half the time,
// a little later (before stop), back to the master it left; at most
// ilMigrations times a run.
func (w *interleaving) migrate(r *rand.Rand, stop <-chan struct{}) {
	w.mu.Lock()
	if w.ops["migrate"]+w.ops["migrate back"] >= ilMigrations {
		w.mu.Unlock()
		return
	}
	s := w.cslots[r.IntN(len(w.cslots))]
	from := s.owner
	w.mu.Unlock()
	to := (from + 1 + r.IntN(len(w.masters)-1)) % len(w.masters)
	w.moveSlot(s, to)
	w.count("migrate")
	if r.IntN(2) == 0 {
		return
	}
	select {
	case <-stop:
		return
	case <-time.After(time.Duration(20+r.IntN(500)) * time.Millisecond):
	}
	w.moveSlot(s, from)
	w.count("migrate back")
}

// moveSlot migrates s to master to (see redistest.MigrateSlot).
func (w *interleaving) moveSlot(s *ilSlot, to int) {
	redistest.MigrateSlot(w.t, w.masters, s.slot, w.masters[s.owner], w.masters[to])
	w.mu.Lock()
	s.owner = to
	w.mu.Unlock()
}

// checkNoStrayKeys checks that no master that does not serve a slot of
// the run holds a key of it: a migration moved every key it had.
func (w *interleaving) checkNoStrayKeys(ctx context.Context) {
	for _, s := range w.cslots {
		for i, plain := range w.plains {
			if i == s.owner {
				continue
			}
			n, err := plain.ClusterCountKeysInSlot(ctx, s.slot).Result()
			if err != nil {
				w.t.Error(err)
				continue
			}
			if n != 0 {
				w.mu.Lock()
				w.failf("master %d, which does not serve slot %d (master %d does), holds %d keys of it", i, s.slot, s.owner, n)
				w.mu.Unlock()
			}
		}
	}
}
