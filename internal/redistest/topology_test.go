package redistest

import (
	"testing"
)

// A key's slot migrates with its key, and a failover hands the slot to the
// replica with the data.
func TestReplicatedClusterMigrateFailover(t *testing.T) {
	t.Parallel()
	masters, replicas := ReplicatedCluster(t, 3, 1)
	all := append(append([]*Server(nil), masters...), replicas[0][0], replicas[1][0], replicas[2][0])
	rdb := ClusterClient(t, masters)
	if err := rdb.Set(ctx(t), "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	slot := KeySlot(t, masters[0], "k")
	from := -1
	for i, m := range masters {
		if m.Do(t, "CLUSTER", "COUNTKEYSINSLOT", slot) == int64(1) {
			from = i
		}
	}
	if from < 0 {
		t.Fatalf("no master holds slot %d", slot)
	}
	to := (from + 1) % len(masters)
	MigrateSlot(t, all, slot, masters[from], masters[to])
	if v := masters[to].Do(t, "GET", "k"); v != "v" {
		t.Fatalf("after the migration GET k on the target = %#v", v)
	}
	ClusterFailover(t, all, replicas[to][0])
	WaitSlotOwner(t, all, slot, replicas[to][0])
	if v := replicas[to][0].Do(t, "GET", "k"); v != "v" {
		t.Fatalf("after the failover GET k on the promoted replica = %#v", v)
	}
}
