package dlock_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// syncBuffer is a bytes.Buffer for concurrent writers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// goRedisLog collects what go-redis itself logs (redis.SetLogger).
type goRedisLog struct{ out *syncBuffer }

func (l goRedisLog) Printf(_ context.Context, format string, v ...any) {
	fmt.Fprintf(l.out, "go-redis: "+format+"\n", v...)
}

// Neither a Redis password nor a lease's token ever appears in what dlock
// logs, at Debug level, or in an error it returns: through every primitive
// and a run of failures (a wrong password, leases lost by deletion,
// overwrite and a killed server, a user whose permissions are taken away
// while it holds locks, and an unreachable server). What go-redis logs
// meanwhile is checked too. The test fails if it saw too little to mean
// anything: no Debug lines, or too few tokens and errors.
func TestSecretsNeverLogged(t *testing.T) {
	const password = "Pa55-" + "never-printed"
	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	redis.SetLogger(goRedisLog{logs})
	t.Cleanup(func() { redis.SetLogger(goRedisLog{&syncBuffer{}}) })

	var mu sync.Mutex
	var tokens, errs []string
	see := func(l *dlock.Lease) {
		mu.Lock()
		defer mu.Unlock()
		tokens = append(tokens, l.Token())
	}
	record := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Errorf("%s: no error", what)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		errs = append(errs, what+": "+err.Error())
	}
	ctx := ctxT(t, 2*time.Minute)
	s := redistest.Start(t)
	setACL(t, docACL(t, "app", password), s)
	admin := s.Client(t)
	user := func(pw string, opts ...dlock.Option) *dlock.Client {
		c, err := newDlockOrErr(t, s.Client(t, asUser("app", pw), func(o *redis.Options) { o.MaxRetries = 1 }), append(opts, dlock.WithLogger(logger))...)
		if err != nil {
			// rueidis meets a wrong password in rueidis.NewClient: its
			// error is checked like dlock's, and the calls below go to a
			// go-redis Client with the same password.
			if strings.Contains(err.Error(), password) {
				t.Errorf("rueidis.NewClient's error shows the password: %v", err)
			}
			c = dlock.New(s.Client(t, asUser("app", pw), func(o *redis.Options) { o.MaxRetries = 1 }), append(opts, dlock.WithLogger(logger))...)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}

	// Every primitive, as in production.
	var renewals atomic.Int64
	a, b := user(password), user(password)
	countRenewals(a, &renewals)
	everyPrimitive(t, ctx, a, b, &renewals, admin, see)

	// A wrong password.
	wrong := user(password + "x")
	_, err := wrong.Mutex("secret-wrong").TryLock(ctx)
	record("wrong password TryLock", err)
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	_, err = wrong.Mutex("secret-wrong").Lock(wctx)
	cancel()
	record("wrong password Lock", err)

	// Leases lost: the key deleted, the key overwritten by another owner.
	for _, how := range []string{"deleted", "overwritten"} {
		l, err := a.Mutex("secret-lost-"+how, dlock.TTL(time.Second)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		see(l)
		key := "dlock:{secret-lost-" + how + "}"
		if how == "deleted" {
			admin.Del(ctx, key)
		} else {
			admin.HSet(ctx, key, "o", "someone-else")
		}
		<-l.Context().Done()
		record("lost lease cause ("+how+")", context.Cause(l.Context()))
		record("lost lease Extend ("+how+")", l.Extend(ctx, time.Second))
		_, err = l.TTL(ctx)
		record("lost lease TTL ("+how+")", err)
		record("lost lease Unlock ("+how+")", l.Unlock(ctx))
	}

	// Permissions taken away from a holder: renewals, Extend, TTL and
	// Unlock are refused (NOPERM), and a new Client is refused its first
	// lock (no channel permission).
	held, err := a.Mutex("secret-noperm", dlock.TTL(time.Second)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	see(held)
	s.Do(t, "ACL", "SETUSER", "app", "-evalsha", "-eval", "resetchannels")
	record("NOPERM Extend", held.Extend(ctx, time.Second))
	_, err = held.TTL(ctx)
	record("NOPERM TTL", err)
	<-held.Context().Done() // the watchdog's renewals are refused too
	record("NOPERM lost lease cause", context.Cause(held.Context()))
	record("NOPERM Unlock", held.Unlock(ctx))
	_, err = user(password).Mutex("secret-noperm-new").TryLock(ctx)
	record("NOPERM first TryLock", err)
	setACL(t, docACL(t, "app", password), s)

	// A server killed under a holder, then unreachable.
	doomed := redistest.Start(t)
	setACL(t, docACL(t, "app", password), doomed)
	drdb := doomed.Client(t, asUser("app", password), func(o *redis.Options) { o.MaxRetries = 1 })
	dc := newDlock(t, drdb, dlock.WithLogger(logger))
	t.Cleanup(func() { _ = dc.Close() })
	l, err := dc.Mutex("secret-killed", dlock.TTL(time.Second)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	see(l)
	doomed.Kill()
	<-l.Context().Done()
	record("killed server lost lease cause", context.Cause(l.Context()))
	record("killed server Unlock", l.Unlock(ctx))
	uctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	_, err = dc.Mutex("secret-unreachable").Lock(uctx)
	cancel()
	record("unreachable Lock", err)
	_, err = dc.Mutex("secret-unreachable").TryLock(ctx)
	record("unreachable TryLock", err)

	// Back up, so that go-redis's background dialer ends (goleak).
	doomed.Restart(t)
	setACL(t, docACL(t, "app", password), doomed)
	waitFor(t, ctx, "the restarted server answers", func() bool { return drdb.Ping(ctx).Err() == nil })
	for _, c := range []*dlock.Client{a, b, dc} {
		_ = c.Close()
	}
	out := logs.String()
	mu.Lock()
	defer mu.Unlock()
	all := out + "\n" + strings.Join(errs, "\n")
	if strings.Contains(all, password) {
		t.Errorf("the password appears in the logs or errors:\n%s", all)
	}
	for _, tok := range tokens {
		if tok == "" || strings.Contains(all, tok) {
			t.Errorf("lease token %q appears in the logs or errors:\n%s", tok, all)
		}
	}
	// What was looked at, so that the test means something.
	if !strings.Contains(out, "level=DEBUG") || !strings.Contains(out, "level=WARN msg=\"dlock: lease lost\"") {
		t.Errorf("the logs hold no Debug line or no lost lease:\n%s", out)
	}
	if len(tokens) < 15 || len(errs) < 15 {
		t.Errorf("saw %d tokens and %d errors; the test checks too little", len(tokens), len(errs))
	}
	for _, e := range errs {
		if !strings.Contains(e, "dlock") {
			t.Errorf("an error without dlock's prefix: %s", e)
		}
	}
	if testing.Verbose() {
		t.Logf("%d tokens, %d errors, %d bytes of logs:\n%s\n%s", len(tokens), len(errs), len(out), strings.Join(errs, "\n"), out)
	}
}
