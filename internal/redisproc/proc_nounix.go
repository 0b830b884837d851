//go:build !unix

package redisproc

import (
	"errors"
	"os"
	"os/exec"
)

// spawn starts cmd; there are no process groups to put it in.
func spawn(cmd *exec.Cmd) error { return cmd.Start() }

func waitExit(p *proc) (reaped bool, err error) {
	return true, p.cmd.Wait()
}

// killGroup kills the process; a child it forked is not reached.
func (p *proc) killGroup() { _ = p.cmd.Process.Kill() }

// stop and cont need SIGSTOP and SIGCONT.
func (p *proc) stop() error { return errors.ErrUnsupported }
func (p *proc) cont() error { return errors.ErrUnsupported }

// ownedByMe cannot tell owners apart here; ownerGone never reports a
// directory stale, so this is not relied on.
func ownedByMe(os.FileInfo) bool { return true }

func startTime(int) (string, bool) { return "", false }

// ownerGone cannot tell here, so no directory is ever taken for stale.
func ownerGone(int, string) bool { return false }
