package dlock_test

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// aclLogCount is how many refusals a server's ACL LOG has counted (Redis
// groups repeats of one refusal into one entry with a count).
func aclLogCount(t testing.TB, s *redistest.Server) int64 {
	t.Helper()
	var n int64
	entries, _ := s.Do(t, "ACL", "LOG").([]any)
	for _, e := range entries {
		var kv []any
		switch e := e.(type) {
		case []any:
			kv = e
		case map[any]any:
			for k, v := range e {
				kv = append(kv, k, v)
			}
		}
		for i := 0; i+1 < len(kv); i += 2 {
			if fmt.Sprint(kv[i]) == "count" {
				c, _ := kv[i+1].(int64)
				n += c
			}
		}
	}
	return n
}

// One quorum master that refuses the user (here EVALSHA) is one master
// that does not vote, not a reason to give up: the other masters can still
// make a majority. With another master paused for a while, the first
// attempts fall short of a majority; once it answers again, a Lock with a
// ctx far from its end must obtain the lock, as it would if the refusing
// master were merely down. A refusal by a minority of the masters is not
// permanent.
func TestQuorumMinorityRefusalNotPermanent(t *testing.T) {
	masters := redistest.Masters(t, 3)
	full := docACL(t, "dlock", aclPassword)
	setACL(t, without(t, full, "+evalsha"), masters[0])
	setACL(t, full, masters[1], masters[2])
	var rdbs []redis.UniversalClient
	for _, m := range masters {
		rdbs = append(rdbs, m.Client(t, asUser("dlock", aclPassword)))
	}
	q, err := newQuorumOrErr(t, rdbs, dlock.WithRestartDelay(0), dlock.WithNodeTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	ctx := ctxT(t, time.Minute)
	masters[1].Pause()
	resumed := false
	defer func() {
		if !resumed {
			masters[1].Resume()
		}
	}()
	done := make(chan error, 1)
	go func() {
		l, err := q.Mutex("q-minority").Lock(ctx)
		if err == nil {
			err = l.Unlock(ctx)
		}
		done <- err
	}()
	// Two refused attempts show the first one fell short of a majority
	// while masters[1] was paused; then it answers again.
	for aclLogCount(t, masters[0]) < 2 {
		select {
		case err := <-done:
			t.Fatalf("Lock returned while a majority could not answer yet: %v", err)
		case <-ctx.Done():
			t.Fatal("no second attempt")
		case <-time.After(5 * time.Millisecond):
		}
	}
	masters[1].Resume()
	resumed = true
	if err := <-done; err != nil {
		t.Fatalf("Lock, once masters[1] and [2] could grant: %v", err)
	}
}

// On a Cluster too, a user without the channels (or SPUBLISH) is told so
// at its first lock call, as docs/PRODUCTION.md says for every mode but
// quorum, rather than obtaining locks whose releases cannot notify anyone.
func TestACLNoChannelsCluster(t *testing.T) {
	nodes := redistest.Cluster(t, 3)
	full := docACL(t, "dlock", aclPassword)
	for _, c := range []struct{ name, drop, want string }{
		{"no channels", "&dlock:*", "&dlock:*"},
		{"no SPUBLISH", "+spublish", "'spublish'"},
	} {
		t.Run(c.name, func(t *testing.T) {
			setACL(t, without(t, full, c.drop), nodes...)
			rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr()}, Username: "dlock", Password: aclPassword, DisableIdentity: true})
			defer rdb.Close()
			user := newDlock(t, rdb)
			defer user.Close()
			ctx := ctxT(t, 30*time.Second)
			l, err := user.Mutex("acl-cluster").TryLock(ctx)
			if err == nil {
				_ = l.Unlock(ctx)
				t.Fatalf("TryLock obtained the lock, fence %d, for a user refused %s", l.Fence(), c.drop)
			}
			if !strings.Contains(err.Error(), "NOPERM") || !strings.Contains(err.Error(), c.want) {
				t.Errorf("TryLock: %v, want NOPERM naming %s", err, c.want)
			}
		})
	}
}

// Through Sentinel too (a failover client), the documented user can run
// every primitive, with replica acknowledgement, and after a failover to
// the replica, and the servers that hold the locks refuse it nothing.
func TestACLLeastPrivilegeSentinel(t *testing.T) {
	r := redistest.StartReplicated(t)
	setACL(t, docACL(t, "dlock", aclPassword), r.Primary, r.Replica)
	ctx := ctxT(t, 2*time.Minute)
	failover := func() *redis.Client {
		c := redistest.NewFailoverClient(&redis.FailoverOptions{MasterName: redistest.SentinelMaster, SentinelAddrs: r.Addrs(), Username: "dlock", Password: aclPassword, DisableIdentity: true})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	var renewals atomic.Int64
	a := newDlock(t, failover())
	countRenewals(a, &renewals)
	b := newDlock(t, failover())
	everyPrimitive(t, ctx, a, b, &renewals, r.Client(t), func(*dlock.Lease) {})
	acked := newDlock(t, failover(), dlock.WithReplicaAck(1, time.Second))
	l, err := acked.Mutex("acked").Lock(ctx)
	if err != nil {
		t.Fatalf("WithReplicaAck through Sentinel: %v", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	r.Failover(t)
	l, err = a.Mutex("after-failover").Lock(ctx)
	if err != nil {
		t.Fatalf("Lock after the failover: %v", err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []*dlock.Client{a, b, acked} {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	}
	noDenials(t, r.Primary, r.Replica)
}

// A holder whose user loses a command that a script runs is told which
// script by Unlock and Extend too, as a lock call is, not only Redis's
// message, which names neither the command nor the script.
func TestACLRevokedScriptCommandNamed(t *testing.T) {
	s := redistest.Start(t)
	full := docACL(t, "dlock", aclPassword)
	ctx := ctxT(t, 30*time.Second)
	for _, c := range []struct {
		drop, script string
		call         func(*dlock.Lease) error
	}{
		{"+hdel", "release.lua", func(l *dlock.Lease) error { return l.Unlock(ctx) }},
		{"+pexpire", "extend.lua", func(l *dlock.Lease) error { return l.Extend(ctx, time.Minute) }},
	} {
		setACL(t, full, s)
		user := newDlock(t, s.Client(t, asUser("dlock", aclPassword)))
		l, err := user.Mutex("revoked"+c.drop, dlock.NoRenew()).TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		setACL(t, without(t, full, c.drop), s)
		err = c.call(l)
		for _, w := range []string{`lock "revoked` + c.drop + `"`, "can't run this command", "dlock's script " + c.script, "docs/PRODUCTION.md"} {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("without %s: %v, want it to say %q", c.drop, err, w)
			}
		}
		_ = user.Close()
	}
}
