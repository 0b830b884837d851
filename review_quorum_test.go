package dlock_test

// Review of quorum mode (NewQuorum): each test reproduces one defect on real
// redis-server processes and failed on the code it was written against
// (eae0504). The interleaving is in each test's comment.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faults"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/wire"
	"github.com/redis/go-redis/v9"
)

// faultyMaster returns a go-redis client of s whose script calls get the
// faults of rules, with every script loaded on s first (so that a fault
// never meets NOSCRIPT instead of the script's work).
func faultyMaster(t *testing.T, s *redistest.Server, rules ...faults.Rule) (*redis.Client, *faults.Injector) {
	t.Helper()
	for _, sc := range wire.Scripts() {
		s.Do(t, "script", "load", sc.Src)
	}
	in := faults.New(faults.Config{Scripts: engineScripts(t), Rules: rules, MaxDelay: 5 * time.Second})
	rdb := s.Client(t)
	rdb.AddHook(in)
	return rdb, in
}

// holdersOf counts the masters on which token owns the mutex name.
func holdersOf(t *testing.T, servers []*redistest.Server, name, token string) int {
	t.Helper()
	n := 0
	for _, s := range servers {
		if s.Do(t, "hget", "dlock:{"+name+"}", "o") == token {
			n++
		}
	}
	return n
}

// noSecondGrant tries other's TryLock of name for a while and fails the test
// if it obtains the lock while l is still believed valid (two leases at
// once), or if the attempts err.
func noSecondGrant(t *testing.T, ctx context.Context, other *dlock.Client, name string, l *dlock.Lease, servers []*redistest.Server, d time.Duration) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end) && stillValid(l); time.Sleep(50 * time.Millisecond) {
		l2, err := other.Mutex(name).TryLock(ctx)
		if err == nil {
			held := holdersOf(t, servers, name, l.Token())
			valid := stillValid(l)
			_ = l2.Unlock(ctx)
			if valid {
				t.Fatalf("double grant: a second lease (fence %d) was granted while the first (fence %d) is believed valid; the first holds %d of %d masters",
					l2.Fence(), l.Fence(), held, len(servers))
			}
			return
		}
		if !errors.Is(err, dlock.ErrNotObtained) {
			t.Fatalf("TryLock: %v", err)
		}
	}
}

// TestReviewQuorumRetryKeepsItsGrant: a Lock used one token for all its
// attempts. Attempt 1 is granted on master A but its reply comes after the
// per-master timeout (B failed, C is down: no majority); it is given back,
// and A's late reply schedules one more give-back by token. Attempt 2, with
// the same token, wins A and B. The late give-back then releases A under
// the holder's feet: it holds B alone, and another Client takes A and C
// while the first lease is believed valid.
func TestReviewQuorumRetryKeepsItsGrant(t *testing.T) {
	ctx := ctxT(t, 30*time.Second)
	servers, rdbs := quorumMasters(t, 3)
	a, _ := faultyMaster(t, servers[0], faults.Rule{Script: "quorum_acquire", Kind: faults.DelayReply, Calls: []int{1}, Min: 2500 * time.Millisecond, Max: 2500 * time.Millisecond})
	b, _ := faultyMaster(t, servers[1], faults.Rule{Script: "quorum_acquire", Kind: faults.FailSend, Calls: []int{1}})
	view := deadMasters(t, []redis.UniversalClient{a, b, rdbs[2]}, 2)
	first := newQuorum(t, view, dlock.WithNodeTimeout(100*time.Millisecond))
	l, err := first.Mutex("retried", dlock.TTL(10*time.Second)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := holdersOf(t, servers, "retried", l.Token()); n < 2 {
		t.Fatalf("the lease holds %d of 3 masters as Lock returns", n)
	}
	other := newQuorum(t, deadMasters(t, rdbs, 1)) // A and C
	noSecondGrant(t, ctx, other, "retried", l, servers, 4*time.Second)
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}
