package main

import (
	"errors"

	"golang.org/x/sys/unix"
)

// canAdoptOrphans: on Linux the guard is a child subreaper, so the
// processes of COMMAND's group whose parents exit become its children, and
// it can tell when the group is empty.
const canAdoptOrphans = true

// adoptOrphans makes the guard the reaper of its orphaned descendants.
func adoptOrphans() { _ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) }

// groupEmpty reports whether no child of the guard is left in process
// group pgid, exited or not. As the guard adopts orphans, every process of
// the group descends from one of those children, unless it joined the
// group from elsewhere in the session (setpgid), which dlock run does not
// follow.
func groupEmpty(pgid int) bool {
	var info unix.Siginfo
	err := unix.Waitid(unix.P_PGID, pgid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
	return errors.Is(err, unix.ECHILD)
}
