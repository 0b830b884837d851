//go:build unix

package redisproc

import (
	"os"
	"syscall"
)

// killGroup sends SIGCONT (in case it is paused) and SIGKILL to the
// process group.
func (p *proc) killGroup() {
	if p.groupHeld() {
		_ = syscall.Kill(-p.pid, syscall.SIGCONT)
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
}

// stop and cont pause and resume the server process (not its group).
func (p *proc) stop() error { return p.cmd.Process.Signal(syscall.SIGSTOP) }
func (p *proc) cont() error { return p.cmd.Process.Signal(syscall.SIGCONT) }

// ownedByMe reports whether fi (from Lstat) belongs to this process's user.
func ownedByMe(fi os.FileInfo) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && int(st.Uid) == os.Getuid()
}
