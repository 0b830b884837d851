//go:build unix && !linux

package redisproc

import (
	"errors"
	"os/exec"
	"syscall"
)

// spawn starts cmd in a process group of its own. Without Linux's
// Pdeathsig, a server whose starter is killed outlives it.
func spawn(cmd *exec.Cmd) error {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd.Start()
}

// waitExit reaps the process: there is no portable way to wait without
// reaping.
func waitExit(p *proc) (reaped bool, err error) {
	return true, p.cmd.Wait()
}

// groupHeld reports whether the process group id is still ours. Once the
// watcher has reaped the leader its pid may be reused, so killGroup only
// signals the group of a process that has not exited; a child it forked
// that outlived it is then missed.
func (p *proc) groupHeld() bool { return !p.hasExited() }

// startTime is not known here; ownerGone goes by the pid alone.
func startTime(int) (string, bool) { return "", false }

// ownerGone reports whether no process has pid. A reused pid keeps a stale
// directory until that process ends too.
func ownerGone(pid int, _ string) bool {
	return errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}
