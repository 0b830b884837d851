package dlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// docStringACL returns the rules docs/PRODUCTION.md adds for string locks
// (its line `ACL SETUSER dlock ...` after the main one), for user.
func docStringACL(t *testing.T, user string) []string {
	t.Helper()
	for _, line := range strings.Split(readFile(t, "docs/PRODUCTION.md"), "\n") {
		if rest, ok := strings.CutPrefix(line, "ACL SETUSER dlock ~"); ok {
			return append([]string{"ACL", "SETUSER", user}, strings.Fields("~"+rest)...)
		}
	}
	t.Fatal("docs/PRODUCTION.md has no line beginning `ACL SETUSER dlock ~` (the rules of string locks)")
	return nil
}

// stringsAsUser runs a StringMutex through what a deployment does, as a
// client of the user: Lock, Extend, TTL, Unlock; a wait for another
// library's compare-and-delete; a wait for a dlock release.
func stringsAsUser(t *testing.T, ctx context.Context, a, b *dlock.Client, admin redis.Cmdable, key string) {
	t.Helper()
	l, err := a.StringMutex(key, dlock.TTL(heldTTL)).Lock(ctx)
	if err != nil {
		t.Fatalf("Lock: %v", err)
	}
	if err := l.Extend(ctx, 2*heldTTL); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	if ttl, err := l.TTL(ctx); err != nil || ttl <= heldTTL {
		t.Fatalf("TTL after Extend = %v, %v", ttl, err)
	}
	if _, err := b.StringMutex(key).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("TryLock while held: %v, want ErrNotObtained", err)
	}
	wctx, cancel := context.WithTimeout(ctx, waitCtx)
	defer cancel()
	waiting := async(t, wctx, b.StringMutex(key).Lock)
	time.Sleep(200 * time.Millisecond)
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
	l2, err := waiting()
	if err != nil {
		t.Fatalf("a waiter for a dlock release: %v", err)
	}
	if err := l2.Unlock(ctx); err != nil {
		t.Fatalf("the waiter's Unlock: %v", err)
	}
	// Another library's holding, released by compare-and-delete.
	if ok := admin.SetNX(ctx, key, "other-library", time.Minute).Val(); !ok {
		t.Fatal("the key is still held")
	}
	waiting = async(t, wctx, b.StringMutex(key).Lock)
	time.Sleep(200 * time.Millisecond)
	admin.Del(ctx, key)
	l3, err := waiting()
	if err != nil {
		t.Fatalf("a waiter for another library's release: %v", err)
	}
	if err := l3.Unlock(ctx); err != nil {
		t.Fatalf("Unlock: %v", err)
	}
}

func TestACLStringLeastPrivilege(t *testing.T) {
	acl := docACL(t, "dlock", aclPassword)
	sacl := docStringACL(t, "dlock")
	ctx := ctxT(t, time.Minute)
	for _, notify := range []string{"", "Kgx"} {
		t.Run("server/notify="+notify, func(t *testing.T) {
			s := redistest.Start(t, redistest.Options{Args: []string{"--notify-keyspace-events", notify}})
			setACL(t, acl, s)
			setACL(t, sacl, s)
			a := newDlock(t, s.Client(t, asUser("dlock", aclPassword)))
			b := newDlock(t, s.Client(t, asUser("dlock", aclPassword)))
			stringsAsUser(t, ctx, a, b, s.Client(t), "reports:daily")
			stringsAsUser(t, ctx, a, b, s.Client(t), "reports:{7}:weekly")
			for _, c := range []*dlock.Client{a, b} {
				if err := c.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			}
			noDenials(t, s)
		})
	}
	t.Run("cluster", func(t *testing.T) {
		nodes := redistest.Cluster(t, 3)
		for _, n := range nodes {
			n.Do(t, "CONFIG", "SET", "notify-keyspace-events", "Kgx")
		}
		setACL(t, acl, nodes...)
		setACL(t, sacl, nodes...)
		cluster := func(user, pw string) *redis.ClusterClient {
			c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{nodes[0].Addr()}, Username: user, Password: pw, DisableIdentity: true})
			t.Cleanup(func() { _ = c.Close() })
			return c
		}
		a := newDlock(t, cluster("dlock", aclPassword))
		b := newDlock(t, cluster("dlock", aclPassword))
		for _, key := range []string{"reports:daily", "reports:a", "reports:b", "reports:{7}:weekly"} {
			stringsAsUser(t, ctx, a, b, cluster("", ""), key)
		}
		for _, c := range []*dlock.Client{a, b} {
			if err := c.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		}
		noDenials(t, nodes...)
	})
}

// A user that lacks one of the rules string locks need beyond the main
// line gets, from TryLock and Lock, an error that names what was refused,
// and nothing stays locked; or, for the rules that only speed waiting up
// (CONFIG GET, CLIENT INFO, the channels), a waiter that still gets the
// lock soon after another library releases it (it polls), not a second
// later.
func TestACLStringMissingPiece(t *testing.T) {
	acl := docACL(t, "dlock", aclPassword)
	full := docStringACL(t, "dlock")
	for _, c := range []struct {
		drop string
		want []string // nil: it works, polling
	}{
		{"~{reports:*}:dlock-fence", []string{"NOPERM", "keys"}},
		{"+del", []string{"can't run this command", "str_acquire.lua", "docs/PRODUCTION.md"}},
		{"+config|get", nil},
		{"+client|info", nil},
		{"&__keyspace@*__:reports:*", nil},
		{"&reports:*", nil},
	} {
		t.Run(c.drop, func(t *testing.T) {
			s := redistest.Start(t)
			setACL(t, acl, s)
			setACL(t, without(t, full, c.drop), s)
			admin := s.Client(t)
			ctx := ctxT(t, 20*time.Second)
			u := newDlock(t, s.Client(t, asUser("dlock", aclPassword)))
			defer u.Close()
			if c.want != nil {
				for what, call := range map[string]func(context.Context) (*dlock.Lease, error){
					"TryLock": u.StringMutex("reports:free").TryLock,
					"Lock":    u.StringMutex("reports:free").Lock,
				} {
					err := refusedWithin(t, 10*time.Second, call, what)
					for _, w := range c.want {
						if !strings.Contains(err.Error(), w) {
							t.Errorf("%s: error %q does not say %q", what, err, w)
						}
					}
				}
				if v := admin.Get(ctx, "reports:free").Val(); v != "" {
					t.Errorf("reports:free left locked (%q) by a user that cannot release it", v)
				}
				return
			}
			for i := range 3 { // a fresh wait each time: each subscribes anew
				admin.Set(ctx, "reports:held", "other-library", time.Minute)
				waiting := async(t, ctx, u.StringMutex("reports:held").Lock)
				time.Sleep(100 * time.Millisecond)
				admin.Del(ctx, "reports:held")
				del := time.Now()
				l, err := waiting()
				if err != nil {
					t.Fatalf("wait %d: %v", i, err)
				}
				if took := time.Since(del); took > 500*time.Millisecond {
					t.Errorf("wait %d: the lock obtained %v after another library released it (polling: within 75 ms and a look)", i, took.Round(time.Millisecond))
				}
				if err := l.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
