package dlock_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// TestRevFo14FirstCallAfterFailover: a Client made on topology R and first
// used after a failover (made at start, first locked later). Its first
// lock call asks the server which pub/sub it has; over rueidis, a call
// sent after a switch that no look had seen comes back as an unknown
// outcome (rueidisdlock's watch), which must be asked again, as go-redis
// resends the probe on its own after a failed connection: TryLock and
// TryAcquire must get the free lock and permit, not an error.
func TestRevFo14FirstCallAfterFailover(t *testing.T) {
	r := redistest.StartReplicated(t)
	ctx := ctxT(t, 60*time.Second)
	rdb := redistest.NewFailoverClient(&redis.FailoverOptions{
		MasterName: redistest.SentinelMaster, SentinelAddrs: r.Addrs(), ClientName: "revfo14-first",
	})
	t.Cleanup(func() { _ = rdb.Close() })
	c := newDlock(t, rdb)
	defer c.Close()
	r.Failover(t)
	// The client follows the promoted replica (go-redis once it dials;
	// rueidis on the sentinels' message).
	if onRueidis() {
		waitWithin(t, ctx, failoverBound, "the client to follow the promoted replica", func() bool {
			list, _ := r.Primary.Do(t, "CLIENT", "LIST").(string)
			return redistest.RanCommand(list, "revfo14-first")
		})
	}
	l, err := c.Mutex("revfo14-first").TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock, the Client's first call, after a failover: %v", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := c.Semaphore("revfo14-first-sem", 2).TryAcquire(ctx, 1)
	if err != nil {
		t.Fatalf("TryAcquire after a failover: %v", err)
	}
	if err := s.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRevFo14AckedFirstCallAfterFailover: the same with WithReplicaAck, on
// a Client that made its first call before the failover: its first
// TryLock after it, whose acquire and WAIT go in one round trip, must get
// the free lock (acknowledged by the old primary, now a replica), not an
// error; so must its first Extend of a lease held across the failover.
func TestRevFo14AckedFirstCallAfterFailover(t *testing.T) {
	for _, first := range []string{"TryLock", "Extend"} {
		t.Run(first, func(t *testing.T) {
			t.Parallel() // each waits for a failover of a topology of its own
			r := redistest.StartReplicated(t)
			ctx := ctxT(t, 60*time.Second)
			rdb := redistest.NewFailoverClient(&redis.FailoverOptions{
				MasterName: redistest.SentinelMaster, SentinelAddrs: r.Addrs(), ClientName: "revfo14-acked",
			})
			t.Cleanup(func() { _ = rdb.Close() })
			c := newDlock(t, rdb, dlock.WithReplicaAck(1, time.Second))
			defer c.Close()
			held, err := c.Mutex("revfo14-held", dlock.TTL(time.Minute), dlock.NoRenew()).TryLock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer held.Unlock(ctx)
			r.Failover(t)
			waitWithin(t, ctx, failoverBound, "the old primary to replicate the promoted one", func() bool {
				n, _ := r.Primary.Do(t, "WAIT", 1, 100).(int64)
				return n >= 1
			})
			if onRueidis() {
				waitWithin(t, ctx, failoverBound, "the client to follow the promoted replica", func() bool {
					list, _ := r.Primary.Do(t, "CLIENT", "LIST").(string)
					return redistest.RanCommand(list, "revfo14-acked")
				})
			}
			switch first {
			case "TryLock":
				l, err := c.Mutex("revfo14-acked").TryLock(ctx)
				if err != nil {
					t.Fatalf("TryLock, the first call after a failover, with WithReplicaAck: %v", err)
				}
				if err := l.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
			case "Extend":
				if err := held.Extend(ctx, time.Minute); err != nil {
					t.Fatalf("Extend, the first call after a failover, with WithReplicaAck: %v", err)
				}
			}
		})
	}
}
