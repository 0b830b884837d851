//go:build !linux

package main

// foregroundTerminal: handing the terminal to COMMAND is implemented on
// Linux only; elsewhere an interactive COMMAND that reads the terminal is
// stopped (SIGTTIN).
func foregroundTerminal() (fd int, restore func()) { return -1, func() {} }
