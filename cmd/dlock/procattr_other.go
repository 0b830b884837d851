//go:build unix && !linux

package main

import "syscall"

// childAttr puts a child (dlock run's COMMAND) in its own process group.
// Without Linux's Pdeathsig, a child of a killed dlock outlives it.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
