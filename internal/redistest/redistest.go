// Package redistest starts real redis-server processes for tests.
//
// Every server listens on loopback (127.0.0.1) only, keeps its data in a
// t.TempDir() directory, and is killed (SIGCONT, then SIGKILL to its process
// group) and reaped by t.Cleanup when the test that started it ends, even if
// the test left it stopped with Pause. No mocks and no Docker: the tests that
// use this package exercise the same redis-server binary users run, so faults
// such as a paused server, a crash without persistence or the loss of the
// un-fsynced AOF tail are the real thing.
//
// The binary is looked up as $REDISTEST_REDIS_SERVER, then redis-server in
// $PATH, then /usr/bin/redis-server and /usr/local/bin/redis-server. If none
// exists, Start fails the test (it never skips) and says how to install it.
//
// A server can be killed and restarted on the same port and directory, so
// clients that reconnect to the same address see the restarted server;
// SnapshotDir and RestoreDir imitate a power loss by rolling the data
// directory back to an earlier copy.
package redistest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
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

const (
	// readyTimeout bounds how long a (re)started server may take to answer
	// PING and finish loading its data.
	readyTimeout = 10 * time.Second
	// restartPortTimeout bounds how long Restart waits for its port to be
	// free again.
	restartPortTimeout = 10 * time.Second
	// killPortTimeout bounds how long Kill waits for the port to be free.
	killPortTimeout = 5 * time.Second
	// startAttempts bounds how many random ports Start tries.
	startAttempts = 30
	// probeDialTimeout is the dial timeout of one readiness probe.
	probeDialTimeout = 200 * time.Millisecond
)

// Options for Start.
type Options struct {
	// AOF turns on the append-only file (appendonly yes).
	AOF bool
	// AppendFsync is "always", "everysec" (the default when AOF is set) or
	// "no".
	AppendFsync string
	// Args are extra redis-server config arguments, appended after the
	// harness's own (so they override them), e.g. {"--maxmemory", "10mb"}.
	Args []string
	// Sentinel runs redis-server in Sentinel mode, with a config file of
	// its own in the data directory (Sentinel rewrites it).
	Sentinel bool
}

// Server is one redis-server process on 127.0.0.1. Its port and data
// directory stay the same across Kill and Restart. All methods are safe for
// concurrent use.
type Server struct {
	bin       string
	opts      Options
	base      string // root temp dir: holds dir, the log and the stdio file
	dir       string // data dir (--dir)
	logPath   string // --logfile
	stdioPath string // redis-server's stdout and stderr (config errors)

	mu   sync.Mutex
	port int   // fixed once the first start succeeds
	proc *proc // the running process, nil when killed
}

// proc is one redis-server process and its reaper.
type proc struct {
	cmd  *exec.Cmd
	pid  int
	done chan struct{} // closed once the process has been reaped
	err  error         // cmd.Wait's result, valid after done is closed
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// kill sends SIGCONT and SIGKILL to the process group (redis forks children
// for AOF rewrites) and waits until the leader has been reaped.
func (p *proc) kill() {
	if !p.exited() {
		// While the leader is not reaped its pid cannot be reused, so the
		// group id is still ours.
		_ = syscall.Kill(-p.pid, syscall.SIGCONT)
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
		_ = p.cmd.Process.Signal(syscall.SIGKILL)
	}
	<-p.done
}

// Start starts one redis-server on a free loopback port and waits until it
// answers PING. The server is killed when the test ends. If redis-server is
// not installed, Start fails the test with instructions; it never skips.
func Start(t testing.TB, opts ...Options) *Server {
	t.Helper()
	s := newServer(t, opts)
	if err := s.startFresh(); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return s
}

// Masters starts n independent servers in parallel (for quorum tests), each
// with the same options.
func Masters(t testing.TB, n int, opts ...Options) []*Server {
	t.Helper()
	servers := make([]*Server, n)
	for i := range servers {
		servers[i] = newServer(t, opts)
	}
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i, s := range servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = s.startFresh()
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("redistest: Masters(%d): %v", n, err)
	}
	return servers
}

// newServer validates the options, creates the directories and registers the
// cleanup. It does not start a process.
func newServer(t testing.TB, opts []Options) *Server {
	t.Helper()
	var o Options
	switch len(opts) {
	case 0:
	case 1:
		o = opts[0]
	default:
		t.Fatalf("redistest: at most one Options value may be given, got %d", len(opts))
	}
	switch o.AppendFsync {
	case "", "always", "everysec", "no":
	default:
		t.Fatalf("redistest: AppendFsync must be \"always\", \"everysec\" or \"no\", got %q", o.AppendFsync)
	}
	o.Args = append([]string(nil), o.Args...)

	bin, err := findRedisServer()
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	base := t.TempDir()
	s := &Server{
		bin:       bin,
		opts:      o,
		base:      base,
		dir:       filepath.Join(base, "data"),
		logPath:   filepath.Join(base, "redis.log"),
		stdioPath: filepath.Join(base, "stdio.log"),
	}
	if err := os.Mkdir(s.dir, 0o755); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	if o.Sentinel {
		if err := os.WriteFile(filepath.Join(s.dir, "sentinel.conf"), nil, 0o644); err != nil {
			t.Fatalf("redistest: %v", err)
		}
	}
	// Registered after t.TempDir, so it runs before the directory is
	// removed.
	t.Cleanup(s.stop)
	return s
}

// findRedisServer returns the redis-server binary to run.
func findRedisServer() (string, error) {
	if p := os.Getenv("REDISTEST_REDIS_SERVER"); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("REDISTEST_REDIS_SERVER=%s: %v; install redis-server with `apt-get install -y redis-server` (make test installs it)", p, err)
		}
		return p, nil
	}
	if p, err := exec.LookPath("redis-server"); err == nil {
		return p, nil
	}
	for _, p := range []string{"/usr/bin/redis-server", "/usr/local/bin/redis-server"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New("redis-server is not installed (not in $PATH, /usr/bin or /usr/local/bin); " +
		"install it with `apt-get install -y redis-server` (make test installs it), " +
		"or point REDISTEST_REDIS_SERVER at the binary")
}

// stop is the cleanup: kill the process and give the port back.
func (s *Server) stop() {
	s.Kill()
	s.mu.Lock()
	port := s.port
	s.mu.Unlock()
	if port != 0 {
		releasePort(port)
	}
}

// startFresh starts the first process, trying random ports until one binds.
func (s *Server) startFresh() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var lastErr error
	for range startAttempts {
		port, err := reservePort()
		if err != nil {
			return err
		}
		p, busy, err := s.launch(port)
		if busy {
			// Leave the port marked as taken: someone else holds it.
			lastErr = err
			continue
		}
		if err != nil {
			releasePort(port)
			return err
		}
		s.port, s.proc = port, p
		return nil
	}
	return fmt.Errorf("no free port after %d attempts; last error: %v", startAttempts, lastErr)
}

// args returns redis-server's command line for port.
func (s *Server) args(port int) []string {
	var a []string
	if s.opts.Sentinel {
		a = append(a, filepath.Join(s.dir, "sentinel.conf"), "--sentinel")
	}
	a = append(a,
		"--port", strconv.Itoa(port),
		"--bind", "127.0.0.1",
		"--save", "",
		"--dir", s.dir,
		"--logfile", s.logPath,
		"--daemonize", "no",
		"--protected-mode", "no",
		"--enable-debug-command", "yes",
	)
	fsync := s.opts.AppendFsync
	if s.opts.AOF {
		if fsync == "" {
			fsync = "everysec"
		}
		a = append(a, "--appendonly", "yes")
	}
	if fsync != "" {
		a = append(a, "--appendfsync", fsync)
	}
	return append(a, s.opts.Args...)
}

// launch starts a process on port and waits until it is ready. busy reports
// that the port was taken by someone else (the caller may retry); the process
// is then gone. On any error no process is left running.
func (s *Server) launch(port int) (p *proc, busy bool, err error) {
	logOff := fileSize(s.logPath)
	stdioOff := fileSize(s.stdioPath)

	stdio, err := os.OpenFile(s.stdioPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, false, err
	}
	cmd := exec.Command(s.bin, s.args(port)...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = stdio, stdio
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// Own process group: a Ctrl-C on the test does not reach it, and
		// kill can signal its forked children too.
		Setpgid: true,
		// Die with the test binary even if cleanup never runs (panic,
		// -timeout). spawn starts it from a thread that never exits.
		Pdeathsig: syscall.SIGKILL,
	}
	err = spawn(cmd)
	stdio.Close()
	if err != nil {
		return nil, false, fmt.Errorf("starting %s: %v", s.bin, err)
	}
	p = &proc{cmd: cmd, pid: cmd.Process.Pid, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()

	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	newOutput := func() string {
		return tail(readFrom(s.logPath, logOff)+readFrom(s.stdioPath, stdioOff), 40)
	}
	deadline := time.Now().Add(readyTimeout)
	backoff := 2 * time.Millisecond
	var lastErr error
	for {
		if p.exited() {
			out := newOutput()
			if strings.Contains(out, "Address already in use") {
				return nil, true, fmt.Errorf("port %d in use", port)
			}
			return nil, false, fmt.Errorf("redis-server on %s exited before it was ready (%v); its output:\n%s", addr, p.err, out)
		}
		info, err := probe(addr)
		if err == nil {
			pid, _ := strconv.Atoi(infoField(info, "process_id"))
			switch {
			case pid != p.pid:
				// Another process (another test binary) owns the port; ours
				// will fail to bind, if it has not already.
				p.kill()
				return nil, true, fmt.Errorf("port %d answered by pid %d, not ours (%d)", port, pid, p.pid)
			case infoField(info, "loading") == "0" || infoField(info, "redis_mode") == "sentinel":
				return p, false, nil
			default:
				err = errors.New("still loading")
			}
		}
		lastErr = err
		if time.Now().After(deadline) {
			p.kill()
			return nil, false, fmt.Errorf("redis-server on %s not ready after %v (last probe: %v); its output:\n%s", addr, readyTimeout, lastErr, newOutput())
		}
		select {
		case <-p.done:
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 50*time.Millisecond)
	}
}

// probe sends PING and INFO on a fresh connection and returns INFO's text.
// It fails unless PING answers PONG (during loading it answers LOADING).
func probe(addr string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, probeDialTimeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(2 * time.Second)); err != nil {
		return "", err
	}
	if _, err := io.WriteString(c, "*1\r\n$4\r\nPING\r\n*1\r\n$4\r\nINFO\r\n"); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	if line = strings.TrimRight(line, "\r\n"); line != "+PONG" {
		return "", fmt.Errorf("PING: %s", line)
	}
	line, err = r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	n, err := strconv.Atoi(strings.TrimPrefix(line, "$"))
	if !strings.HasPrefix(line, "$") || err != nil || n < 0 {
		return "", fmt.Errorf("INFO: %s", line)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		return "", err
	}
	return string(buf), nil
}

// infoField returns the value of "name:value" in INFO output.
func infoField(info, name string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

// Addr returns "127.0.0.1:PORT".
func (s *Server) Addr() string {
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port()))
}

// Port returns the TCP port; it stays the same across Restart.
func (s *Server) Port() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.port
}

// Dir returns the server's data directory (--dir; the AOF directory lives
// inside it). The log file is kept outside it, so RestoreDir keeps the log.
func (s *Server) Dir() string { return s.dir }

// PID returns the pid of the current process, or 0 after Kill.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return 0
	}
	return s.proc.pid
}

// Client returns a new go-redis client for the server, closed when the test
// ends. Each opts function may change the options before the client is made
// (timeouts, retries, protocol...). CLIENT SETINFO is disabled by default
// since redis 7.0 does not know it.
func (s *Server) Client(t testing.TB, opts ...func(*redis.Options)) *redis.Client {
	t.Helper()
	o := &redis.Options{Addr: s.Addr(), DisableIdentity: true}
	for _, f := range opts {
		f(o)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Kill sends SIGKILL (after SIGCONT, in case it is paused) and returns once
// the process has been reaped and the port accepts a new listener. Nothing
// is flushed: what was not yet written to the AOF is lost. Kill on a killed
// server does nothing.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killLocked()
}

func (s *Server) killLocked() {
	p := s.proc
	if p == nil {
		return
	}
	s.proc = nil
	p.kill()
	waitPortFree(s.port, killPortTimeout)
}

// Pause stops the process with SIGSTOP: connections stay open, nothing is
// answered until Resume.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused process with SIGCONT.
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil && !s.proc.exited() {
		_ = s.proc.cmd.Process.Signal(sig)
	}
}

// Restart starts the server again on the same port and directory with the
// same options (killing it first if it is running) and waits until it
// answers PING and has finished loading its AOF or RDB file. If the port is
// briefly taken, it retries for a bounded time.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killLocked()
	deadline := time.Now().Add(restartPortTimeout)
	for {
		p, busy, err := s.launch(s.port)
		if err == nil {
			s.proc = p
			return
		}
		if !busy || time.Now().After(deadline) {
			t.Fatalf("redistest: restart on port %d: %v", s.port, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// SnapshotDir copies the data directory (the AOF directory included) to a
// new temporary directory and returns its path. Files are copied as they are
// on disk, as the page cache sees them; take it before the writes that a
// power loss should drop.
func (s *Server) SnapshotDir(t testing.TB) string {
	t.Helper()
	snap := t.TempDir()
	if err := copyDir(s.dir, snap); err != nil {
		t.Fatalf("redistest: snapshot of %s: %v", s.dir, err)
	}
	return snap
}

// RestoreDir replaces the data directory with the contents of snap (from
// SnapshotDir), imitating a power loss that drops the un-fsynced tail. The
// server must be killed; Restart it afterwards.
func (s *Server) RestoreDir(t testing.TB, snap string) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc != nil {
		t.Fatalf("redistest: RestoreDir on a running server (pid %d); call Kill first", s.proc.pid)
	}
	if err := os.RemoveAll(s.dir); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	if err := os.Mkdir(s.dir, 0o755); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	if err := copyDir(snap, s.dir); err != nil {
		t.Fatalf("redistest: restore %s from %s: %v", s.dir, snap, err)
	}
}

// Do runs one command on a fresh connection that is closed afterwards, and
// returns its reply (nil for a nil reply). Any error fails the test. It is a
// helper for test setup and inspection.
func (s *Server) Do(t testing.TB, args ...any) any {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:            s.Addr(),
		PoolSize:        1,
		MaxRetries:      -1,
		DisableIdentity: true,
		DialTimeout:     2 * time.Second,
		ReadTimeout:     10 * time.Second,
		WriteTimeout:    5 * time.Second,
	})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	v, err := c.Do(ctx, args...).Result()
	if errors.Is(err, redis.Nil) {
		return nil
	}
	if err != nil {
		t.Fatalf("redistest: %s %v: %v", s.Addr(), args, err)
	}
	return v
}

// Log returns the contents of the server's log file (all runs, Restart
// appends), followed by anything it wrote to stdout or stderr, for failure
// messages.
func (s *Server) Log() string {
	out := readFrom(s.logPath, 0)
	if stdio := readFrom(s.stdioPath, 0); stdio != "" {
		out += "--- stdout/stderr ---\n" + stdio
	}
	return out
}

// spawn starts cmd from one OS thread that never exits, so Pdeathsig fires
// only when the test binary dies (it is tied to the thread that forked).
var (
	spawnOnce sync.Once
	spawnCh   chan spawnReq
)

type spawnReq struct {
	cmd *exec.Cmd
	err chan error
}

func spawn(cmd *exec.Cmd) error {
	spawnOnce.Do(func() {
		spawnCh = make(chan spawnReq)
		go func() {
			runtime.LockOSThread() // never unlocked: the thread lives on
			for r := range spawnCh {
				r.err <- r.cmd.Start()
			}
		}()
	})
	r := spawnReq{cmd: cmd, err: make(chan error, 1)}
	spawnCh <- r
	return <-r.err
}

// Ports: random, below the kernel's ephemeral range when possible so a
// client's outgoing connection never holds a server port (nor self-connects
// to it while the server is down), and never two live servers of this
// process on one port. Other processes are handled by the retry loop.
var (
	portsMu    sync.Mutex
	portsTaken = map[int]bool{}
	portLo     int
	portHi     int
	portsOnce  sync.Once
)

func portRange() (lo, hi int) {
	portsOnce.Do(func() {
		portLo, portHi = 20000, 60000
		b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
		if err != nil {
			return
		}
		f := strings.Fields(string(b))
		if len(f) != 2 {
			return
		}
		elo, err1 := strconv.Atoi(f[0])
		ehi, err2 := strconv.Atoi(f[1])
		if err1 != nil || err2 != nil {
			return
		}
		switch {
		case elo-1-portLo >= 2000:
			portHi = min(portHi, elo-1)
		case portHi-(ehi+1) >= 2000:
			portLo = max(portLo, ehi+1)
		}
	})
	return portLo, portHi
}

// reservePort picks a random port that no live server of this process uses
// and that accepts a listener right now.
func reservePort() (int, error) {
	lo, hi := portRange()
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 1000 {
		port := lo + rand.IntN(hi-lo+1)
		if portsTaken[port] {
			continue
		}
		portsTaken[port] = true
		if !portFree(port) {
			continue // leave it marked: someone holds it
		}
		return port, nil
	}
	return 0, fmt.Errorf("no free port in %d-%d", lo, hi)
}

func releasePort(port int) {
	portsMu.Lock()
	defer portsMu.Unlock()
	delete(portsTaken, port)
}

// portFree reports whether 127.0.0.1:port accepts a listener (with
// SO_REUSEADDR, as redis uses).
func portFree(port int) bool {
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return false
	}
	_ = l.Close()
	return true
}

func waitPortFree(port int, timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for !portFree(port) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// readFrom returns the file's contents from offset on ("" if missing).
func readFrom(path string, off int64) string {
	b, err := os.ReadFile(path)
	if err != nil || off > int64(len(b)) {
		return ""
	}
	return string(b[off:])
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// copyDir copies the regular files and directories under src into dst,
// which must exist.
func copyDir(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case d.IsDir():
			return os.Mkdir(target, info.Mode().Perm()|0o700)
		case d.Type().IsRegular():
			return copyFile(path, target, info.Mode().Perm())
		default:
			return nil // sockets, symlinks: redis keeps none here
		}
	})
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
