//go:build !unix

package main

import "syscall"

// childAttr has nothing to add where there are no process groups.
func childAttr() *syscall.SysProcAttr { return nil }
