// Package redistest starts real redis-server processes for tests, and
// puts them together in the topologies dlock's tests need: single servers,
// independent masters, a primary with a replica and sentinels, a cluster.
//
// Every server is started by internal/redisproc: it listens on loopback
// (127.0.0.1) only, is verified to be the process we started, keeps its
// data in a t.TempDir() directory, and is killed (SIGCONT, then SIGKILL to
// its process group) and reaped by t.Cleanup when the test that started it
// ends, even if the test left it stopped with Pause; if the test binary
// dies first, the kernel kills it. No mocks and no Docker: the tests that
// use this package exercise the same redis-server binary users run, so faults
// such as a paused server, a crash without persistence or the loss of the
// un-fsynced AOF tail are the real thing.
//
// The binary is looked up as $REDISTEST_REDIS_SERVER, then redis-server in
// $PATH, then /usr/bin/redis-server and /usr/local/bin/redis-server. If none
// exists, Start fails the test (it never skips) and says how to install it.
// A server whose wall clock the test moves (Options.ClockShift) also needs a
// C compiler, for its LD_PRELOAD shim: without one the test is skipped,
// saying what to install.
//
// A server can be killed and restarted on the same port and directory, so
// clients that reconnect to the same address see the restarted server;
// SnapshotDir and RestoreDir imitate a power loss by rolling the data
// directory back to an earlier copy.
package redistest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/redisproc"
	"github.com/dlock-go/dlock/internal/testcert"
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
	// NoShardedPubSub renames SPUBLISH, SSUBSCRIBE and SUNSUBSCRIBE away
	// (rename-command NAME ""), so that the server answers them, from
	// clients and scripts alike, as a Redis before 7.0 does: unknown
	// command.
	NoShardedPubSub bool
	// ClockShift starts the server with an LD_PRELOAD shim, built from C
	// source by the system's C compiler, that moves its wall clock by the
	// offset SetClockOffset sets (0 at first). Linux only; without a C
	// compiler the test is skipped, saying what to install.
	ClockShift bool
	// TLS, if not nil, makes the server speak TLS only (rediss://), with
	// certs' server certificate; Client and Do then connect over TLS,
	// trusting certs' CA. Default nil: plain text.
	TLS *testcert.Certs
	// TLSAuthClients makes a TLS server require a client certificate that
	// certs' CA signed (tls-auth-clients yes); Client and Do present
	// certs' client certificate. Default false: none is asked for.
	TLSAuthClients bool
}

// Server is one redis-server process on 127.0.0.1, started by
// internal/redisproc. Its port and data directory stay the same across
// Kill and Restart. All methods are safe for concurrent use.
type Server struct {
	p         *redisproc.Server
	tls       *tls.Config // the client side of Options.TLS; nil in plain text
	clockFile string      // the offset file, with ClockShift; else ""
}

// Start starts one redis-server on a free loopback port and waits until it
// answers PING. The server is killed when the test ends. If redis-server is
// not installed, Start fails the test with instructions; it never skips.
func Start(t testing.TB, opts ...Options) *Server {
	t.Helper()
	return Masters(t, 1, opts...)[0]
}

// Masters starts n independent servers in parallel (for quorum tests), each
// with the same options.
func Masters(t testing.TB, n int, opts ...Options) []*Server {
	t.Helper()
	cfg, shim := config(t, opts)
	servers := make([]*Server, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range servers {
		c := cfg
		c.Dir = t.TempDir()
		var clockFile string
		if shim != "" {
			var err error
			if clockFile, c.Env, err = clockShiftEnv(shim, c.Dir); err != nil {
				t.Fatalf("redistest: %v", err)
			}
		}
		wg.Go(func() {
			p, err := redisproc.Start(context.Background(), c)
			if err != nil {
				errs[i] = err
				return
			}
			servers[i] = &Server{p: p, clockFile: clockFile, tls: p.TLSConfig()}
		})
	}
	wg.Wait()
	for _, s := range servers {
		if s != nil {
			// Registered after t.TempDir, so it runs before the directory
			// is removed.
			t.Cleanup(func() { _ = s.p.Close() })
		}
	}
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	return servers
}

// config validates the options and turns them into redisproc's; shim is
// the clock-shift shim's path with ClockShift, else "".
func config(t testing.TB, opts []Options) (cfg redisproc.Config, shim string) {
	t.Helper()
	var o Options
	switch len(opts) {
	case 0:
	case 1:
		o = opts[0]
	default:
		t.Fatalf("redistest: at most one Options value may be given, got %d", len(opts))
	}
	fsync := o.AppendFsync
	switch fsync {
	case "", "always", "everysec", "no":
	default:
		t.Fatalf("redistest: AppendFsync must be \"always\", \"everysec\" or \"no\", got %q", fsync)
	}
	bin, err := findRedisServer()
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	args := []string{"--protected-mode", "no", "--enable-debug-command", "yes"}
	if o.AOF {
		if fsync == "" {
			fsync = "everysec"
		}
		args = append(args, "--appendonly", "yes")
	}
	if fsync != "" {
		args = append(args, "--appendfsync", fsync)
	}
	if o.NoShardedPubSub {
		for _, cmd := range []string{"spublish", "ssubscribe", "sunsubscribe"} {
			args = append(args, "--rename-command", cmd, "")
		}
	}
	if o.ClockShift {
		shim = buildClockShift(t)
	}
	cfg = redisproc.Config{Bin: bin, Args: append(args, o.Args...), Sentinel: o.Sentinel}
	switch {
	case o.TLS != nil:
		auth := "no"
		if o.TLSAuthClients {
			auth = "yes"
		}
		cfg.TLS = &redisproc.TLS{
			CertFile: o.TLS.CertFile, KeyFile: o.TLS.KeyFile, CAFile: o.TLS.CAFile,
			AuthClients: auth, Client: o.TLS.ClientConfig(o.TLSAuthClients),
		}
	case o.TLSAuthClients:
		t.Fatal("redistest: TLSAuthClients needs TLS")
	}
	return cfg, shim
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

// Addr returns "127.0.0.1:PORT".
func (s *Server) Addr() string { return s.p.Addr() }

// Port returns the TCP port; it stays the same across Restart.
func (s *Server) Port() int { return s.p.Port() }

// Dir returns the server's data directory (--dir; the AOF directory lives
// inside it). The log file is kept outside it, so RestoreDir keeps the log.
func (s *Server) Dir() string { return s.p.Dir() }

// PID returns the pid of the current process, or 0 after Kill.
func (s *Server) PID() int { return s.p.PID() }

// TLSConfig returns the client side of Options.TLS (the CA trusted and, with
// TLSAuthClients, the client certificate), or nil for a plain-text server.
// Callers may change a Clone of it, not it.
func (s *Server) TLSConfig() *tls.Config { return s.tls }

// URL returns the server's URL: redis://127.0.0.1:PORT, or rediss://... for
// a TLS server.
func (s *Server) URL() string {
	if s.tls != nil {
		return "rediss://" + s.Addr()
	}
	return "redis://" + s.Addr()
}

// Client returns a new go-redis client for the server (over TLS for a TLS
// server), closed when the test ends. Each opts function may change the
// options before the client is made (timeouts, retries, protocol...).
// CLIENT SETINFO is disabled by default since redis 7.0 does not know it.
func (s *Server) Client(t testing.TB, opts ...func(*redis.Options)) *redis.Client {
	t.Helper()
	o := &redis.Options{Addr: s.Addr(), DisableIdentity: true, TLSConfig: s.tls}
	for _, f := range opts {
		f(o)
	}
	c := redis.NewClient(o)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Kill sends SIGKILL (after SIGCONT, in case it is paused) to the process
// group and returns once the process has been reaped and the port accepts a
// new listener. Nothing is flushed: what was not yet written to the AOF is
// lost. Kill on a killed server does nothing.
func (s *Server) Kill() { s.p.Kill() }

// Pause stops the process with SIGSTOP: connections stay open, nothing is
// answered until Resume. On a killed server it does nothing.
func (s *Server) Pause() { _ = s.p.Pause() }

// Resume continues a paused process with SIGCONT.
func (s *Server) Resume() { _ = s.p.Resume() }

// Restart starts the server again on the same port and directory with the
// same options (killing it first if it is running) and waits until it
// answers PING and has finished loading its AOF or RDB file. If the port is
// briefly taken, it retries for a bounded time.
func (s *Server) Restart(t testing.TB) {
	t.Helper()
	if err := s.p.Restart(context.Background()); err != nil {
		t.Fatalf("redistest: %v", err)
	}
}

// SnapshotDir copies the data directory (the AOF directory included) to a
// new temporary directory and returns its path. Files are copied as they are
// on disk, as the page cache sees them; take it before the writes that a
// power loss should drop.
func (s *Server) SnapshotDir(t testing.TB) string {
	t.Helper()
	snap := t.TempDir()
	if err := copyDir(s.Dir(), snap); err != nil {
		t.Fatalf("redistest: snapshot of %s: %v", s.Dir(), err)
	}
	return snap
}

// RestoreDir replaces the data directory with the contents of snap (from
// SnapshotDir), imitating a power loss that drops the un-fsynced tail. The
// server must be killed; Restart it afterwards.
func (s *Server) RestoreDir(t testing.TB, snap string) {
	t.Helper()
	if pid := s.PID(); pid != 0 {
		t.Fatalf("redistest: RestoreDir on a running server (pid %d); call Kill first", pid)
	}
	dir := s.Dir()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	if err := copyDir(snap, dir); err != nil {
		t.Fatalf("redistest: restore %s from %s: %v", dir, snap, err)
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
		TLSConfig:       s.tls,
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
func (s *Server) Log() string { return s.p.Log() }

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

// SetOldEpoch sets s's quorum epoch key (dlock's "PREFIX epoch") to say
// that the process running s now has held its data since the epoch of the
// clock: a test that knows s is new lets it vote at once, instead of after
// the restart delay (see dlock.NewQuorum).
func (s *Server) SetOldEpoch(t testing.TB, key string) {
	t.Helper()
	info, _ := s.Do(t, "info", "server").(string)
	_, run, _ := strings.Cut(info, "run_id:")
	run, _, _ = strings.Cut(run, "\r\n")
	if run == "" {
		t.Fatalf("%s: no run_id in INFO server", s.Addr())
	}
	s.Do(t, "set", key, "0 "+run)
}
