//go:build linux

package main

import (
	"os/signal"
	"syscall"
	"unsafe"
)

// runChildAttr returns the child's process attributes: its own process
// group (so that a lost lease can end everything it started) killed with
// dlock (see childAttr). When dlock runs in the foreground of the terminal
// on its standard input, the child's group becomes the terminal's
// foreground group instead, so that an interactive COMMAND can read the
// terminal (a background group would be stopped by SIGTTIN) and gets the
// terminal's Ctrl-C directly. restore gives the terminal back to dlock's
// group once the child has exited.
func runChildAttr() (attr *syscall.SysProcAttr, restore func()) {
	attr = childAttr()
	const stdin = 0
	fg, err := tcgetpgrp(stdin)
	if err != nil || fg != syscall.Getpgrp() {
		return attr, func() {}
	}
	attr.Foreground, attr.Ctty = true, stdin
	return attr, func() {
		// A background group that sets the foreground group gets SIGTTOU
		// unless it ignores it.
		signal.Ignore(syscall.SIGTTOU)
		defer signal.Reset(syscall.SIGTTOU)
		_ = tcsetpgrp(stdin, syscall.Getpgrp())
	}
}

func tcgetpgrp(fd int) (int, error) {
	var pgrp int32
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.TIOCGPGRP, uintptr(unsafe.Pointer(&pgrp))); e != 0 {
		return 0, e
	}
	return int(pgrp), nil
}

func tcsetpgrp(fd, pgrp int) error {
	p := int32(pgrp)
	if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, uintptr(fd), syscall.TIOCSPGRP, uintptr(unsafe.Pointer(&p))); e != 0 {
		return e
	}
	return nil
}
