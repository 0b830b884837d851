package dlock_test

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faults"
	"github.com/dlock-go/dlock/internal/redistest"
)

// TestMultiLockWaitedPartDoubtsLateGroupAcquire: a MultiLock's first
// multi_acquire of its group times out and runs late (800 ms later, TTL
// 500 ms); the retry, with the same token, finds b held by X, and the
// MultiLock waits for b, is handed it when X unlocks, takes the rest and
// returns. The caller extends the lease to 10 s. Then the late acquire
// runs: every name is the token's, so it sets their TTL back to 500 ms,
// and another Client takes b when it expires. The holding of b that the
// wait made must know that acquire may yet run (acqDoubt), so that it is
// never believed valid past that expiry. (Of [a, b] the part a, taken by a
// group acquire after the wait, doubts it anyway and ends the lease's
// Context: b's own holding is asked. Of [b] the lease itself is.)
func TestMultiLockWaitedPartDoubtsLateGroupAcquire(t *testing.T) {
	for _, names := range [][]string{{"wdoubt/b"}, {"wdoubt/a", "wdoubt/b"}} {
		t.Run(map[int]string{1: "b", 2: "a,b"}[len(names)], func(t *testing.T) {
			const ttl, late = 500 * time.Millisecond, 800 * time.Millisecond
			s := redistest.Start(t)
			c, in := reviewClient(t, s, 2*time.Second, nil, faults.Rule{Script: "multi_acquire", Kind: faults.RunLate, Calls: []int{1}, Min: late, Max: late})
			cs, rdb := newClients(t, s, 2)
			x, y := cs[0], cs[1]
			ctx := ctxT(t, 20*time.Second)
			const b = "wdoubt/b"
			lb, err := x.Mutex(b).Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got := async(t, ctx, c.MultiLock(names, dlock.TTL(ttl), dlock.NoRenew()).Lock)
			waitLine(t, ctx, rdb, "dlock:{"+b+"}", 1)
			if err := lb.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			l, err := got()
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = l.Unlock(ctx) }()
			lctx := l.Context()
			if n := in.Stats()["multi_acquire run-late single"]; n != 1 {
				t.Fatalf("%d group acquires run late, want 1: %s", n, in.Summary())
			}
			if err := l.Extend(ctx, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			in.WaitLate() // the first acquire has run, setting the TTL back to 500 ms
			var other *dlock.Lease
			waitWithin(t, ctx, ttl+time.Second, "another Client taking "+b+" once the late acquire's TTL ran out", func() bool {
				other, err = y.Mutex(b).TryLock(ctx)
				return err == nil
			})
			defer func() { _ = other.Unlock(ctx) }()
			part := dlock.PartOf(l, b)
			if part.Context().Err() == nil || time.Until(dlock.Deadline(part)) > 0 {
				t.Errorf("%s is held by another Client (fence %d), but the MultiLock's holding of it believes itself valid for %v more: %s",
					b, other.Fence(), time.Until(dlock.Deadline(part)).Round(time.Millisecond), dlock.Describe(part))
			}
			if len(names) == 1 && lctx.Err() == nil {
				t.Errorf("the MultiLock lease of %s is live while another Client holds it", b)
			}
		})
	}
}
