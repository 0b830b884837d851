package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/wire"
	"github.com/redis/go-redis/v9"
)

// aclPassword is the password of the ACL tests' user.
const aclPassword = "acl-S3cret"

// docACL returns the ACL SETUSER line of docs/PRODUCTION.md as command
// arguments, for user and password: the tests create exactly the user the
// documentation tells operators to create.
func docACL(t *testing.T, user, password string) []string {
	t.Helper()
	for _, line := range strings.Split(readFile(t, "docs/PRODUCTION.md"), "\n") {
		if rest, ok := strings.CutPrefix(line, "ACL SETUSER dlock on >CHANGE-ME "); ok {
			return append([]string{"ACL", "SETUSER", user, "on", ">" + password}, strings.Fields(rest)...)
		}
	}
	t.Fatal("docs/PRODUCTION.md has no line beginning `ACL SETUSER dlock on >CHANGE-ME`")
	return nil
}

// without returns acl with the rule drop removed (it must be there) and
// the rules add appended.
func without(t testing.TB, acl []string, drop string, add ...string) []string {
	t.Helper()
	i := slices.Index(acl, drop)
	if i < 0 {
		t.Fatalf("the documented ACL has no rule %q: %v", drop, acl)
	}
	return append(slices.Delete(slices.Clone(acl), i, i+1), add...)
}

// setACL creates the user on every server, with an empty ACL LOG.
func setACL(t testing.TB, acl []string, servers ...*redistest.Server) {
	t.Helper()
	args := make([]any, len(acl))
	for i, a := range acl {
		args[i] = a
	}
	for _, s := range servers {
		s.Do(t, args...)
		s.Do(t, "ACL", "LOG", "RESET")
	}
}

// noDenials fails the test if any server's ACL LOG holds an entry: a
// command, key or channel refused to anyone, even one that go-redis or
// dlock tolerated.
func noDenials(t testing.TB, servers ...*redistest.Server) {
	t.Helper()
	for _, s := range servers {
		entries, _ := s.Do(t, "ACL", "LOG").([]any)
		for _, e := range entries {
			t.Errorf("%s: ACL LOG: %v", s.Addr(), e)
		}
	}
}

// asUser sets the Redis user of a go-redis client.
func asUser(user, password string) func(*redis.Options) {
	return func(o *redis.Options) { o.Username, o.Password = user, password }
}

// A user made by the documented ACL line can run every primitive, on one
// server and on a Cluster, in quorum mode and with replica acknowledgement,
// and the servers refuse it nothing (the ACL LOG stays empty), so the line
// grants all that dlock needs.
func TestACLLeastPrivilege(t *testing.T) {
	acl := docACL(t, "dlock", aclPassword)
	ctx := ctxT(t, 2*time.Minute)

	t.Run("server", func(t *testing.T) {
		s := redistest.Start(t)
		setACL(t, acl, s)
		var renewals atomic.Int64
		a := newDlock(t, s.Client(t, asUser("dlock", aclPassword)))
		countRenewals(a, &renewals)
		b := newDlock(t, s.Client(t, asUser("dlock", aclPassword)))
		everyPrimitive(t, ctx, a, b, &renewals, s.Client(t), func(*dlock.Lease) {})
		// WAIT is allowed: with no replica it counts 0, which fails
		// closed with ErrNotReplicated, not with NOPERM.
		acked := newDlock(t, s.Client(t, asUser("dlock", aclPassword)), dlock.WithReplicaAck(1, 10*time.Millisecond))
		if _, err := acked.Mutex("acked").TryLock(ctx); !errors.Is(err, dlock.ErrNotReplicated) || strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("WithReplicaAck without replicas: %v, want ErrNotReplicated", err)
		}
		for _, c := range []*dlock.Client{a, b, acked} {
			if err := c.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		}
		noDenials(t, s)
	})

	t.Run("cluster", func(t *testing.T) {
		nodes := redistest.Cluster(t, 3)
		setACL(t, acl, nodes...)
		cluster := func(opts ...func(*redis.Options)) *redis.ClusterClient {
			o := &redis.Options{}
			for _, f := range opts {
				f(o)
			}
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr()}, Username: o.Username, Password: o.Password, DisableIdentity: true})
			t.Cleanup(func() { _ = c.Close() })
			return c
		}
		var renewals atomic.Int64
		a := newDlock(t, cluster(asUser("dlock", aclPassword)))
		countRenewals(a, &renewals)
		b := newDlock(t, cluster(asUser("dlock", aclPassword)))
		everyPrimitive(t, ctx, a, b, &renewals, cluster(), func(*dlock.Lease) {})
		for _, c := range []*dlock.Client{a, b} {
			if err := c.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		}
		noDenials(t, nodes...)
	})

	t.Run("quorum", func(t *testing.T) {
		masters := redistest.Masters(t, 3)
		setACL(t, acl, masters...)
		var rdbs []redis.UniversalClient
		for _, m := range masters {
			rdbs = append(rdbs, m.Client(t, asUser("dlock", aclPassword)))
		}
		q, err := newQuorumOrErr(t, rdbs, dlock.WithRestartDelay(0))
		if err != nil {
			t.Fatal(err)
		}
		m := q.Mutex("q", dlock.TTL(time.Second))
		l, err := m.Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Extend(ctx, 2*time.Second); err != nil {
			t.Errorf("quorum Extend: %v", err)
		}
		if _, err := l.TTL(ctx); err != nil {
			t.Errorf("quorum TTL: %v", err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Errorf("quorum Unlock: %v", err)
		}
		if err := q.Close(); err != nil {
			t.Errorf("quorum Close: %v", err)
		}
		noDenials(t, masters...)
	})
}

// A user that lacks one piece of the documented ACL gets, from every
// primitive's TryLock and Lock, an error that names the lock and what was
// refused, at once: a Lock with a ctx that never ends does not wait for it,
// and nothing is locked.
func TestACLMissingPiece(t *testing.T) {
	s := redistest.Start(t)
	holder, _ := newClient(t, s) // the default user, which may do anything
	full := docACL(t, "dlock", aclPassword)
	for _, c := range []struct {
		name string
		acl  []string
		pw   string
		want []string // in every error
	}{
		{"no channels", without(t, full, "&dlock:*"), aclPassword, []string{"NOPERM", "channels", "&dlock:*"}},
		{"no SPUBLISH", without(t, full, "+spublish"), aclPassword, []string{"NOPERM", "'spublish'", "docs/PRODUCTION.md"}},
		{"no EVALSHA", without(t, full, "+evalsha"), aclPassword, []string{"NOPERM", "'evalsha'"}},
		{"keys outside the prefix", without(t, full, "~dlock:*", "~app:*"), aclPassword, []string{"NOPERM", "keys"}},
		{"a command a script runs", without(t, full, "+time"), aclPassword, []string{"can't run this command", "dlock's script", ".lua", "docs/PRODUCTION.md"}},
		{"wrong password", full, aclPassword + "x", []string{"WRONGPASS"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			setACL(t, c.acl, s)
			for _, p := range exclusives {
				missingPiece(t, s, holder, p, c.pw, c.want)
			}
		})
	}
}

// missingPiece checks one primitive for TestACLMissingPiece: TryLock of a
// free lock (a script that fails only once it takes the lock must fail
// it) and Lock, with a ctx that never ends, of a lock holder holds.
func missingPiece(t *testing.T, s *redistest.Server, holder *dlock.Client, p exclusive, pw string, want []string) {
	t.Helper()
	name := "acl-" + p.kind
	free := name + "-free"
	// Held by someone else, so that a Lock that were not refused would
	// wait.
	held, err := p.hold(holder, name)(ctxT(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := held.Unlock(context.Background()); err != nil {
			t.Errorf("%s: the holder's Unlock: %v", p.kind, err)
		}
	}()
	user, err := newDlockOrErr(t, s.Client(t, asUser("dlock", pw)))
	if err != nil { // rueidis meets a wrong password in rueidis.NewClient
		for _, w := range want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: rueidis.NewClient's error %q does not say %q", p.kind, err, w)
			}
		}
		return
	}
	defer user.Close()
	for _, c := range []struct {
		what, name string
		call       func(context.Context) (*dlock.Lease, error)
	}{
		{"TryLock", free, p.tryWait(user, free)},
		{"Lock", name, p.wait(user, name)},
	} {
		err := refusedWithin(t, 15*time.Second, c.call, p.kind+" "+c.what)
		msg := err.Error()
		if strings.HasPrefix(msg, "obtained") {
			t.Errorf("%s %s: %s by a user the server refuses", p.kind, c.what, msg)
			continue
		}
		for _, w := range append(want, fmt.Sprintf("lock %q", c.name)) {
			if !strings.Contains(msg, w) {
				t.Errorf("%s %s: error %q does not say %q", p.kind, c.what, msg, w)
			}
		}
	}
	admin := s.Client(t)
	key := wire.HashKey(wire.DefaultPrefix, free)
	if o, u := admin.HGet(t.Context(), key, wire.FieldOwner).Val(), admin.HGet(t.Context(), key, wire.FieldUsed).Val(); o != "" || (u != "" && u != "0") {
		t.Errorf("%s: %s held (owner %q, permits held %q) by a user the server refuses", p.kind, free, o, u)
	}
}

// A user that may publish but not subscribe is refused only its
// subscriptions: its waiters are not notified, yet still get the lock once
// it is free, by their own looks (a degraded mode, not a hang).
func TestACLNoSubscribeStillExclusive(t *testing.T) {
	s := redistest.Start(t)
	acl := without(t, without(t, docACL(t, "dlock", aclPassword), "+ssubscribe"), "+subscribe")
	setACL(t, acl, s)
	holder, admin := newClient(t, s)
	user := newDlock(t, s.Client(t, asUser("dlock", aclPassword)))
	defer user.Close()
	ctx := ctxT(t, time.Minute)
	for _, p := range exclusives {
		name := "nosub-" + p.kind
		held, err := p.hold(holder, name)(ctx)
		if err != nil {
			t.Fatal(err)
		}
		waiting := async(t, ctx, p.wait(user, name))
		waitLine(t, ctx, admin, wire.HashKey(wire.DefaultPrefix, name), 1)
		if err := held.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		l, err := waiting()
		if err != nil {
			t.Fatalf("%s: the waiter refused its subscriptions: %v", p.kind, err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Errorf("%s: Unlock: %v", p.kind, err)
		}
	}
	entries, _ := s.Do(t, "ACL", "LOG").([]any)
	if len(entries) == 0 {
		t.Error("the ACL LOG is empty: the subscriptions were not refused, so this test shows nothing")
	}
}

// In quorum mode too, masters that all refuse the user a command fail a
// Lock at once, naming what was refused, with a ctx that never ends.
// Quorum mode asks no master about pub/sub, so masters that refuse only the
// channels are not detected: its waiters are then not notified and get the
// lock by their own looks once it is free (a degraded mode, not a hang).
func TestACLMissingPieceQuorum(t *testing.T) {
	// quorumAs returns n quorum Clients (as n processes would have) on 3
	// masters whose user lacks drop.
	var masters []*redistest.Server
	quorumAs := func(t *testing.T, drop string, n int) []*dlock.Client {
		masters = redistest.Masters(t, 3)
		setACL(t, without(t, docACL(t, "dlock", aclPassword), drop), masters...)
		var qs []*dlock.Client
		for range n {
			var rdbs []redis.UniversalClient
			for _, m := range masters {
				rdbs = append(rdbs, m.Client(t, asUser("dlock", aclPassword)))
			}
			q, err := newQuorumOrErr(t, rdbs, dlock.WithRestartDelay(0))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = q.Close() })
			qs = append(qs, q)
		}
		return qs
	}
	t.Run("no EVALSHA", func(t *testing.T) {
		q := quorumAs(t, "+evalsha", 1)[0]
		for what, call := range map[string]func(context.Context) (*dlock.Lease, error){
			"TryLock": q.Mutex("q-acl").TryLock,
			"Lock":    q.Mutex("q-acl").Lock,
		} {
			err := refusedWithin(t, 30*time.Second, call, "quorum "+what)
			for _, w := range []string{`lock "q-acl"`, "NOPERM", "'evalsha'"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("quorum %s: error %q does not say %q", what, err, w)
				}
			}
		}
	})
	t.Run("no channels", func(t *testing.T) {
		qs := quorumAs(t, "&dlock:*", 2)
		ctx := ctxT(t, time.Minute)
		held, err := qs[0].Mutex("q-acl", dlock.TTL(heldTTL)).TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		waiting := async(t, ctx, qs[1].Mutex("q-acl").Lock)
		// The waiter waits once its subscription has been refused: its
		// Client's hub asks about pub/sub first, with SPUBLISH on the probe
		// channel, which the ACL LOG records.
		waitFor(t, ctx, "the waiter's subscription refused", func() bool {
			entries, _ := masters[0].Do(t, "ACL", "LOG").([]any)
			return strings.Contains(fmt.Sprint(entries), "object:dlock:probe")
		})
		if err := held.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		l, err := waiting()
		if err != nil {
			t.Fatalf("the waiter: %v", err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Errorf("Unlock: %v", err)
		}
	})
}

// refusedWithin runs lock with a ctx that never ends and returns its
// error, or one that starts with "obtained" if it got the lock (released
// at once); it fails the test if no answer comes within d (a refusal that
// waited instead of failing; the caller's deferred Close ends the call).
func refusedWithin(t *testing.T, d time.Duration, lock func(context.Context) (*dlock.Lease, error), what string) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		l, err := lock(context.Background())
		if err == nil {
			err = fmt.Errorf("obtained, fence %d", l.Fence())
			_ = l.Unlock(context.Background())
		}
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		t.Fatalf("%s: no answer in %v: a refusal waited instead of failing", what, d)
		return nil
	}
}
