package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// listJSON runs dlock list --json with args and parses the result.
func listJSON(t *testing.T, addr string, args ...string) ([]lockInfo, string) {
	t.Helper()
	code, out, errOut := runDlock(t, addr, append([]string{"list", "--json"}, args...)...)
	if code != 0 {
		t.Fatalf("dlock list --json %q: exit %d; stderr %q", args, code, errOut)
	}
	var infos []lockInfo
	if err := json.Unmarshal([]byte(out), &infos); err != nil || infos == nil {
		t.Fatalf("dlock list --json %q does not parse as an array: %v\n%s", args, err, out)
	}
	return infos, errOut
}

func names(infos []lockInfo) string {
	var ns []string
	for _, i := range infos {
		ns = append(ns, i.Name)
	}
	return strings.Join(ns, ",")
}

// list finds held, free and foreign keys under the prefix, filters by
// pattern and prefix, and is bounded by --limit.
func TestList(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	rdb := s.Client(t)

	held := startDlock(t, s.Addr(), "run", "list-a", "--", "sh", "-c", `echo "$DLOCK_TOKEN"; exec sleep 30`)
	token := held.line()
	other := startDlock(t, s.Addr(), "run", "--prefix", "other:", "list-d", "--", "sh", "-c", `echo ready; exec sleep 30`)
	other.line()
	if code, _, errOut := runDlock(t, s.Addr(), "run", "list-b", "--", "true"); code != 0 {
		t.Fatalf("run list-b: exit %d; %s", code, errOut)
	}
	rdb.Set(t.Context(), "dlock:{list-c}", "not a lock", 0)
	rdb.Set(t.Context(), "unrelated", "x", 0)

	all, _ := listJSON(t, s.Addr())
	if names(all) != "list-a,list-b,list-c" {
		t.Fatalf("list: got %s, want list-a,list-b,list-c", names(all))
	}
	a, b, c := all[0], all[1], all[2]
	if a.Type != "mutex" || a.State != "held" || a.Token != token || a.Fence == 0 || a.TTLMillis <= 0 {
		t.Errorf("held lock: %+v", a)
	}
	if b.Type != "mutex" || b.State != "free" || b.Token != "" || b.Fence == 0 || b.TTLMillis <= 0 {
		t.Errorf("free lock: %+v", b)
	}
	if c.Type != "foreign" || c.RedisType != "string" || c.State != "unknown" || c.TTLMillis != -1 {
		t.Errorf("foreign key: %+v", c)
	}

	if got, _ := listJSON(t, s.Addr(), "list-[ab]"); names(got) != "list-a,list-b" {
		t.Errorf("list 'list-[ab]': got %s", names(got))
	}
	if got, _ := listJSON(t, s.Addr(), "nothing-*"); len(got) != 0 {
		t.Errorf("list 'nothing-*': got %s", names(got))
	}
	if got, _ := listJSON(t, s.Addr(), "--prefix", "other:"); names(got) != "list-d" || got[0].State != "held" {
		t.Errorf("list --prefix other: got %+v", got)
	}
	got, errOut := listJSON(t, s.Addr(), "--limit", "1")
	if len(got) != 1 || !strings.Contains(errOut, "--limit") {
		t.Errorf("list --limit 1: got %s, stderr %q", names(got), errOut)
	}

	code, out, errOut := runDlock(t, s.Addr(), "list")
	if code != 0 || !strings.Contains(out, "NAME") || !strings.Contains(out, token) || !strings.Contains(out, "foreign:string") {
		t.Errorf("list (table): exit %d, stderr %q, output:\n%s", code, errOut, out)
	}
}

// status and list show a semaphore's permits and an rwmutex's readers or
// writer, read from the keys of docs/PROTOCOL.md.
func TestStatusSemaphoreAndRWMutex(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	ctx := t.Context()
	c := dlock.New(s.Client(t))
	defer c.Close()
	for _, n := range []int64{2, 1} {
		if _, err := c.Semaphore("pool", 5).Acquire(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 2; i++ {
		if _, err := c.RWMutex("doc").RLock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	w, err := c.RWMutex("cfg").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	infos, _ := listJSON(t, s.Addr())
	if names(infos) != "cfg,doc,pool" {
		t.Fatalf("list: %s (the holder and line keys must not show as locks)", names(infos))
	}
	cfg, doc, pool := infos[0], infos[1], infos[2]
	if pool.Type != "semaphore" || pool.State != "held" || pool.PermitsHeld != 3 || pool.Size != 5 || pool.Holders != 2 || pool.Fence == 0 {
		t.Errorf("semaphore: %+v", pool)
	}
	if doc.Type != "rwmutex" || doc.State != "held" || doc.Mode != "read" || doc.Holders != 2 {
		t.Errorf("read-held rwmutex: %+v", doc)
	}
	if cfg.Type != "rwmutex" || cfg.State != "held" || cfg.Mode != "write" || cfg.Fence != w.Fence() {
		t.Errorf("write-held rwmutex: %+v", cfg)
	}
	code, out, errOut := runDlock(t, s.Addr(), "status", "pool")
	if code != 0 || !strings.Contains(out, "3 of 5 held by 2 holders") {
		t.Fatalf("status pool: exit %d\n%s%s", code, out, errOut)
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	code, out, _ = runDlock(t, s.Addr(), "status", "cfg")
	if code != 0 || !strings.Contains(out, "free") || strings.Contains(out, "writer") {
		t.Fatalf("status of a released rwmutex: exit %d\n%s", code, out)
	}
}

// Names and tokens are data from Redis: in text output a control
// character in them is escaped, so a name holding "\n" cannot forge a row
// of dlock list and an escape sequence never reaches the terminal. JSON
// keeps them exact.
func TestTextOutputEscapesControlCharacters(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	rdb := s.Client(t)
	c := dlock.New(rdb)
	t.Cleanup(func() { _ = c.Close() })
	evil := "evil\nforged   mutex  held  1  9s  0  FORGED"
	red := "\x1b[31mred\x1b[0m"
	for _, name := range []string{evil, red} {
		if _, err := c.Mutex(name).TryLock(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	badToken := "tok\x1b]0;title\x07\nen"
	rdb.HSet(t.Context(), "dlock:{tok}", "o", badToken, "f", "5")

	clean := func(what, out string, lines int) {
		t.Helper()
		if strings.ContainsAny(out, "\x1b\x07") {
			t.Errorf("%s: control characters reach the terminal: %q", what, out)
		}
		if n := strings.Count(strings.TrimSuffix(out, "\n"), "\n") + 1; lines > 0 && n != lines {
			t.Errorf("%s: %d lines, want %d: %q", what, n, lines, out)
		}
	}
	code, out, errOut := runDlock(t, s.Addr(), "list")
	if code != 0 {
		t.Fatalf("list: exit %d; %s", code, errOut)
	}
	clean("list", out, 4) // the header and three locks
	if strings.Contains(out, "\nforged") {
		t.Errorf("list: a name forged a row: %q", out)
	}
	for _, name := range []string{evil, red, "tok"} {
		code, out, errOut := runDlock(t, s.Addr(), "status", name)
		if code != 0 {
			t.Fatalf("status %q: exit %d; %s", name, code, errOut)
		}
		clean("status "+name, out, 0)
		if strings.Contains(out, "\nforged") || strings.Contains(out, "\nen") {
			t.Errorf("status %q: a name or token forged a line: %q", name, out)
		}
	}
	_, out, errOut = runDlock(t, s.Addr(), "unlock", "--force", "--token", "other\x1b[2J", "tok")
	clean("unlock --token (refused)", out+errOut, 1)
	code, out, errOut = runDlock(t, s.Addr(), "unlock", "--force", "tok")
	if code != 0 {
		t.Fatalf("unlock: exit %d; %s", code, errOut)
	}
	clean("unlock", out+errOut, 1)

	infos, _ := listJSON(t, s.Addr())
	got := map[string]bool{}
	for _, i := range infos {
		got[i.Name] = true
	}
	if !got[evil] || !got[red] {
		t.Errorf("list --json does not keep names exact: %q", names(infos))
	}
}

// statusJSON runs dlock status --json NAME and parses the result.
func statusJSON(t *testing.T, addr, name string) lockInfo {
	t.Helper()
	code, out, errOut := runDlock(t, addr, "status", "--json", name)
	var st lockInfo
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil {
		t.Fatalf("status %s: exit %d, %v; stderr %q", name, code, err, errOut)
	}
	return st
}

// A holding whose lease ran out (its holder died, or stopped renewing) is
// never shown as holding, although Redis keeps it until a lock call needs
// its permits; ttl_ms is then the lease left of the live holdings, or the
// idle time left when none is live.
func TestStatusShowsOnlyLiveHolders(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	ctx := t.Context()
	c := dlock.New(s.Client(t))
	defer c.Close()
	dying := []dlock.LockOption{dlock.TTL(200 * time.Millisecond), dlock.NoRenew()}
	if _, err := c.Semaphore("pool", 4, dying...).Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	live, err := c.Semaphore("pool", 4).Acquire(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.RWMutex("doc", dying...).Lock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RWMutex("cfg", dying...).RLock(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RWMutex("cfg").RLock(ctx); err != nil {
		t.Fatal(err)
	}
	time.Sleep(400 * time.Millisecond) // the short leases run out

	pool := statusJSON(t, s.Addr(), "pool")
	if pool.State != "held" || pool.Holders != 1 || pool.PermitsHeld != 2 || pool.TTLMillis <= 0 || pool.TTLMillis > dlock.DefaultTTL.Milliseconds() {
		t.Errorf("semaphore with one live holding of 2 permits and one run out: %+v", pool)
	}
	doc := statusJSON(t, s.Addr(), "doc")
	if doc.State != "free" || doc.Holders != 0 || doc.Mode != "" || doc.TTLMillis <= dlock.DefaultTTL.Milliseconds() {
		t.Errorf("rwmutex whose writer's lease ran out: %+v (want free, ttl the idle time left)", doc)
	}
	cfg := statusJSON(t, s.Addr(), "cfg")
	if cfg.State != "held" || cfg.Mode != "read" || cfg.Holders != 1 {
		t.Errorf("rwmutex with one live reader and one run out: %+v", cfg)
	}
	code, out, _ := runDlock(t, s.Addr(), "status", "pool")
	if code != 0 || !strings.Contains(out, "2 of 4 held by 1 holder\n") || !strings.Contains(out, "(lease left)") {
		t.Errorf("status pool:\n%s", out)
	}
	code, out, _ = runDlock(t, s.Addr(), "status", "doc")
	if code != 0 || !strings.Contains(out, "state    free") || strings.Contains(out, "writer") || strings.Contains(out, "lease left") {
		t.Errorf("status doc:\n%s", out)
	}
	if err := live.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
}

// Waiters are counted for what they are: clients with callers waiting,
// live places in line (one per Fair waiter, one per client waiting in
// default mode), and an rwmutex's line by readers and writers; a place
// whose waiter stopped keeping it is not counted.
func TestStatusCountsWaiters(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	rdb := s.Client(t)

	holder := startDlock(t, s.Addr(), "run", "busy", "--", "sh", "-c", `echo ready; exec sleep 30`)
	holder.line()
	for _, args := range [][]string{{"--fair"}, {"--fair"}, {}} {
		startDlock(t, s.Addr(), append(append([]string{"run", "--wait", "forever"}, args...), "busy", "--", "true")...)
	}
	waitSubscribed(t, rdb, "dlock:{busy}", 3)
	waitFor(t, func() bool { return rdb.LLen(t.Context(), "dlock:{busy}:q").Val() == 3 })
	// A place whose waiter died long ago, not yet skipped.
	rdb.RPush(t.Context(), "dlock:{busy}:q", "dead")
	rdb.HSet(t.Context(), "dlock:{busy}:w", "dead", "1000,10000,dlock:{busy}:c:gone")
	st := statusJSON(t, s.Addr(), "busy")
	if st.WaitingClients != 3 || st.InLine != 3 {
		t.Errorf("two --fair waiters and one default: %+v; want 3 clients, 3 in line", st)
	}
	code, out, _ := runDlock(t, s.Addr(), "status", "busy")
	if code != 0 || !strings.Contains(out, "waiting  3 clients with callers waiting; 3 in line at Redis\n") {
		t.Errorf("status busy:\n%s", out)
	}

	ctx := t.Context()
	c := dlock.New(s.Client(t))
	defer c.Close()
	if _, err := c.RWMutex("doc").RLock(ctx); err != nil {
		t.Fatal(err)
	}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	for _, lock := range []func(context.Context) (*dlock.Lease, error){c.RWMutex("doc").Lock, c.RWMutex("doc").RLock} {
		n := rdb.LLen(ctx, "dlock:{doc}:q").Val()
		go func() { _, _ = lock(wctx) }()
		waitFor(t, func() bool { return rdb.LLen(ctx, "dlock:{doc}:q").Val() == n+1 })
	}
	doc := statusJSON(t, s.Addr(), "doc")
	if doc.InLine != 2 || doc.WaitingWriters != 1 || doc.WaitingReaders != 1 || doc.Holders != 1 || doc.Mode != "read" {
		t.Errorf("rwmutex with a reader holding, a writer and a reader waiting: %+v", doc)
	}
	code, out, _ = runDlock(t, s.Addr(), "status", "doc")
	if code != 0 || !strings.Contains(out, "2 in line at Redis (1 reader, 1 writer)") {
		t.Errorf("status doc:\n%s", out)
	}
}

// waitFor polls cond until it holds, for at most procTimeout.
func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(procTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not reached within %v", procTimeout)
		}
		time.Sleep(pollEvery)
	}
}

// On a server without sharded pub/sub (Redis before 7.0, a server with
// SPUBLISH renamed away) dlock clients wait subscribed with SUBSCRIBE:
// status counts them all the same.
func TestStatusCountsPlainSubscribers(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Options{NoShardedPubSub: true})
	rdb := s.Client(t)
	holder := startDlock(t, s.Addr(), "run", "busy", "--", "sh", "-c", `echo ready; exec sleep 30`)
	holder.line()
	for _, args := range [][]string{{"--fair"}, {}} {
		startDlock(t, s.Addr(), append(append([]string{"run", "--wait", "forever"}, args...), "busy", "--", "true")...)
	}
	waitFor(t, func() bool { return rdb.PubSubNumSub(t.Context(), "dlock:{busy}").Val()["dlock:{busy}"] == 2 })
	waitFor(t, func() bool { return rdb.LLen(t.Context(), "dlock:{busy}:q").Val() == 2 })
	st := statusJSON(t, s.Addr(), "busy")
	if st.WaitingClients != 2 || st.InLine != 2 {
		t.Errorf("a --fair waiter and a default one, subscribed with SUBSCRIBE: %+v; want 2 clients, 2 in line", st)
	}
	infos, _ := listJSON(t, s.Addr())
	if len(infos) != 1 || infos[0].WaitingClients != 2 {
		t.Errorf("list: %+v; want busy with 2 waiting clients", infos)
	}

	// miniredis, like Redis before 7.0, has no PUBSUB SHARDNUMSUB at all.
	mr := miniredis.RunT(t)
	c := dlock.New(redis.NewClient(&redis.Options{Addr: mr.Addr()}))
	defer c.Close()
	if _, err := c.Mutex("m").Lock(t.Context()); err != nil {
		t.Fatal(err)
	}
	if st := statusJSON(t, mr.Addr(), "m"); st.State != "held" || st.Type != "mutex" {
		t.Errorf("status of a held mutex on miniredis: %+v", st)
	}
	if infos, _ := listJSON(t, mr.Addr()); len(infos) != 1 || infos[0].State != "held" {
		t.Errorf("list on miniredis: %+v", infos)
	}
}
