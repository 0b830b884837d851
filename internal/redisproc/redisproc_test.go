//go:build linux

package redisproc

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// start starts a server in a t.TempDir, closed when the test ends.
func start(t *testing.T, cfg Config) *Server {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	s, err := Start(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func client(t *testing.T, addr string) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true, MaxRetries: -1})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// answeringPID returns the process_id that the server at addr reports.
func answeringPID(t *testing.T, addr string) int {
	t.Helper()
	info, err := probe(addr, nil)
	if err != nil {
		t.Fatalf("probe %s: %v", addr, err)
	}
	pid, _ := strconv.Atoi(InfoField(info, "process_id"))
	return pid
}

// stranger is a redis-server that redisproc did not start, as another
// program on the machine would run it.
type stranger struct {
	port int
	pid  int
	rdb  *redis.Client
}

// startStranger runs a redis-server on a port of its own and stores a key
// in it, so that a test can see it was left alone.
func startStranger(t *testing.T) *stranger {
	t.Helper()
	port, err := reservePort()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { releasePort(port) })
	return startStrangerOn(t, port)
}

func startStrangerOn(t *testing.T, port int) *stranger {
	t.Helper()
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--dir", t.TempDir(), "--daemonize", "no", "--logfile", "")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	st := &stranger{port: port, pid: cmd.Process.Pid, rdb: client(t, loopback(port))}
	deadline := time.Now().Add(10 * time.Second)
	for st.rdb.Set(context.Background(), "precious", "data", 0).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("the stranger on port %d did not start", port)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return st
}

// intact fails the test unless the stranger runs with its key.
func (st *stranger) intact(t *testing.T) {
	t.Helper()
	if v, err := st.rdb.Get(context.Background(), "precious").Result(); err != nil || v != "data" {
		t.Fatalf("the stranger on port %d lost its key: %q, %v", st.port, v, err)
	}
}

// listenOn holds a port with a plain listener that never answers.
func listenOn(t *testing.T) int {
	t.Helper()
	port, err := reservePort()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { releasePort(port) })
	l, err := net.Listen("tcp", loopback(port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return port
}

// handOut replaces choosePort for the test: it returns ports in turn, then
// whatever next returns. It counts the calls.
func handOut(t *testing.T, ports []int, next func() (int, error)) *int {
	calls := new(int)
	choosePort = func() (int, error) {
		*calls++
		if len(ports) > 0 {
			p := ports[0]
			ports = ports[1:]
			return p, nil
		}
		return next()
	}
	t.Cleanup(func() { choosePort = reservePort })
	return calls
}

func alive(pid int) bool { return syscall.Kill(pid, 0) == nil }

// TestStartKillRestartClose: the life of one server, in a directory Start
// makes.
func TestStartKillRestartClose(t *testing.T) {
	t.Setenv("TMPDIR", t.TempDir())
	s, err := Start(t.Context(), Config{TempPrefix: "redisproc-test-"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	root := filepath.Dir(s.Dir())
	if !strings.HasPrefix(filepath.Base(root), "redisproc-test-"+strconv.Itoa(os.Getpid())+"-") {
		t.Errorf("directory %s is not named for the prefix and our pid", root)
	}
	if got := answeringPID(t, s.Addr()); got != s.PID() || got == 0 {
		t.Fatalf("%s is answered by pid %d, PID() = %d", s.Addr(), got, s.PID())
	}
	if s.Version() == "" {
		t.Errorf("Version() = %q", s.Version())
	}
	rdb := client(t, s.Addr())
	if err := rdb.Set(t.Context(), "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}

	port, pid := s.Port(), s.PID()
	s.Kill()
	if alive(pid) || s.PID() != 0 {
		t.Fatalf("after Kill: pid %d alive %v, PID() = %d", pid, alive(pid), s.PID())
	}
	if err := s.Pause(); err == nil {
		t.Error("Pause of a killed server succeeded")
	}
	if err := s.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	if s.Port() != port || s.PID() == pid || answeringPID(t, s.Addr()) != s.PID() {
		t.Fatalf("after Restart: port %d (was %d), pid %d (was %d)", s.Port(), port, s.PID(), pid)
	}
	if err := rdb.Get(t.Context(), "k").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET k after a restart without persistence: %v, want redis.Nil", err)
	}

	pid = s.PID()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if alive(pid) {
		t.Errorf("pid %d alive after Close", pid)
	}
	if _, err := os.Stat(root); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s after Close: %v, want it removed", root, err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := s.Restart(t.Context()); err == nil {
		t.Error("Restart after Close succeeded")
	}
}

// TestStrangersOnChosenPorts imitates the race between choosing a port and
// binding it: the first port handed out is taken by another redis-server,
// the second by a listener that never answers. Start must skip both, and
// leave the stranger alone.
func TestStrangersOnChosenPorts(t *testing.T) {
	st := startStranger(t)
	quiet := listenOn(t)
	calls := handOut(t, []int{st.port, quiet}, reservePort)

	s := start(t, Config{})
	if s.Port() == st.port || s.Port() == quiet {
		t.Fatalf("Start returned a server on a taken port %d", s.Port())
	}
	if *calls != 3 {
		t.Errorf("%d ports chosen, want 3", *calls)
	}
	if got := answeringPID(t, s.Addr()); got != s.PID() {
		t.Fatalf("%s is answered by pid %d, not by ours (%d)", s.Addr(), got, s.PID())
	}
	st.intact(t)
}

// TestStrangerIsNeverTakenForOurs: our redis-server listens on no TCP port
// at all (--port 0), so nothing tells a stranger on the chosen port from it
// but the pid. Start must refuse it every time and give up within its
// bounds, with no process of ours left running.
func TestStrangerIsNeverTakenForOurs(t *testing.T) {
	st := startStranger(t)
	calls := handOut(t, nil, func() (int, error) { return st.port, nil })

	_, err := Start(t.Context(), Config{Dir: t.TempDir(), Args: []string{"--port", "0"}, Timeout: 10 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "another process") {
		t.Fatalf("Start with a stranger on every port: %v, want an error naming another process", err)
	}
	if *calls < 2 || *calls > startAttempts {
		t.Errorf("%d ports tried, want more than one and at most %d", *calls, startAttempts)
	}
	if left := redisChildren(t, st.pid); len(left) > 0 {
		t.Errorf("redis-server children left running: %v", left)
	}
	st.intact(t)
}

// TestRestartRefusesStrangerOnItsPort: a server killed and restarted keeps
// its port; if a stranger has taken it meanwhile, Restart fails rather
// than hand the stranger over, and succeeds once the port is free again.
func TestRestartRefusesStrangerOnItsPort(t *testing.T) {
	s := start(t, Config{Timeout: 2 * time.Second})
	s.Kill()
	st := startStrangerOn(t, s.Port())

	err := s.Restart(t.Context())
	if err == nil || !strings.Contains(err.Error(), "another process") {
		t.Fatalf("Restart with a stranger on the port: %v, want an error naming another process", err)
	}
	if s.PID() != 0 {
		t.Errorf("PID() = %d after a failed Restart", s.PID())
	}
	st.intact(t)

	_ = syscall.Kill(st.pid, syscall.SIGKILL)
	waitPortFree(s.Port(), 5*time.Second)
	if err := s.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := answeringPID(t, s.Addr()); got != s.PID() {
		t.Fatalf("after Restart %s is answered by pid %d, not by ours (%d)", s.Addr(), got, s.PID())
	}
}

// TestBadConfigFailsWithLog: a server that cannot start is reported at
// once, with its own words, and leaves no directory behind.
func TestBadConfigFailsWithLog(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	calls := handOut(t, nil, reservePort)
	_, err := Start(t.Context(), Config{Args: []string{"--no-such-directive", "1"}})
	if err == nil || !strings.Contains(err.Error(), "Bad directive") || !strings.Contains(err.Error(), "no-such-directive") {
		t.Fatalf("Start with a bad directive: %v, want an error quoting redis-server's complaint", err)
	}
	if *calls != 1 {
		t.Errorf("%d attempts, want 1: a bad config is not a taken port", *calls)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("left in TMPDIR: %v", left)
	}

	_, err = Start(t.Context(), Config{Bin: filepath.Join(tmp, "no-redis-server"), Dir: t.TempDir()})
	if !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Start with a missing binary: %v, want fs.ErrNotExist", err)
	}
}

// TestReadyWaitsForLoading: with every key's load slowed down, a server
// restarted on its RDB file answers LOADING for a while; Restart must
// return only once the data is there.
func TestReadyWaitsForLoading(t *testing.T) {
	t.Parallel()
	const keys = 5000
	s := start(t, Config{Args: []string{
		"--enable-debug-command", "yes",
		"--key-load-delay", "100", // microseconds per key: half a second
		"--loading-process-events-interval-bytes", "1024", // answer (LOADING) while loading
	}})
	rdb := client(t, s.Addr())
	if err := rdb.Do(t.Context(), "DEBUG", "POPULATE", keys).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Save(t.Context()).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n, err := rdb.DBSize(t.Context()).Result(); err != nil || n != keys {
		t.Fatalf("DBSIZE right after Restart: %d, %v; want %d", n, err, keys)
	}
	if !strings.Contains(s.Log(), "Done loading RDB") {
		t.Errorf("the log does not show the load:\n%s", s.Log())
	}
}

// TestPauseResume: a paused server answers nothing until Resume.
func TestPauseResume(t *testing.T) {
	t.Parallel()
	s := start(t, Config{})
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	if _, err := probe(s.Addr(), nil); err == nil {
		t.Fatal("a paused server answered")
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	if got := answeringPID(t, s.Addr()); got != s.PID() {
		t.Fatalf("after Resume: pid %d answers, want %d", got, s.PID())
	}
}

// TestSentinelMode: Sentinel gets a config file of its own and counts as
// ready without a loading phase.
func TestSentinelMode(t *testing.T) {
	t.Parallel()
	s := start(t, Config{Sentinel: true})
	info, err := probe(s.Addr(), nil)
	if err != nil || InfoField(info, "redis_mode") != "sentinel" {
		t.Fatalf("redis_mode %q, %v; want sentinel", InfoField(info, "redis_mode"), err)
	}
	if _, err := os.Stat(filepath.Join(s.Dir(), "sentinel.conf")); err != nil {
		t.Fatal(err)
	}
}
