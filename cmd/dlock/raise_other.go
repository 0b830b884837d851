//go:build !unix

package main

import "syscall"

// raise: without Unix signals, dlock exits with 128+N instead.
func raise(syscall.Signal, bool) {}
