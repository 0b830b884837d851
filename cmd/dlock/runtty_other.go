//go:build !linux

package main

import "syscall"

// runChildAttr returns the child's process attributes: its own process
// group where there are process groups (see childAttr). Handing the
// terminal to the child is implemented on Linux only; elsewhere an
// interactive COMMAND that reads the terminal is stopped (SIGTTIN).
func runChildAttr() (attr *syscall.SysProcAttr, restore func()) {
	return childAttr(), func() {}
}
