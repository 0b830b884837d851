// Package redisproc starts redis-server processes on a loopback port: the
// one way dlock's test harness (internal/redistest), its bench and the dlock
// CLI's private server for "dlock market" start Redis.
//
// What it guarantees:
//
//   - The server Start returns is the process it started. Between choosing a
//     free port and redis-server's bind, another process may take the port;
//     readiness is then judged by the pid the answering server reports (INFO
//     process_id), and a stranger is never taken for ours: Start tries
//     another port, a bounded number of times within Config.Timeout.
//   - Ready means PING answered PONG and the data has finished loading; a
//     server that fails to start is reported with the end of its log.
//   - The server runs in a process group of its own. Kill and Close send the
//     group SIGCONT, then SIGKILL (redis forks for BGSAVE and AOF rewrites),
//     and reap the process. On Linux, the kernel kills the server when the
//     process that started it dies without Close (Pdeathsig).
//   - A directory Start makes is removed by Close, and, if its maker was
//     killed before Close, by a later Start with the same TempPrefix.
//
// What it does not: it does not find the binary in places other than
// $PATH (the harness has its own rules), persist anything unless Args ask
// for it, or keep a server from being reached by other local users: it is
// bound to 127.0.0.1 without a password. With Config.TLS it speaks TLS
// only, with the certificates the caller gives (it makes none).
package redisproc

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"
)

const (
	// DefaultTimeout is Config.Timeout's default.
	DefaultTimeout = 20 * time.Second
	// DefaultTempPrefix is Config.TempPrefix's default.
	DefaultTempPrefix = "redisproc-"
	// startAttempts bounds how many ports Start tries.
	startAttempts = 30
	// killPortTimeout bounds how long Kill waits for the port to be free.
	killPortTimeout = 5 * time.Second
	// restartRetry is the pause between Restart's tries of a taken port.
	restartRetry = 50 * time.Millisecond
)

// Config describes the server Start runs. The zero Config is a server with
// no persistence in a directory of its own, removed by Close.
type Config struct {
	// Bin is the redis-server binary: a path, or a name looked up in
	// $PATH. Default "redis-server".
	Bin string
	// Dir holds the server's files: its data directory Dir/data (--dir)
	// and its log files. It must exist, and the caller removes it.
	// Default: Start makes a directory in os.TempDir() (see TempPrefix)
	// and Close removes it.
	Dir string
	// TempPrefix begins the name of the directory Start makes when Dir is
	// empty: TempPrefix, Start's pid, a dash and a random suffix. Before
	// making one, Start removes those it made earlier for processes that
	// have ended without Close. Default DefaultTempPrefix.
	TempPrefix string
	// Args are extra redis-server config arguments, after redisproc's own
	// (--port, --bind 127.0.0.1, --save "", --dir, --logfile, --daemonize
	// no), so they override them; e.g. {"--appendonly", "yes"}.
	Args []string
	// Sentinel runs the server in Sentinel mode, with the config file
	// Dir/data/sentinel.conf (made empty if missing; Sentinel rewrites it).
	Sentinel bool
	// Env holds extra environment variables ("NAME=value") for the
	// process, after the caller's own environment, e.g. an LD_PRELOAD.
	Env []string
	// Timeout bounds Start and each Restart: finding a port, starting the
	// process and loading the data. Default DefaultTimeout.
	Timeout time.Duration
	// TLS, if not nil, makes the server speak TLS only: its port is the
	// TLS port (--tls-port) and it has no plain-text port (--port 0).
	// Default nil: plain text.
	TLS *TLS
}

// TLS is a server's TLS setup (Config.TLS). redis-server reads the files at
// start; they must outlive the server (Restart reads them again).
type TLS struct {
	// CertFile and KeyFile are the server's certificate chain and private
	// key, PEM (tls-cert-file, tls-key-file). Required.
	CertFile, KeyFile string
	// CAFile holds the CA certificates client certificates are checked
	// against, PEM (tls-ca-cert-file). Required: redis-server refuses to
	// start TLS without it, even when it asks for no client certificate.
	CAFile string
	// AuthClients is tls-auth-clients: "yes" (a client must present a
	// certificate CAFile trusts), "optional" or "no". Default "no".
	AuthClients string
	// Client is how the readiness probe connects: it must trust the
	// server's certificate for 127.0.0.1, and hold a client certificate
	// when AuthClients is "yes". Required.
	Client *tls.Config
}

// args returns the redis-server arguments that set up t on port.
func (t *TLS) args(port int) []string {
	auth := t.AuthClients
	if auth == "" {
		auth = "no"
	}
	return []string{
		"--port", "0",
		"--tls-port", strconv.Itoa(port),
		"--tls-cert-file", t.CertFile,
		"--tls-key-file", t.KeyFile,
		"--tls-ca-cert-file", t.CAFile,
		"--tls-auth-clients", auth,
	}
}

// check reports what is missing from t.
func (t *TLS) check() error {
	switch {
	case t.CertFile == "" || t.KeyFile == "":
		return errors.New("TLS needs CertFile and KeyFile")
	case t.CAFile == "":
		return errors.New("TLS needs CAFile (redis-server refuses TLS without tls-ca-cert-file)")
	case t.Client == nil:
		return errors.New("TLS needs Client, the readiness probe's tls.Config")
	}
	switch t.AuthClients {
	case "", "no", "yes", "optional":
		return nil
	}
	return fmt.Errorf("TLS AuthClients %q: want \"yes\", \"optional\" or \"no\"", t.AuthClients)
}

// Server is one redis-server on 127.0.0.1. Its port and directory stay the
// same across Kill and Restart. All methods are safe for concurrent use.
type Server struct {
	bin       string
	extraArgs []string // Config.Args
	sentinel  bool
	tls       *TLS     // Config.TLS
	env       []string // Config.Env
	timeout   time.Duration
	root      string // Config.Dir, or the directory Start made
	ownsRoot  bool   // Close removes root
	dataDir   string // root/data (--dir)
	logPath   string // root/redis.log (--logfile)
	stdioPath string // root/stdio.log: stdout and stderr (config errors)

	mu      sync.Mutex
	port    int
	proc    *proc  // the running process; nil after Kill
	version string // redis_version, from the last readiness probe
	closed  bool
}

// Start starts a redis-server on a free 127.0.0.1 port and returns once it
// is ready (see the package documentation). If ctx ends first, Start
// returns ctx.Err(). On any error no process is left running and the
// directory Start made, if any, is removed.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	s, err := newServer(cfg)
	if err != nil {
		return nil, err
	}
	if err := s.startFresh(ctx); err != nil {
		_ = s.removeRoot()
		return nil, err
	}
	return s, nil
}

// newServer resolves the binary and prepares the directories.
func newServer(cfg Config) (*Server, error) {
	bin := cfg.Bin
	if bin == "" {
		bin = "redis-server"
	}
	bin, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("redisproc: %w", err)
	}
	if cfg.TLS != nil {
		if err := cfg.TLS.check(); err != nil {
			return nil, fmt.Errorf("redisproc: %w", err)
		}
	}
	s := &Server{
		bin:       bin,
		extraArgs: append([]string(nil), cfg.Args...),
		sentinel:  cfg.Sentinel,
		tls:       cfg.TLS,
		env:       append([]string(nil), cfg.Env...),
		timeout:   cfg.Timeout,
		root:      cfg.Dir,
	}
	if s.timeout <= 0 {
		s.timeout = DefaultTimeout
	}
	if s.root == "" {
		prefix := cfg.TempPrefix
		if prefix == "" {
			prefix = DefaultTempPrefix
		}
		if s.root, err = makeTempRoot(prefix); err != nil {
			return nil, fmt.Errorf("redisproc: %w", err)
		}
		s.ownsRoot = true
	}
	s.dataDir = filepath.Join(s.root, "data")
	s.logPath = filepath.Join(s.root, "redis.log")
	s.stdioPath = filepath.Join(s.root, "stdio.log")
	err = os.MkdirAll(s.dataDir, 0o755)
	if err == nil && s.sentinel {
		err = ensureFile(filepath.Join(s.dataDir, "sentinel.conf"))
	}
	if err != nil {
		_ = s.removeRoot()
		return nil, fmt.Errorf("redisproc: %w", err)
	}
	return s, nil
}

func ensureFile(path string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	return f.Close()
}

// startFresh starts the first process, on the first port that is ours.
func (s *Server) startFresh(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	deadline := time.Now().Add(s.timeout)
	var lastErr error
	for range startAttempts {
		port, err := choosePort()
		if err != nil {
			return fmt.Errorf("redisproc: %w", err)
		}
		p, busy, err := s.launch(ctx, port, deadline)
		switch {
		case err == nil:
			s.port, s.proc = port, p
			return nil
		case busy && time.Now().Before(deadline):
			// The port stays marked taken: another process holds it.
			lastErr = err
			continue
		}
		releasePort(port)
		if err == ctx.Err() {
			return err
		}
		return fmt.Errorf("redisproc: %w", err)
	}
	return fmt.Errorf("redisproc: no port of our own after %d attempts; the last: %w", startAttempts, lastErr)
}

// args returns redis-server's command line for port.
func (s *Server) args(port int) []string {
	var a []string
	if s.sentinel {
		a = append(a, filepath.Join(s.dataDir, "sentinel.conf"), "--sentinel")
	}
	if s.tls != nil {
		a = append(a, s.tls.args(port)...)
	} else {
		a = append(a, "--port", strconv.Itoa(port))
	}
	a = append(a,
		"--bind", "127.0.0.1",
		"--save", "",
		"--dir", s.dataDir,
		"--logfile", s.logPath,
		"--daemonize", "no",
	)
	return append(a, s.extraArgs...)
}

// TLSConfig returns Config.TLS's Client, or nil for a plain-text server.
func (s *Server) TLSConfig() *tls.Config {
	if s.tls == nil {
		return nil
	}
	return s.tls.Client
}

// Addr returns "127.0.0.1:PORT" (the TLS port of a TLS server).
func (s *Server) Addr() string { return loopback(s.Port()) }

// Port returns the TCP port; it stays the same across Restart.
func (s *Server) Port() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.port
}

// PID returns the pid of the running process, or 0 after Kill or Close.
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return 0
	}
	return s.proc.pid
}

// Dir returns the data directory (--dir; the AOF directory lives in it).
// The log files are kept outside it, so replacing it keeps the log.
func (s *Server) Dir() string { return s.dataDir }

// Version returns the server's redis_version, as of its last (re)start.
func (s *Server) Version() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.version
}

// Log returns the server's log file (every run: Restart appends) and then
// anything it wrote to stdout or stderr, for failure messages.
func (s *Server) Log() string {
	out := readFrom(s.logPath, 0)
	if stdio := readFrom(s.stdioPath, 0); stdio != "" {
		out += "--- stdout/stderr ---\n" + stdio
	}
	return out
}

// Kill kills the process group (SIGCONT, then SIGKILL) and returns once the
// process has been reaped and the port accepts a new listener (or 5 s have
// passed). Nothing is flushed: what was not written to disk is lost. Kill
// on a killed or closed server does nothing.
func (s *Server) Kill() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.killLocked()
}

func (s *Server) killLocked() {
	if s.proc == nil {
		return
	}
	s.proc.kill()
	s.proc = nil
	waitPortFree(s.port, killPortTimeout)
}

// Pause stops the process with SIGSTOP: connections stay open and nothing
// is answered until Resume. It fails if no process runs or the platform
// has no SIGSTOP.
func (s *Server) Pause() error { return s.signal((*proc).stop) }

// Resume continues a paused process with SIGCONT.
func (s *Server) Resume() error { return s.signal((*proc).cont) }

func (s *Server) signal(f func(*proc) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil || s.proc.hasExited() {
		return errors.New("redisproc: no process running")
	}
	return f(s.proc)
}

// Restart starts the server again on the same port and directory (killing
// it first if it runs) and returns once it is ready. While another process
// holds the port, it tries again until Config.Timeout has passed. If ctx
// ends first, Restart returns ctx.Err(). Restart after Close fails.
func (s *Server) Restart(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errors.New("redisproc: Restart after Close")
	}
	s.killLocked()
	deadline := time.Now().Add(s.timeout)
	for {
		p, busy, err := s.launch(ctx, s.port, deadline)
		if err == nil {
			s.proc = p
			return nil
		}
		if err == ctx.Err() {
			return err
		}
		if !busy || time.Now().After(deadline) {
			return fmt.Errorf("redisproc: restart on port %d: %w", s.port, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(restartRetry):
		}
	}
}

// Close kills the server, gives its port back and removes the directory
// Start made (not a Config.Dir). Close is idempotent; it returns the error
// of removing the directory.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	s.killLocked()
	releasePort(s.port)
	return s.removeRoot()
}

func (s *Server) removeRoot() error {
	if !s.ownsRoot {
		return nil
	}
	return os.RemoveAll(s.root)
}
