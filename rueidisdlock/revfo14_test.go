package rueidisdlock

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/driver"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/wire"
	"github.com/redis/rueidis"
)

// stallingClient is a real rueidis client whose Nodes, once armed, stalls
// after it has read the primary, until release is closed: the look (see
// watch) of one call that read the primary just before a switch and is
// descheduled before it records what it read, while other calls' looks see
// the switch.
type stallingClient struct {
	rueidis.Client
	armed   atomic.Bool
	stalled chan string // what the stalled Nodes read
	release chan struct{}
}

func (s *stallingClient) Nodes() map[string]rueidis.Client {
	n := s.Client.Nodes()
	if s.armed.CompareAndSwap(true, false) {
		s.stalled <- nodesKey(n)
		<-s.release
	}
	return n
}

func revFo14Wait(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not by the test's deadline", what)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// TestRevFo14StaleLookRecordsOldPrimary: two looks race across a switch.
// One read the primary (P) before SENTINEL FAILOVER made R the primary;
// the looks of later calls record R; then the first records P, which it
// read earlier: the watch now says P while the client sends to R. The next
// switch, back to P (the only other server of a primary and one replica),
// is then invisible to a call sent to R before it: its start mark says P,
// its look after the reply says P, so a reply that rueidis reads from its
// closing connection to R, replaced, is believed. Here R was stopped with
// an acquire queued, failed over to P, and resumed as rueidis moved: it
// grants the acquire, and TryLock must not return a lease that P, the
// primary, does not record (another Client then takes the lock on P: two
// holders).
func TestRevFo14StaleLookRecordsOldPrimary(t *testing.T) {
	r := redistest.StartReplicated(t)
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	newRC := func(name string) rueidis.Client {
		rc, err := rueidis.NewClient(rueidis.ClientOption{
			InitAddress: r.Addrs(),
			Sentinel:    rueidis.SentinelOption{MasterSet: redistest.SentinelMaster},
			ClientName:  name, DisableCache: true,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(rc.Close)
		return rc
	}
	rc := newRC("revfo14-waiter")
	sc := &stallingClient{Client: rc, stalled: make(chan string, 1), release: make(chan struct{})}
	k := newConn(sc)
	waiter := driver.Attach(k, []dlock.Option(nil)).(*dlock.Client)
	defer waiter.Close()
	other, err := New(newRC("revfo14-other"))
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	p, q := r.Primary, r.Replica
	// Lock calls on each Client; the first tells it the server's pub/sub
	// kind. After the failover below they also load the scripts on R, so
	// that an EVALSHA queued there runs.
	warm := func() {
		t.Helper()
		for _, c := range []*dlock.Client{waiter, other} {
			for i := 0; i < 2; i++ {
				l, err := c.Mutex("revfo14-warm", dlock.NoRenew()).TryLock(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if err := l.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	warm()

	// A call answered by P, whose look read P and stalls there.
	sc.armed.Store(true)
	done := make(chan struct{})
	go func() {
		_, _ = k.Do(ctx, []any{"exists", "revfo14-probe"}, true)
		close(done)
	}()
	if got := <-sc.stalled; got != p.Addr() {
		t.Fatalf("the stalled look read %s, want the primary %s", got, p.Addr())
	}
	// P to R; calls on R, whose looks see R.
	r.Failover(t)
	revFo14Wait(t, ctx, "the waiter's client to move to "+q.Addr(), func() bool { return nodesKey(rc.Nodes()) == q.Addr() })
	warm()
	if s := *k.prim.seen.Load(); s != q.Addr() {
		t.Fatalf("after calls on %s the watch saw %s", q.Addr(), s)
	}
	// The stalled look records what it read.
	close(sc.release)
	<-done
	t.Logf("the watch now sees %s; the client sends to %s", *k.prim.seen.Load(), nodesKey(rc.Nodes()))

	// R stopped with an acquire queued; the sentinels fail it over to P.
	const name = "revfo14"
	key := wire.HashKey(wire.DefaultPrefix, name)
	q.Pause()
	resumed := false
	defer func() {
		if !resumed {
			q.Resume()
		}
	}()
	type result struct {
		l   *dlock.Lease
		err error
	}
	got := make(chan result, 1)
	go func() {
		l, err := waiter.Mutex(name, dlock.TTL(time.Minute), dlock.NoRenew()).TryLock(context.Background())
		got <- result{l, err}
	}()
	revFo14Wait(t, ctx, "the sentinels to promote "+p.Addr()+" again", func() bool {
		for _, s := range r.Sentinels {
			a, _ := s.Do(t, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", redistest.SentinelMaster).([]any)
			if len(a) != 2 || fmt.Sprint(a[1]) != fmt.Sprint(p.Port()) {
				return false
			}
		}
		role, _ := p.Do(t, "ROLE").([]any)
		return len(role) > 0 && fmt.Sprint(role[0]) == "master"
	})
	revFo14Wait(t, ctx, "the waiter's client to move back to "+p.Addr(), func() bool { return nodesKey(rc.Nodes()) == p.Addr() })
	q.Resume()
	resumed = true
	q.Do(t, "PING") // answered once it ran what it had queued
	if o, _ := q.Do(t, "HGET", key, wire.FieldOwner).(string); o == "" {
		t.Fatal("the resumed old primary granted no queued acquire: the test does not reproduce the fault")
	}
	var res result
	select {
	case res = <-got:
	case <-ctx.Done():
		t.Fatal("TryLock did not return")
	}
	if res.err != nil {
		t.Fatalf("TryLock: %v, want the lock (free on the primary %s)", res.err, p.Addr())
	}
	defer res.l.Unlock(ctx)
	o, _ := p.Do(t, "HGET", key, wire.FieldOwner).(string)
	if o == res.l.Token() {
		return
	}
	l2, err := other.Mutex(name, dlock.NoRenew()).TryLock(ctx)
	if err == nil {
		defer l2.Unlock(ctx)
		t.Fatalf("two holders: the waiter's lease (%s, granted by the replaced primary %s) and another Client's (%s, on the primary %s)", res.l.Token(), q.Addr(), l2.Token(), p.Addr())
	}
	t.Fatalf("the primary %s has owner %q, not the lease's token %q: the grant came from the replaced primary", p.Addr(), o, res.l.Token())
}
