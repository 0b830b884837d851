package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestStartSetGet(t *testing.T) {
	t.Parallel()
	s := Start(t)
	if want := "127.0.0.1:" + strconv.Itoa(s.Port()); s.Addr() != want {
		t.Fatalf("Addr() = %q, want %q", s.Addr(), want)
	}
	if fi, err := os.Stat(s.Dir()); err != nil || !fi.IsDir() {
		t.Fatalf("Dir() %q: %v", s.Dir(), err)
	}
	if s.PID() <= 0 {
		t.Fatalf("PID() = %d", s.PID())
	}
	c := s.Client(t)
	if err := c.Set(ctx(t), "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(ctx(t), "k").Result(); err != nil || v != "v" {
		t.Fatalf("GET k = %q, %v", v, err)
	}
	if v := s.Do(t, "GET", "k"); v != "v" {
		t.Fatalf("Do GET k = %#v", v)
	}
	if v := s.Do(t, "GET", "missing"); v != nil {
		t.Fatalf("Do GET missing = %#v, want nil", v)
	}
	if !strings.Contains(s.Log(), "Ready to accept connections") {
		t.Fatalf("log lacks the ready line:\n%s", s.Log())
	}
}

func TestNoShardedPubSub(t *testing.T) {
	t.Parallel()
	c := Start(t, Options{NoShardedPubSub: true}).Client(t)
	for _, cmd := range [][]any{{"SPUBLISH", "ch", "m"}, {"EVAL", "return redis.call('SPUBLISH', 'ch', 'm')", "0"}} {
		if err := c.Do(ctx(t), cmd...).Err(); err == nil || !strings.Contains(strings.ToLower(err.Error()), "unknown") {
			t.Errorf("%v: %v, want an unknown command error", cmd, err)
		}
	}
	if err := c.Publish(ctx(t), "ch", "m").Err(); err != nil {
		t.Errorf("PUBLISH: %v", err)
	}
}

func TestOptionsAndDebug(t *testing.T) {
	t.Parallel()
	s := Start(t, Options{AOF: true, Args: []string{"--maxmemory", "10mb"}})
	c := s.Client(t)
	cfg, err := c.ConfigGet(ctx(t), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{
		"maxmemory":   "10485760",
		"appendonly":  "yes",
		"appendfsync": "everysec",
		"bind":        "127.0.0.1",
		"save":        "",
		"port":        strconv.Itoa(s.Port()),
		"dir":         s.Dir(),
	} {
		if cfg[k] != want {
			t.Errorf("CONFIG GET %s = %q, want %q", k, cfg[k], want)
		}
	}
	if v := s.Do(t, "DEBUG", "SLEEP", "0"); v != "OK" {
		t.Fatalf("DEBUG SLEEP 0 = %#v", v)
	}
}

func TestPauseResume(t *testing.T) {
	t.Parallel()
	s := Start(t)
	c := s.Client(t, func(o *redis.Options) {
		o.ReadTimeout = 200 * time.Millisecond
		o.MaxRetries = -1
	})
	if err := c.Ping(ctx(t)).Err(); err != nil {
		t.Fatal(err)
	}
	s.Pause()
	start := time.Now()
	err := c.Ping(ctx(t)).Err()
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("PING on a paused server: %v, want a timeout", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("timeout took %v", d)
	}
	s.Resume()
	if err := c.Ping(ctx(t)).Err(); err != nil {
		t.Fatalf("PING after Resume: %v", err)
	}
}

func TestRestartWithoutAOFLosesData(t *testing.T) {
	t.Parallel()
	s := Start(t)
	c := s.Client(t) // default retries: reconnects after the restart
	if err := c.Set(ctx(t), "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	port, pid := s.Port(), s.PID()
	s.Kill()
	if alive(pid) {
		t.Fatalf("pid %d alive after Kill", pid)
	}
	if s.PID() != 0 {
		t.Fatalf("PID() after Kill = %d", s.PID())
	}
	if !portFreeSoon(port) {
		t.Fatalf("port %d busy after Kill", port)
	}
	s.Kill() // no-op
	s.Restart(t)
	if s.Port() != port || s.PID() == pid || s.PID() == 0 {
		t.Fatalf("after Restart: port %d (was %d), pid %d (was %d)", s.Port(), port, s.PID(), pid)
	}
	if err := c.Get(ctx(t), "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET k after restart without AOF: %v, want redis.Nil", err)
	}
}

func TestRestartWithAOFAlwaysKeepsData(t *testing.T) {
	t.Parallel()
	s := Start(t, Options{AOF: true, AppendFsync: "always"})
	if v := s.Do(t, "CONFIG", "GET", "appendfsync"); !strings.Contains(strings.ToLower(toString(v)), "always") {
		t.Fatalf("appendfsync: %#v", v)
	}
	s.Do(t, "SET", "k", "v")
	s.Do(t, "INCR", "fence")
	s.Kill()
	s.Restart(t)
	if v := s.Do(t, "GET", "k"); v != "v" {
		t.Fatalf("GET k after restart with AOF always = %#v\n%s", v, s.Log())
	}
	// Restart without Kill kills first.
	pid := s.PID()
	s.Do(t, "INCR", "fence")
	s.Restart(t)
	if alive(pid) {
		t.Fatalf("old pid %d alive after Restart", pid)
	}
	if v := s.Do(t, "GET", "fence"); v != "2" {
		t.Fatalf("GET fence = %#v, want 2", v)
	}
}

func TestSnapshotRestoreLosesLaterWrites(t *testing.T) {
	t.Parallel()
	s := Start(t, Options{AOF: true, AppendFsync: "always"})
	s.Do(t, "SET", "before", "1")
	snap := s.SnapshotDir(t)
	if _, err := os.Stat(filepath.Join(snap, "appendonlydir")); err != nil {
		t.Fatalf("snapshot lacks the AOF dir: %v", err)
	}
	s.Do(t, "SET", "after", "1")
	s.Kill()
	s.RestoreDir(t, snap)
	s.Restart(t)
	if v := s.Do(t, "GET", "before"); v != "1" {
		t.Fatalf("GET before = %#v", v)
	}
	if v := s.Do(t, "GET", "after"); v != nil {
		t.Fatalf("GET after = %#v, want nil (lost with the tail)", v)
	}
	if !strings.Contains(s.Log(), "Ready to accept connections") {
		t.Fatalf("log lost across RestoreDir:\n%s", s.Log())
	}
}

func TestMasters(t *testing.T) {
	t.Parallel()
	ms := Masters(t, 3)
	if len(ms) != 3 {
		t.Fatalf("got %d servers", len(ms))
	}
	ports, pids, dirs := map[int]bool{}, map[int]bool{}, map[string]bool{}
	for i, m := range ms {
		ports[m.Port()], pids[m.PID()], dirs[m.Dir()] = true, true, true
		m.Do(t, "SET", "who", i)
	}
	if len(ports) != 3 || len(pids) != 3 || len(dirs) != 3 {
		t.Fatalf("not distinct: ports %v pids %v dirs %v", ports, pids, dirs)
	}
	for i, m := range ms {
		if v := m.Do(t, "GET", "who"); v != strconv.Itoa(i) {
			t.Fatalf("server %d: who = %#v", i, v)
		}
	}
}

func TestCleanupKillsEverything(t *testing.T) {
	t.Parallel()
	type rec struct{ pid, port int }
	var recs []rec
	t.Run("inner", func(t *testing.T) {
		s := Start(t)
		s.Pause() // cleanup must SIGCONT+SIGKILL a stopped server
		recs = append(recs, rec{s.PID(), s.Port()})
		for _, m := range Masters(t, 2, Options{AOF: true}) {
			recs = append(recs, rec{m.PID(), m.Port()})
		}
		r := Start(t)
		r.Kill()
		r.Restart(t)
		recs = append(recs, rec{r.PID(), r.Port()})
	})
	for _, r := range recs {
		if alive(r.pid) {
			t.Errorf("pid %d alive after cleanup", r.pid)
		}
		if !portFreeSoon(r.port) {
			t.Errorf("port %d busy after cleanup", r.port)
		}
	}
}

func TestParallelStarts(t *testing.T) {
	t.Parallel()
	ms := Masters(t, 5)
	for _, m := range ms {
		if v := m.Do(t, "PING"); v != "PONG" {
			t.Fatalf("PING = %#v", v)
		}
	}
}

// fakeTB records Fatalf and stops the goroutine like testing.T does.
type fakeTB struct {
	testing.TB
	mu  sync.Mutex
	msg string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.mu.Lock()
	f.msg = strings.TrimSpace(fmt.Sprintf(format, args...))
	f.mu.Unlock()
	runtime.Goexit()
}

func TestMissingBinaryFailsWithInstallHint(t *testing.T) {
	t.Setenv("REDISTEST_REDIS_SERVER", filepath.Join(t.TempDir(), "no-such-redis-server"))
	f := &fakeTB{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Start(f)
		t.Error("Start returned without failing")
	}()
	<-done
	if !strings.Contains(f.msg, "apt-get install -y redis-server") || !strings.Contains(f.msg, "make test") {
		t.Fatalf("message lacks the install hint: %q", f.msg)
	}
}

// portFreeSoon reports whether the port accepts a listener within a second.
// Kill already waited for that; the retry only absorbs another process on
// this shared machine probing the same port at the same instant.
func portFreeSoon(port int) bool {
	deadline := time.Now().Add(time.Second)
	for !portFree(port) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

func portFree(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

func alive(pid int) bool {
	return syscall.Kill(pid, 0) == nil
}

func toString(v any) string {
	switch v := v.(type) {
	case string:
		return v
	default:
		return fmt.Sprintf("%v", v)
	}
}
