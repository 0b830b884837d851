//go:build unix

package main

import (
	"os"
	"os/signal"
	"syscall"
	"time"
)

// raise ends dlock with sig, by the signal's default action; with group,
// sig goes to dlock's whole process group.
func raise(sig syscall.Signal, group bool) {
	signal.Reset(sig)
	pid := os.Getpid()
	if group {
		pid = 0
	}
	_ = syscall.Kill(pid, sig)
	// The signal is delivered at once; this only bounds a surprise.
	time.Sleep(time.Second)
}
