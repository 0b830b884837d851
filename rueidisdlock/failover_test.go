package rueidisdlock_test

import (
	"context"
	"fmt"
	"strings"
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
	resumed := false
	defer func() {
		if !resumed {
			old.Resume()
		}
	}()
	type result struct {
		l   *dlock.Lease
		err error
	}
	got := make(chan result, 1)
	tctx := tryCtx()
	go func() {
		l, err := waiter.Mutex(name, dlock.TTL(time.Minute)).TryLock(tctx)
		got <- result{l, err}
	}()
	waitUntil(t, ctx, "the sentinels to promote the replica", func() bool {
		for _, s := range r.Sentinels {
			a, _ := s.Do(t, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", redistest.SentinelMaster).([]any)
			if len(a) != 2 || fmt.Sprint(a[1]) != fmt.Sprint(promoted.Port()) {
				return false
			}
		}
		role, _ := promoted.Do(t, "ROLE").([]any)
		return len(role) > 0 && fmt.Sprint(role[0]) == "master"
	})
	waitUntil(t, ctx, "the waiter's client to move to the promoted replica", func() bool {
		list, _ := promoted.Do(t, "CLIENT", "LIST").(string)
		return ranCommand(list, "replaced-waiter")
	})
	old.Resume()
	resumed = true
	old.Do(t, "PING") // answered once it ran what it had queued
	if o, _ := old.Do(t, "HGET", key, wire.FieldOwner).(string); o == "" {
		t.Fatal("the resumed old primary granted no queued acquire: the test does not reproduce the fault")
	}
	var res result
	select {
	case res = <-got:
	case <-ctx.Done():
		t.Fatal("TryLock did not return")
	}
	if res.err != nil {
		t.Fatalf("TryLock: %v, want the lock (free on the promoted replica)", res.err)
	}
	defer res.l.Unlock(ctx)
	if o, _ := promoted.Do(t, "HGET", key, wire.FieldOwner).(string); o != res.l.Token() {
		t.Fatalf("the promoted primary has owner %q, not the lease's token %q: the grant came from the replaced primary", o, res.l.Token())
	}
}

// ranCommand reports whether CLIENT LIST (list) shows a connection named
// name that ran a command past its handshake: rueidis asks a new primary
// for its ROLE and moves to it a moment after the answer. (A connection
// still in its handshake does not show that: rueidis could yet read the
// old primary's replies before it moves, as any client that has not heard
// of the switch would, fault 6.)
func ranCommand(list, name string) bool {
	for _, line := range strings.Split(list, "\n") {
		if !strings.Contains(line, " name="+name+" ") {
			continue
		}
		_, cmd, _ := strings.Cut(line, " cmd=")
		cmd, _, _ = strings.Cut(cmd, " ")
		switch cmd {
		case "", "NULL", "hello", "auth", "select", "info", "client|setname", "client|setinfo":
		default:
			return true
		}
	}
	return false
}
