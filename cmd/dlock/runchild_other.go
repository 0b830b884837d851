//go:build !unix

package main

import (
	"os"
	"syscall"
)

// signalGroup signals the child itself where there are no process groups;
// only a kill is certain to be delivered.
func signalGroup(p *os.Process, sig syscall.Signal) error {
	if sig == syscall.SIGKILL {
		return p.Kill()
	}
	return p.Signal(sig)
}

// exitStatus is the child's exit code.
func exitStatus(ps *os.ProcessState) int { return ps.ExitCode() }
