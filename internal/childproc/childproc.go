// Package childproc starts the child process of a test (the test binary
// run again in some role, or under the wall-clock tracer of
// internal/wallclock) with pipes to its stdin and stdout, and ends it when
// the test ends.
package childproc

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"syscall"
	"testing"
)

// Proc is how a child is started and waited for: an *exec.Cmd, or a
// *wallclock.Cmd, which runs it under a tracer.
type Proc interface {
	Start() error
	Wait() error
}

// Start starts cmd through p, its environment this process's with env
// added and its stderr this process's, and returns its stdin and a scanner
// of its stdout (lines up to 1 MiB). When the test ends the child is
// continued (it may have been stopped), killed and waited for; a test that
// waited for it already loses nothing.
func Start(t testing.TB, p Proc, cmd *exec.Cmd, env ...string) (io.WriteCloser, *bufio.Scanner) {
	t.Helper()
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = p.Wait()
	})
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	return stdin, sc
}
