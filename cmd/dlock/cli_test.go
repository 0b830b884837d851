package main

// Helpers for the tests that run the dlock binary as a user would: built
// once with go build, started as a child process against a real
// redis-server from internal/redistest.

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// procTimeout bounds every wait for the binary: generous, so that a
	// slow machine never fails a test; it only stops a hung one.
	procTimeout = 30 * time.Second
	// pollEvery is the step of bounded polling loops.
	pollEvery = 20 * time.Millisecond
)

var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// dlockBinary builds the command once per test run and returns its path;
// $DLOCK_TEST_BINARY names another binary to test instead (an older build,
// to show that a new test fails on it).
func dlockBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("DLOCK_TEST_BINARY"); bin != "" {
		return bin
	}
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "dlock-cli-test-"); binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "dlock")
		var out bytes.Buffer
		cmd := exec.Command("go", "build", "-o", binPath, ".")
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out.String())
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// lineWriter collects a process's output and hands it out line by line.
type lineWriter struct {
	mu      sync.Mutex
	all     bytes.Buffer
	partial []byte
	lines   chan string
}

func newLineWriter() *lineWriter { return &lineWriter{lines: make(chan string, 1000)} }

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.all.Write(p)
	w.partial = append(w.partial, p...)
	for {
		i := bytes.IndexByte(w.partial, '\n')
		if i < 0 {
			return len(p), nil
		}
		select {
		case w.lines <- string(w.partial[:i]):
		default: // nobody reads this many lines; all keeps them
		}
		w.partial = w.partial[i+1:]
	}
}

func (w *lineWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.all.String()
}

// dlockProc is one running dlock binary.
type dlockProc struct {
	t      *testing.T
	args   []string
	cmd    *exec.Cmd
	stdout *lineWriter
	stderr *lineWriter
	done   chan struct{}
}

// startDlock starts dlock with args, talking to the server at addr through
// DLOCK_REDIS_URL. The process is stopped when the test ends.
func startDlock(t *testing.T, addr string, args ...string) *dlockProc {
	t.Helper()
	return startDlockEnv(t, []string{"DLOCK_REDIS_URL=redis://" + addr, "REDIS_URL="}, args...)
}

// startDlockEnv starts dlock with args and env added to the environment.
// The process is stopped when the test ends.
func startDlockEnv(t *testing.T, env []string, args ...string) *dlockProc {
	t.Helper()
	return startDlockWith(t, func(c *exec.Cmd) { c.Env = append(c.Env, env...) }, args...)
}

// startDlockWith starts dlock with args after setup has adjusted the
// command (its environment, or output files instead of the collecting
// writers). dlock leads a session of its own, so that when the test ends
// everything it started, even what outlived it, is killed with it.
func startDlockWith(t *testing.T, setup func(*exec.Cmd), args ...string) *dlockProc {
	t.Helper()
	p := &dlockProc{t: t, args: args, stdout: newLineWriter(), stderr: newLineWriter(), done: make(chan struct{})}
	p.cmd = exec.Command(dlockBinary(t), args...)
	p.cmd.Env = os.Environ()
	p.cmd.Stdout, p.cmd.Stderr = p.stdout, p.stderr
	// A grandchild that outlives dlock may hold the output pipes open.
	p.cmd.WaitDelay = 5 * time.Second
	p.cmd.SysProcAttr = sessionAttr()
	setup(p.cmd)
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		defer killSession(p.cmd.Process.Pid)
		select {
		case <-p.done:
			return
		default:
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM) // forwarded to its COMMAND
		select {
		case <-p.done:
		case <-time.After(5 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// line returns the next line dlock (or its COMMAND) writes to stdout.
func (p *dlockProc) line() string {
	p.t.Helper()
	select {
	case l := <-p.stdout.lines:
		return l
	case <-p.done:
		select {
		case l := <-p.stdout.lines:
			return l
		default:
		}
		p.t.Fatalf("dlock %q exited (%s) before writing a line; stderr: %s", p.args, p.cmd.ProcessState, p.stderr)
	case <-time.After(procTimeout):
		p.t.Fatalf("dlock %q wrote no line within %v; stderr: %s", p.args, procTimeout, p.stderr)
	}
	return ""
}

// exit waits for dlock to exit and returns its exit code.
func (p *dlockProc) exit() int {
	p.t.Helper()
	code, sig := p.end()
	if sig != 0 {
		p.t.Fatalf("dlock %q was killed by %v; stderr: %s", p.args, sig, p.stderr)
	}
	return code
}

// end waits for dlock to end and says how: its exit code, or the signal
// that killed it (then code is -1).
func (p *dlockProc) end() (code int, sig syscall.Signal) {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(procTimeout):
		p.t.Fatalf("dlock %q did not exit within %v; stderr: %s", p.args, procTimeout, p.stderr)
	}
	ps := p.cmd.ProcessState
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return -1, ws.Signal()
	}
	return ps.ExitCode(), 0
}

// killedBy fails unless dlock ends killed by sig.
func (p *dlockProc) killedBy(sig syscall.Signal) {
	p.t.Helper()
	if code, got := p.end(); got != sig {
		p.t.Errorf("dlock %q: exit %d, signal %v; want killed by %v; stderr: %s", p.args, code, got, sig, p.stderr)
	}
}

// exited reports whether dlock has exited, without waiting.
func (p *dlockProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *dlockProc) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatal(err)
	}
}

// runDlock runs dlock to completion and returns its exit code and output.
func runDlock(t *testing.T, addr string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	p := startDlock(t, addr, args...)
	code = p.exit()
	return code, p.stdout.String(), p.stderr.String()
}

// waitSubscribed waits until exactly n clients wait for the lock key, i.e.
// are subscribed to its wake-up channel.
func waitSubscribed(t *testing.T, rdb *redis.Client, key string, n int64) {
	t.Helper()
	deadline := time.Now().Add(procTimeout)
	for {
		m, err := rdb.PubSubShardNumSub(context.Background(), key).Result()
		if err == nil && m[key] == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d waiters on %s not seen within %v (err %v, count %d)", n, key, procTimeout, err, m[key])
		}
		time.Sleep(pollEvery)
	}
}

// oneLine fails unless s is exactly one non-empty line.
func oneLine(t *testing.T, what, s string) {
	t.Helper()
	s = strings.TrimSuffix(s, "\n")
	if s == "" || strings.Contains(s, "\n") {
		t.Errorf("%s: want one line on stderr, got %q", what, s)
	}
}
