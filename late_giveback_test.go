package dlock_test

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faults"
	"github.com/dlock-go/dlock/internal/redistest"
)

// TestLateGrantGiveBackInDoubt: a Lock's first acquire is granted but its
// reply comes past the lease's validity (fault 3) while the key still lives
// at Redis (the last 1% of the TTL, which validUntil keeps for clock
// drift), so the engine gives the lock back: fair_leave finds it the
// token's, and the release it then sends is answered to nobody and run
// late (script names the give-back's step whose outcome is lost). A retry
// with the same token would find the lock still the token's ("already")
// and be granted; the late release then frees it under the live lease, and
// another Client takes it. Lock must not go on with a token that a
// give-back of unknown outcome may still release.
//
// With fair_leave itself run late, nothing is released late (fair_leave
// only leaves the line and reports a hand-over; the release is the
// caller's next step, which never runs): the same check must hold.
func TestLateGrantGiveBackInDoubt(t *testing.T) {
	for _, script := range []string{"release", "fair_leave"} {
		t.Run(script, func(t *testing.T) {
			// The reply comes at 3.97s of a 4s TTL: past validUntil (3.96s),
			// before the key expires at Redis (4s after it ran).
			const ttl, delay, late = 4 * time.Second, 3970 * time.Millisecond, 400 * time.Millisecond
			s := redistest.Start(t)
			c, in := reviewClient(t, s, 5*time.Second, nil,
				faults.Rule{Script: "acquire", Via: faults.Single, Kind: faults.DelayReply, Calls: []int{1}, Min: delay, Max: delay},
				faults.Rule{Script: script, Kind: faults.RunLate, Calls: []int{1}, Min: late, Max: late})
			cs, _ := newClients(t, s, 1)
			y := cs[0]
			ctx := ctxT(t, 30*time.Second)
			const name = "lategive"
			l, err := c.Mutex(name, dlock.TTL(ttl)).Lock(ctx)
			if n := in.Stats()["acquire delay-reply single"]; n != 1 {
				t.Fatalf("%d acquire replies delayed, want 1: %s", n, in.Summary())
			}
			if err != nil {
				t.Logf("Lock: %v", err) // refusing is safe
				return
			}
			defer func() { _ = l.Unlock(ctx) }()
			in.WaitLate() // the late give-back step has run at Redis
			other, err := y.Mutex(name, dlock.TTL(ttl)).TryLock(ctx)
			if err != nil {
				t.Logf("Lock obtained (fence %d); another Client's TryLock: %v", l.Fence(), err)
				return // still ours: safe
			}
			defer func() { _ = other.Unlock(ctx) }()
			if l.Context().Err() == nil && time.Now().Before(dlock.Deadline(l)) {
				t.Fatalf("double grant: another Client took %s while the lease is valid until %v (%v from now); faults: %s",
					name, dlock.Deadline(l).Format(time.StampMilli), time.Until(dlock.Deadline(l)).Round(time.Millisecond), in.Summary())
			}
		})
	}
}
