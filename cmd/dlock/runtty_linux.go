//go:build linux

package main

import (
	"os"
	"syscall"
	"unsafe"
)

// foregroundTerminal finds dlock's controlling terminal when dlock's
// process group is the terminal's foreground group, so that COMMAND's
// group can be made the foreground group instead: an interactive COMMAND
// can then read the terminal (a background group would be stopped by
// SIGTTIN while dlock holds the lock) and gets the terminal's Ctrl-C
// directly. The terminal is looked for on fds 0, 1 and 2, then through
// /dev/tty (echo | dlock run ... still has one). It returns the descriptor,
// or -1, and restore, which gives the terminal back to dlock's group once
// COMMAND's has ended (dlock ignores SIGTTOU meanwhile, or setting the
// foreground group from the background would stop it).
func foregroundTerminal() (fd int, restore func()) {
	me := syscall.Getpgrp()
	for _, fd := range []int{0, 1, 2} {
		if pg, err := tcgetpgrp(fd); err == nil && pg == me {
			return fd, func() { _ = tcsetpgrp(fd, me) }
		}
	}
	tty, err := os.OpenFile("/dev/tty", os.O_RDWR, 0)
	if err != nil {
		return -1, func() {}
	}
	fd = int(tty.Fd())
	if pg, err := tcgetpgrp(fd); err != nil || pg != me {
		_ = tty.Close()
		return -1, func() {}
	}
	return fd, func() {
		_ = tcsetpgrp(fd, me)
		_ = tty.Close()
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
