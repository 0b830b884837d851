//go:build !unix

package main

import (
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"syscall"
)

// directJob is COMMAND run as dlock's own child where there are no process
// groups: what COMMAND starts is neither signalled nor stopped with it.
type directJob struct {
	cmd    *exec.Cmd
	ended  chan struct{}
	result jobResult
}

// startJob starts COMMAND (tty is unused: there is no terminal hand-over).
func startJob(f runFlags, env []string, stdout, stderr io.Writer, tty int) (job, error) {
	j := &directJob{cmd: exec.Command(f.command[0], f.command[1:]...), ended: make(chan struct{})}
	j.cmd.Env = env
	j.cmd.Stdin, j.cmd.Stdout, j.cmd.Stderr = os.Stdin, stdout, stderr
	if err := j.cmd.Start(); err != nil {
		j.result = jobResult{startCode: exitCannotRun, startErr: err.Error()}
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			j.result.startCode = exitNotFound
		}
		close(j.ended)
		return j, nil
	}
	go func() {
		_ = j.cmd.Wait()
		j.result = jobResult{code: j.cmd.ProcessState.ExitCode()}
		close(j.ended)
	}()
	return j, nil
}

// signal forwards sig where the platform can: a kill at least.
func (j *directJob) signal(sig syscall.Signal) {
	if sig == syscall.SIGKILL {
		_ = j.cmd.Process.Kill()
		return
	}
	_ = j.cmd.Process.Signal(sig)
}

// stop kills COMMAND: there is no SIGTERM to send first.
func (j *directJob) stop() { _ = j.cmd.Process.Kill() }

func (j *directJob) done() <-chan struct{} { return j.ended }

func (j *directJob) wait() jobResult {
	<-j.ended
	return j.result
}

// canAdoptOrphans: without process groups there is nothing to wait for
// beyond COMMAND.
const canAdoptOrphans = false

// guardCommand has no use here; it names nothing dlock help lists.
const guardCommand = "__run-guard"

// runGuard is not used where there are no process groups.
func runGuard(_ []string, stderr io.Writer) int { return exitUsage }

// ignoreWhileRunning has no job-control signals to ignore here.
func ignoreWhileRunning() (restore func()) { return func() {} }
