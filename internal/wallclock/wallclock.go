// Package wallclock runs a child process whose wall clock its parent moves
// while it runs, for tests of what a clock jump on a client does
// (fault 11 of docs/SAFETY.md). The system clock, and every other process,
// are left alone.
//
// How: the child runs under a tracer process. The tracer hides the vDSO
// from it (the AT_SYSINFO_EHDR entry of its auxiliary vector becomes
// AT_IGNORE), so that the Go runtime and libc read clocks with system
// calls; a seccomp filter stops it at the reads of the wall clock alone
// (clock_gettime of CLOCK_REALTIME and CLOCK_REALTIME_COARSE,
// gettimeofday, time), and the tracer adds the offset to each result
// with ptrace. The monotonic clock is untouched, as a real step of the
// wall clock leaves it. Linux on amd64 only; elsewhere Command fails with
// an error that wraps errors.ErrUnsupported.
//
// The tracer is the current executable started again: a binary that
// imports this package becomes the tracer, in this package's init, when
// its environment says so (Command arranges it), and never runs its own
// main then. Killing the tracer kills the child.
package wallclock

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"
)

const (
	// tracerEnv, set, makes the process the tracer of the command in its
	// arguments.
	tracerEnv = "WALLCLOCK_TRACER"
	// tracedEnv is set in the traced child's environment.
	tracedEnv = "WALLCLOCK_TRACED"
)

// Cmd is an exec.Cmd whose process runs under the tracer. Set Env, Dir and
// the standard streams (also with StdinPipe and StdoutPipe), then call
// Start and Wait, or Run, as usual (Output and CombinedOutput of the
// embedded exec.Cmd would bypass them, and must not be used). Process is
// the tracer's: signal it to end the child (SIGKILL kills both). SetOffset
// is for one goroutine at a time.
type Cmd struct {
	*exec.Cmd
	ctl        *os.File   // the tracer's control pipe: 8-byte offsets in ns
	ack        *os.File   // one byte back per offset applied
	tracerEnds []*os.File // the tracer's ends of both, closed here once started
}

// Command returns a Cmd that runs name with args, as exec.Command does,
// with a wall clock that SetOffset moves (no offset at first).
func Command(name string, args ...string) (*Cmd, error) {
	if err := supported(); err != nil {
		return nil, err
	}
	return command(name, args...)
}

func command(name string, args ...string) (*Cmd, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("wallclock: %w", err)
	}
	if name, err = exec.LookPath(name); err != nil {
		return nil, fmt.Errorf("wallclock: %w", err)
	}
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("wallclock: %w", err)
	}
	ackR, ackW, err := os.Pipe()
	if err != nil {
		ctlR.Close()
		ctlW.Close()
		return nil, fmt.Errorf("wallclock: %w", err)
	}
	cmd := exec.Command(exe, append([]string{name}, args...)...)
	cmd.Args[0] = "wallclock-tracer"
	cmd.ExtraFiles = []*os.File{ctlR, ackW} // fds 3 and 4 of the tracer
	return &Cmd{Cmd: cmd, ctl: ctlW, ack: ackR, tracerEnds: []*os.File{ctlR, ackW}}, nil
}

// Start starts the tracer, which starts the child. The child's environment
// is Env (or this process's), with the tracer's own variable taken out.
func (c *Cmd) Start() error {
	if c.Env == nil {
		c.Env = append(os.Environ(), tracerEnv+"=1")
	} else {
		c.Env = append(c.Env, tracerEnv+"=1")
	}
	err := c.Cmd.Start()
	for _, f := range c.tracerEnds {
		f.Close()
	}
	if err != nil {
		c.ctl.Close()
		c.ack.Close()
	}
	return err
}

// Wait waits for the tracer, which exits as its child did (a child killed
// by a signal: the tracer exits with 128 + the signal's number), and
// closes the control pipes.
func (c *Cmd) Wait() error {
	err := c.Cmd.Wait()
	c.ctl.Close()
	c.ack.Close()
	return err
}

// Run starts the command and waits for it.
func (c *Cmd) Run() error {
	if err := c.Start(); err != nil {
		return err
	}
	return c.Wait()
}

// SetOffset sets the child's wall clock to the real time plus d, and
// returns once the tracer applies it to the child's next reading. Offsets
// are absolute: SetOffset(0) puts the clock back.
func (c *Cmd) SetOffset(d time.Duration) error {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(d.Nanoseconds()))
	if _, err := c.ctl.Write(b[:]); err != nil {
		return fmt.Errorf("wallclock: the tracer is gone: %w", err)
	}
	if _, err := io.ReadFull(c.ack, b[:1]); err != nil {
		return fmt.Errorf("wallclock: the tracer is gone: %w", err)
	}
	return nil
}

// Supported returns nil where Command works, else an error that wraps
// errors.ErrUnsupported and says why.
func Supported() error { return supported() }

// Traced reports whether this process runs under the tracer.
func Traced() bool { return os.Getenv(tracedEnv) == "1" }
