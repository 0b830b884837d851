package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faultproxy"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/wire"
)

// fault5Topology is where fault 5 of shared/SAFETY.md is played: R (a
// primary, its replica and sentinels) or C (a cluster, one replica per
// master), each with its replication links through fault proxies.
type fault5Topology interface {
	// client returns a new go-redis client of the topology, closed when
	// the test ends.
	client(t *testing.T) redis.UniversalClient
	// link returns the proxy on the replication link from the primary
	// that serves key to its replica.
	link(t *testing.T, key string) *faultproxy.Proxy
	// exists returns EXISTS key on the primary that serves key and on its
	// replica.
	exists(t *testing.T, key string) (onPrimary, onReplica int64)
	// crash kills the primary that serves key with SIGKILL and waits
	// until its replica is promoted by the topology itself (Sentinel, the
	// cluster); it returns how long that took from the kill.
	crash(t *testing.T, key string) time.Duration
	// rejoin brings the server crash killed back as a replica of the
	// promoted one, through a released link.
	rejoin(t *testing.T)
}

// sentinelFault5 is fault5Topology on R.
type sentinelFault5 struct{ r *redistest.Replicated }

func (s sentinelFault5) client(t *testing.T) redis.UniversalClient { return s.r.Client(t) }

func (s sentinelFault5) link(*testing.T, string) *faultproxy.Proxy { return s.r.Link }

func (s sentinelFault5) exists(t *testing.T, key string) (int64, int64) {
	return s.r.Primary.Do(t, "EXISTS", key).(int64), s.r.Replica.Do(t, "EXISTS", key).(int64)
}

func (s sentinelFault5) crash(t *testing.T, _ string) time.Duration { return s.r.CrashPrimary(t) }

func (s sentinelFault5) rejoin(t *testing.T) { s.r.Rejoin(t) }

// clusterFault5 is fault5Topology on C.
type clusterFault5 struct {
	c      *redistest.LinkedCluster
	killed *redistest.Server
}

func (c *clusterFault5) client(t *testing.T) redis.UniversalClient { return c.c.Client(t) }

func (c *clusterFault5) link(t *testing.T, key string) *faultproxy.Proxy {
	return c.c.Link(c.c.MasterOf(t, key))
}

func (c *clusterFault5) exists(t *testing.T, key string) (int64, int64) {
	ctx := ctxT(t, 10*time.Second)
	m := c.c.MasterOf(t, key)
	rs := c.c.ReplicasOf(t, m)
	if len(rs) != 1 {
		t.Fatalf("the master of %s has %d replicas, want 1", key, len(rs))
	}
	return m.Do(t, "EXISTS", key).(int64), rs[0].Client(t, readOnly).Exists(ctx, key).Val()
}

func (c *clusterFault5) crash(t *testing.T, key string) time.Duration {
	c.killed = c.c.MasterOf(t, key)
	_, took := c.c.CrashMaster(t, c.killed)
	return took
}

func (c *clusterFault5) rejoin(t *testing.T) { c.c.Rejoin(t, c.killed) }

// TestFault5DoubleGrantWithoutReplicaAck reproduces fault 5 of
// shared/SAFETY.md on topology R: the primary dies after a grant it never
// sent to its replica, the sentinels promote the replica, and a second
// Client is granted the same lock while the first lease still believes it
// is valid (see fault5DoubleGrant).
func TestFault5DoubleGrantWithoutReplicaAck(t *testing.T) {
	fault5DoubleGrant(t, sentinelFault5{redistest.StartReplicatedVia(t)})
}

// TestFault5ClusterDoubleGrantWithoutReplicaAck is
// TestFault5DoubleGrantWithoutReplicaAck on topology C: the master that
// serves the lock's slot dies after a grant it never sent to its replica,
// and the cluster promotes the replica (its other masters vote for it).
func TestFault5ClusterDoubleGrantWithoutReplicaAck(t *testing.T) {
	fault5DoubleGrant(t, &clusterFault5{c: redistest.StartLinkedCluster(t, 3, 1)})
}

// fault5DoubleGrant reproduces fault 5 on topo: the double grant that is
// the documented limit without replica acknowledgement (Redis replicates
// asynchronously and the lock was granted without waiting for a replica);
// with WithReplicaAck the first grant fails closed instead
// (fault5WithReplicaAck).
//
// It is made deterministic, not a race: the replication link is held (a
// proxy keeps the primary's stream from the replica, losing nothing,
// connections open) before the first grant, so the replica never has the
// lock key. The first lease has a 30s TTL with the watchdog on: it stays
// believed valid until its first renewal, due a third of the TTL after the
// grant, reaches the promoted replica and finds the key gone. A renewal
// hook keeps that first renewal from being sent before the second grant, in
// case the failover takes longer than that third; in the usual run the
// second grant comes first and the hook does not wait.
func fault5DoubleGrant(t *testing.T, topo fault5Topology) {
	const ttl = 30 * time.Second
	const name = "fault5"
	ctx := ctxT(t, 60*time.Second)
	first := newDlock(t, topo.client(t))
	t.Cleanup(func() { _ = first.Close() })
	second := newDlock(t, topo.client(t))
	t.Cleanup(func() { _ = second.Close() })

	granted := make(chan struct{}) // closed at the second grant
	var hooked atomic.Bool
	var hookWaited atomic.Int64 // how long the first renewal waited
	dlock.SetRenewalHook(first, func(*dlock.Lease) {
		start := time.Now()
		select {
		case <-granted:
		case <-time.After(25 * time.Second): // bounded; the test fails by then
		}
		if hooked.CompareAndSwap(false, true) {
			hookWaited.Store(int64(time.Since(start)))
		}
	})

	key := wire.HashKey(wire.DefaultPrefix, name)
	topo.link(t, key).Hold(faultproxy.Downstream)
	l1, err := first.Mutex(name, dlock.TTL(ttl)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	grant1 := time.Now()
	onPrimary, onReplica := topo.exists(t, key)
	if onPrimary != 1 {
		t.Fatalf("EXISTS %s on the primary = %v after the grant", key, onPrimary)
	}
	if onReplica != 0 {
		t.Fatalf("EXISTS %s on the replica = %v: the held link let the grant through", key, onReplica)
	}

	promotion := topo.crash(t, key) // SIGKILL; the topology promotes the replica on its own
	t.Logf("the replica was promoted %v after the kill", promotion.Round(time.Millisecond))

	// The client finds the new primary; until it does, attempts fail with
	// connection errors. An ErrNotObtained would mean the grant survived:
	// no double grant.
	var l2 *dlock.Lease
	deadline := time.Now().Add(20 * time.Second)
	for {
		l2, err = second.Mutex(name, dlock.TTL(ttl)).TryLock(ctx)
		if err == nil {
			break
		}
		if errors.Is(err, dlock.ErrNotObtained) {
			t.Fatalf("the promoted replica refused the second grant: %v (the first grant reached it)", err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no second grant 20s after the promotion: %v", err)
		}
		time.Sleep(50 * time.Millisecond) // retry; the 20s bound is what matters
	}
	grant2 := time.Now()
	close(granted)
	dl1 := dlock.Deadline(l1)
	if err := l1.Context().Err(); err != nil {
		t.Fatalf("the first lease had ended (%v) before the second grant: no double grant reproduced", context.Cause(l1.Context()))
	}
	if !dl1.After(grant2) {
		t.Fatalf("the first lease's deadline %v is not after the second grant", dl1.Sub(grant2))
	}
	t.Logf("double grant: the second grant came %v after the first, whose deadline was %v later still; fences %d then %d",
		grant2.Sub(grant1).Round(time.Millisecond), dl1.Sub(grant2).Round(time.Millisecond), l1.Fence(), l2.Fence())

	// How long the first holder goes on believing: until its renewal
	// reaches the new primary (or, failing that, its deadline).
	select {
	case <-l1.Context().Done():
	case <-time.After(time.Until(dl1) + 5*time.Second):
		t.Fatalf("the first lease's context did not end by its deadline: %s", dlock.Describe(l1))
	}
	end1 := time.Now()
	if cause := context.Cause(l1.Context()); !errors.Is(cause, dlock.ErrLockLost) {
		t.Fatalf("the first lease ended with %v, want ErrLockLost", cause)
	}
	t.Logf("the first lease was believed valid for %v after its grant (renewal hook waited %v); both were believed held for %v",
		end1.Sub(grant1).Round(time.Millisecond), time.Duration(hookWaited.Load()).Round(time.Millisecond), end1.Sub(grant2).Round(time.Millisecond))
	if err := l2.Unlock(ctx); err != nil {
		t.Fatalf("the second lease's Unlock: %v", err)
	}
	if err := l1.Unlock(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("the first lease's Unlock = %v, want ErrLockLost", err)
	}
}

// TestFault5WithReplicaAck is fault 5 on topology R with WithReplicaAck
// (see fault5WithReplicaAck).
func TestFault5WithReplicaAck(t *testing.T) {
	fault5WithReplicaAck(t, func() fault5Topology { return sentinelFault5{redistest.StartReplicatedVia(t)} })
}

// TestFault5ClusterWithReplicaAck is fault 5 on topology C with
// WithReplicaAck: each round kills the master that serves the round's
// lock, which the cluster replaces by its replica; the killed master
// rejoins as that replica's replica, through its link, for the next round
// (see fault5WithReplicaAck).
func TestFault5ClusterWithReplicaAck(t *testing.T) {
	fault5WithReplicaAck(t, func() fault5Topology { return &clusterFault5{c: redistest.StartLinkedCluster(t, 3, 1)} })
}

// fault5WithReplicaAck is fault 5 with WithReplicaAck(1, ...) on the
// topology start makes: the replication link is held, at a moment a seed
// draws, before the first Client's Lock, while it is on the wire, or after
// it returned; then the primary is killed, the topology promotes the
// replica, and a second Client takes the lock on it. The first lease, if it
// was granted at all, must have ended (by its own deadline) before the
// second grant was sent: with the link held before the grant, its Lock
// fails with ErrNotReplicated instead of reproducing fault5DoubleGrant's
// double grant. Each round fails the primary over; DLOCK_FAILOVER_ROUNDS
// sets how many (default 3, one of each moment; make chaos runs more),
// DLOCK_SEED replays a run.
func fault5WithReplicaAck(t *testing.T, start func() fault5Topology) {
	// Longer than a promotion takes (a few seconds: the primary is found
	// down after 1s by the sentinels or the cluster, then an election): a
	// lease granted before the cut is still held when the replica is
	// promoted with it.
	const ttl = 5 * time.Second
	rounds, seed, rng := failoverRounds(t, 3, 5)
	topo := start()
	ctx := ctxT(t, time.Duration(rounds)*60*time.Second)
	refused, granted := 0, 0
	for round := range rounds {
		name := fmt.Sprintf("fault5-ack-%d", round)
		link := topo.link(t, wire.HashKey(wire.DefaultPrefix, name))
		first := newDlock(t, topo.client(t), dlock.WithReplicaAck(1, 300*time.Millisecond))
		second := newDlock(t, topo.client(t))
		moment := (round + int(seed%3)) % 3 // each moment once in three rounds
		delay := time.Duration(rng.Int64N(int64(8 * time.Millisecond)))
		held := make(chan struct{})
		switch moment {
		case 0:
			link.Hold(faultproxy.Downstream)
			close(held)
		case 1:
			go func() {
				time.Sleep(delay)
				link.Hold(faultproxy.Downstream)
				close(held)
			}()
		}
		lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		l1, err := first.Mutex(name, dlock.TTL(ttl)).Lock(lctx)
		cancel()
		if moment == 2 {
			link.Hold(faultproxy.Downstream)
			close(held)
		}
		<-held
		outcome := "granted"
		switch {
		case err == nil:
			granted++
		case errors.Is(err, dlock.ErrNotReplicated):
			refused++
			outcome = fmt.Sprintf("refused (%v)", err)
		default:
			t.Fatalf("round %d (moment %d, delay %v): Lock: %v", round, moment, delay, err)
		}
		if moment == 0 && err == nil {
			t.Fatalf("round %d: granted with the replication link held before the Lock", round)
		}

		promotion := topo.crash(t, wire.HashKey(wire.DefaultPrefix, name))
		promoted := time.Now()
		var l2 *dlock.Lease
		var sent2 time.Time
		deadline := time.Now().Add(20 * time.Second)
		for {
			sent2 = time.Now()
			l2, err = second.Mutex(name, dlock.TTL(ttl)).TryLock(ctx)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: no second grant 20s after the promotion: %v", round, err)
			}
			time.Sleep(20 * time.Millisecond) // retry; the 20s bound is what matters
		}
		if l1 != nil {
			if l1.Context().Err() == nil {
				t.Fatalf("round %d (moment %d, delay %v): double grant: the first lease is still believed valid at the second grant (%s)", round, moment, delay, dlock.Describe(l1))
			}
			if d := dlock.Deadline(l1); !d.Before(sent2) {
				t.Fatalf("round %d (moment %d, delay %v): double grant: the first lease was believed valid until %v after the second grant was sent", round, moment, delay, d.Sub(sent2))
			}
		}
		t.Logf("round %d: moment %d (delay %v): first %s; promoted %v after the kill; second grant sent %v after that",
			round, moment, delay, outcome, promotion.Round(time.Millisecond), sent2.Sub(promoted).Round(time.Millisecond))
		_ = l2.Unlock(ctx)
		_ = first.Close()
		_ = second.Close()
		if round < rounds-1 {
			topo.rejoin(t)
		}
	}
	t.Logf("%d rounds: %d refused, %d granted and ended before the second grant", rounds, refused, granted)
}

// failoverRounds reads how many failover rounds a seeded failover test
// runs (DLOCK_FAILOVER_ROUNDS, def if unset) and its seed (DLOCK_SEED, or
// a fresh one), logs how to replay the run, and returns the rounds, the
// seed and a source drawn from it (stream tells tests apart).
func failoverRounds(t *testing.T, def int, stream uint64) (rounds int, seed uint64, rng *rand.Rand) {
	t.Helper()
	rounds = envRounds(t, "DLOCK_FAILOVER_ROUNDS", def)
	seed, replay := envSeed(t)
	if !replay {
		seed = rand.Uint64N(1 << 40)
	}
	t.Logf("seed %d (replay: DLOCK_SEED=%d DLOCK_FAILOVER_ROUNDS=%d go test -race -count=1 -run '^%s$' .)", seed, seed, rounds, t.Name())
	return rounds, seed, rand.New(rand.NewPCG(seed, stream))
}

// TestFault6IsolatedPrimary is fault 6 on topology R: the primary is cut
// off from its replica (both ways of the replication link held) while a
// Client still reaches it. With min-replicas-to-write 1 and
// min-replicas-max-lag 1 on the server, every attempt errors once the
// replica's last acknowledgement is older than the lag bound, and none is
// reported as acquired; with WithReplicaAck every grant fails closed from
// the start, without waiting for the lag bound.
func TestFault6IsolatedPrimary(t *testing.T) {
	r := redistest.StartReplicatedVia(t)
	ctx := ctxT(t, 60*time.Second)
	r.Primary.Do(t, "CONFIG", "SET", "min-replicas-to-write", "1", "min-replicas-max-lag", "1")
	plain := newDlock(t, r.Client(t))
	t.Cleanup(func() { _ = plain.Close() })
	acked := newDlock(t, r.Client(t), dlock.WithReplicaAck(1, 200*time.Millisecond))
	t.Cleanup(func() { _ = acked.Close() })
	l, err := plain.Mutex("before").TryLock(ctx)
	if err != nil {
		t.Fatalf("before the cut: %v", err)
	}
	_ = l.Unlock(ctx)

	r.Link.Hold(faultproxy.Both)
	cut := time.Now()
	if _, err := acked.Mutex("acked").TryLock(ctx); !errors.Is(err, dlock.ErrNotReplicated) {
		t.Fatalf("with WithReplicaAck, right after the cut: %v, want ErrNotReplicated", err)
	}
	// Without it, grants go on until the lag bound, then stop for good.
	var refusedAt time.Time
	for i := 0; ; i++ {
		name := fmt.Sprintf("plain-%d", i)
		l, err := plain.Mutex(name).TryLock(ctx)
		switch {
		case err == nil:
			if !refusedAt.IsZero() {
				t.Fatalf("%s granted %v after the cut, once the server had refused writes", name, time.Since(cut))
			}
			_ = l.Unlock(ctx)
		case errors.Is(err, dlock.ErrNotObtained):
			t.Fatalf("%s: %v: nobody holds it", name, err)
		case !strings.Contains(err.Error(), "NOREPLICAS"):
			t.Fatalf("%s: %v, want the server's NOREPLICAS", name, err)
		case refusedAt.IsZero():
			refusedAt = time.Now()
			t.Logf("writes refused %v after the cut: %v", refusedAt.Sub(cut).Round(time.Millisecond), err)
		}
		if !refusedAt.IsZero() && time.Since(refusedAt) > 2*time.Second {
			break
		}
		if time.Since(cut) > 10*time.Second {
			t.Fatalf("grants still made 10s after the cut, with a lag bound of 1s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.Link.Release(faultproxy.Both)
}
