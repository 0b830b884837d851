package rueidisdlock_test

import (
	"context"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/wire"
	"github.com/redis/rueidis"
)

// sentinelClient returns a rueidis client of topology R, named name
// (CLIENT SETNAME) on its connections to the primary.
func sentinelClient(t *testing.T, r *redistest.Replicated, name string) rueidis.Client {
	t.Helper()
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

// TestReplacedPrimaryReplyNotTrusted: an acquire is written to a primary
// that is stopped (SIGSTOP) past the holder's TTL, the sentinels promote
// its replica, and the waiter's rueidis client moves to the promoted one;
// then the old primary resumes and runs the acquire it had queued, which
// takes the lock there (the holder expired by its clock), and rueidis,
// still reading the old connection as it closes it, delivers that grant.
// The grant must not be believed: the promoted replica never saw it (and
// the old primary drops it as it replicates the promoted one). TryLock
// must come back with a lease that the promoted replica records. With a
// ctx that cannot end the engine sends the acquire with the driver's Do;
// with one that can, through its batcher (Submit).
func TestReplacedPrimaryReplyNotTrusted(t *testing.T) {
	t.Run("Do", func(t *testing.T) { replacedPrimaryReply(t, context.Background) })
	t.Run("Submit", func(t *testing.T) {
		replacedPrimaryReply(t, func() context.Context {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			t.Cleanup(cancel)
			return ctx
		})
	})
}

func replacedPrimaryReply(t *testing.T, tryCtx func() context.Context) {
	r := redistest.StartReplicated(t)
	holder := newDlock(t, sentinelClient(t, r, "replaced-holder"))
	waiter := newDlock(t, sentinelClient(t, r, "replaced-waiter"))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const name = "replaced"
	key := wire.HashKey(wire.DefaultPrefix, name)
	// Warm up: a Client's first lock call asks which pub/sub the server
	// has, which must not wait on the stopped primary.
	for _, c := range []*dlock.Client{holder, waiter} {
		l, err := c.Mutex("warm", dlock.TTL(time.Minute)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := holder.Mutex(name, dlock.TTL(500*time.Millisecond)).Lock(ctx); err != nil {
		t.Fatal(err)
	}
	old, promoted := r.Primary, r.Replica
	old.Pause()
	t.Cleanup(old.Resume)
	res := resumeReplaced(t, ctx, r, old, promoted, "replaced-waiter", key,
		goTryLock(tryCtx(), waiter.Mutex(name, dlock.TTL(time.Minute))))
	if res.err != nil {
		t.Fatalf("TryLock: %v, want the lock (free on the promoted replica)", res.err)
	}
	defer res.l.Unlock(ctx)
	if o, _ := promoted.Do(t, "HGET", key, wire.FieldOwner).(string); o != res.l.Token() {
		t.Fatalf("the promoted primary has owner %q, not the lease's token %q: the grant came from the replaced primary", o, res.l.Token())
	}
}

// tryResult is what a TryLock returned.
type tryResult struct {
	l   *dlock.Lease
	err error
}

// goTryLock runs m.TryLock(ctx) in a goroutine, which sends its result.
func goTryLock(ctx context.Context, m *dlock.Mutex) <-chan tryResult {
	got := make(chan tryResult, 1)
	go func() {
		l, err := m.TryLock(ctx)
		got <- tryResult{l, err}
	}()
	return got
}

// resumeReplaced ends a failover that a stopped (SIGSTOP) primary, old,
// went through with an acquire of key queued, sent by the TryLock whose
// result comes on got: it waits until the sentinels have promoted
// promoted and the rueidis client named waiter has run a command on it,
// resumes old, fails t unless old then granted the acquire it had queued
// (else the test does not reproduce the fault), and returns what TryLock
// returned.
func resumeReplaced(t *testing.T, ctx context.Context, r *redistest.Replicated, old, promoted *redistest.Server, waiter, key string, got <-chan tryResult) tryResult {
	t.Helper()
	redistest.WaitUntil(t, ctx, "the sentinels to promote "+promoted.Addr(), func() bool {
		return r.NamedPrimary(t, promoted)
	})
	redistest.WaitUntil(t, ctx, "the client "+waiter+" to follow "+promoted.Addr(), func() bool {
		list, _ := promoted.Do(t, "CLIENT", "LIST").(string)
		return redistest.RanCommand(list, waiter)
	})
	old.Resume()
	old.Do(t, "PING") // answered once it ran what it had queued
	if o, _ := old.Do(t, "HGET", key, wire.FieldOwner).(string); o == "" {
		t.Fatalf("the resumed old primary %s granted no queued acquire: the test does not reproduce the fault", old.Addr())
	}
	select {
	case res := <-got:
		return res
	case <-ctx.Done():
		t.Fatal("TryLock did not return")
	}
	return tryResult{}
}
