package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

const (
	// embeddedReady bounds how long a private redis-server may take to
	// answer PING.
	embeddedReady = 10 * time.Second
	// embeddedStop bounds how long a private redis-server may take to exit
	// after SIGTERM before it is killed.
	embeddedStop = 5 * time.Second
	// embeddedAttempts bounds the free ports tried (another process may
	// take a port between our probe and redis-server's bind).
	embeddedAttempts = 5
)

// embeddedServer is the private server "dlock market" uses when no --redis
// is given: a redis-server child process, or an in-process miniredis.
type embeddedServer struct {
	addr     string
	describe string // one line for the user
	// miniredis is true for the in-process fallback, which lacks some of
	// Redis's semantics (see marketVariantsFor).
	miniredis bool
	stop      func()
}

// startEmbedded starts a private redis-server on a free loopback port if
// one is on PATH, otherwise an in-process miniredis.
func startEmbedded(ctx context.Context) (*embeddedServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		m := miniredis.NewMiniRedis()
		if err := m.StartAddr("127.0.0.1:0"); err != nil {
			return nil, fmt.Errorf("starting the in-process server: %w", err)
		}
		return &embeddedServer{
			addr:      m.Addr(),
			describe:  fmt.Sprintf("an in-process miniredis on %s (redis-server is not on PATH; install it for faithful results)", m.Addr()),
			miniredis: true,
			stop:      m.Close,
		}, nil
	}
	return startRedisServer(ctx, bin)
}

// startRedisServer runs bin on a free loopback port in a temporary directory,
// without persistence, and waits until it answers PING.
func startRedisServer(ctx context.Context, bin string) (*embeddedServer, error) {
	dir, err := os.MkdirTemp("", "dlock-market-")
	if err != nil {
		return nil, err
	}
	var lastErr error
	for range embeddedAttempts {
		s, err := launchRedisServer(ctx, bin, dir)
		if err == nil {
			stop := s.stop
			s.stop = func() { stop(); _ = os.RemoveAll(dir) }
			return s, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	_ = os.RemoveAll(dir)
	return nil, lastErr
}

// launchRedisServer makes one attempt on one free port.
func launchRedisServer(ctx context.Context, bin, dir string) (*embeddedServer, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	logPath := filepath.Join(dir, "redis.log")
	out, err := os.Create(filepath.Join(dir, "stdout.log"))
	if err != nil {
		return nil, err
	}
	defer out.Close()
	cmd := exec.Command(bin,
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no",
		"--dir", dir, "--logfile", logPath, "--daemonize", "no")
	cmd.Stdout, cmd.Stderr = out, out
	// Its own process group, so a terminal's Ctrl-C reaches only us and we
	// stop it in order; see childAttr for what happens if we die.
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		t := time.NewTimer(embeddedStop)
		defer t.Stop()
		select {
		case <-exited:
		case <-t.C:
			_ = cmd.Process.Kill()
			<-exited
		}
	}

	rdb := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer rdb.Close()
	deadline := time.Now().Add(embeddedReady)
	for {
		pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		info, err := rdb.Info(pctx, "server").Result()
		cancel()
		if err == nil {
			return &embeddedServer{
				addr:     addr,
				describe: fmt.Sprintf("a private redis-server %s on %s (pid %d, stopped at exit)", infoField(info, "redis_version"), addr, cmd.Process.Pid),
				stop:     stop,
			}, nil
		}
		select {
		case <-exited:
			return nil, fmt.Errorf("redis-server exited at start: %s", lastLines(logPath, filepath.Join(dir, "stdout.log")))
		case <-ctx.Done():
			stop()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			stop()
			return nil, fmt.Errorf("redis-server on %s did not answer within %v: %v", addr, embeddedReady, err)
		}
	}
}

// freePort returns a loopback TCP port that was free a moment ago.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// infoField returns one "name:value" field of an INFO reply.
func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return "?"
}

// lastLines returns the last few non-empty lines of the first readable file,
// to explain why a server did not start.
func lastLines(paths ...string) string {
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil || len(strings.TrimSpace(string(b))) == 0 {
			continue
		}
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(lines) > 3 {
			lines = lines[len(lines)-3:]
		}
		return strings.Join(lines, " | ")
	}
	return "no log output"
}
