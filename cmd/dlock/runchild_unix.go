//go:build unix

package main

import (
	"os"
	"syscall"
)

// signalGroup sends sig to the child's process group: the child and
// everything it started, as a terminal's Ctrl-C would. The group exists
// until its last member exits, so its id is not reused before then.
func signalGroup(p *os.Process, sig syscall.Signal) error {
	return syscall.Kill(-p.Pid, sig)
}

// exitStatus is the shell's view of how a child ended: its exit status, or
// 128 + the signal that killed it.
func exitStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
