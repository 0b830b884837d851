package dlock_test

// Review 2 (adversarial read of the engine and of TestInterleavings): each
// test reproduces one defect against a real redis-server and fails on the
// code it was written against (dd7789b). See the test comments for the
// interleaving.

import (
	"context"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faults"
	"github.com/dlock-go/dlock/internal/redistest"
)

// TestReview2ShorterExtendInFlight: Extend to a TTL shorter than what the
// lease has left runs at Redis at once, but its reply is slow. Until the
// reply came, the lease was believed valid on its old deadline, while
// Redis expired it the new TTL after the send and another Client took it:
// two holders believed valid at once (found by TestInterleavings/rw, seed
// 157106698621: a writer's Extend to 106ms with its reply 137ms late, and
// readers let in meanwhile). A request that may shorten the lease must
// bound the deadline from its send on, before any reply.
func TestReview2ShorterExtendInFlight(t *testing.T) {
	for _, kind := range []string{"mutex", "semaphore"} {
		t.Run(kind, func(t *testing.T) {
			s := redistest.Start(t)
			script := "extend"
			if kind == "semaphore" {
				script = "sem.e"
			}
			c, in := faultyClient(t, s, faults.Rule{Script: script, Via: faults.Single, Kind: faults.DelayReply, Calls: []int{1}, Min: 3 * time.Second, Max: 3 * time.Second})
			other, _ := newClient(t, s)
			ctx := ctxT(t, 20*time.Second)
			lock := func(c *dlock.Client) func(context.Context) (*dlock.Lease, error) {
				if kind == "semaphore" {
					return func(ctx context.Context) (*dlock.Lease, error) {
						return c.Semaphore("short-extend", 1, dlock.TTL(5*time.Second)).Acquire(ctx, 1)
					}
				}
				return c.Mutex("short-extend", dlock.TTL(5*time.Second)).Lock
			}
			l, err := lock(c)(ctx)
			if err != nil {
				t.Fatal(err)
			}
			extended := make(chan error, 1)
			go func() { extended <- l.Extend(ctx, 200*time.Millisecond) }()
			if !in.WaitInFlight(2*time.Second, func(k faults.Call) bool { return k.Script == script && k.Has(l.Token()) }) {
				t.Fatal("the Extend was never sent")
			}
			// Redis runs the Extend at once: the lock expires 200ms later and
			// the other Client gets it, long before the Extend's reply.
			o, err := lock(other)(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if in.InFlight(func(k faults.Call) bool { return k.Script == script }) && stillValid(l) {
				t.Errorf("another Client holds the lock while the lease whose Extend to 200ms is in flight is still believed valid")
			}
			_ = o.Unlock(ctx)
			<-extended
			_ = l.Unlock(ctx)
		})
	}
}
