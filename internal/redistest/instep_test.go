package redistest

import (
	"context"
	"testing"
	"time"
)

// TestStartReplicaSecondInStep: StartReplica returns once the replica it
// started acknowledges its primary's writes, also when the primary has a
// replica in step already (whose acknowledgement alone satisfies a WAIT
// for one): a WAIT for both, right after the second StartReplica, is
// answered by both.
func TestStartReplicaSecondInStep(t *testing.T) {
	for round := range 3 {
		p := Start(t)
		StartReplica(t, p, false)
		StartReplica(t, p, false)
		rdb := p.Client(t)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
			t.Fatal(err)
		}
		n, err := rdb.Wait(ctx, 2, 200*time.Millisecond).Result()
		cancel()
		if err != nil || n != 2 {
			t.Fatalf("round %d: WAIT 2 right after the second StartReplica: %d replicas acknowledged (%v), want 2", round, n, err)
		}
	}
}
