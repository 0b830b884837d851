//go:build linux

package main

import "syscall"

// childAttr puts a child (dlock run's COMMAND) in its own process group
// and asks the kernel to kill it if dlock dies without stopping it
// (Pdeathsig).
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
