package main

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// sessionAttr makes a child lead a new session, so that killSession finds
// everything it started.
func sessionAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setsid: true} }

// procStat returns the fields of /proc/PID/stat after the command name:
// [0] is the state, [1] the parent, [2] the process group, [3] the session.
func procStat(pid int) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil
	}
	s := string(b)
	return strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
}

// sessionMembers lists the live processes of session sid.
func sessionMembers(sid int) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if f := procStat(pid); len(f) > 3 && f[3] == strconv.Itoa(sid) && f[0] != "Z" {
			pids = append(pids, pid)
		}
	}
	return pids
}

// killSession kills every process left in the session that the process
// sid led, once that leader has been reaped. A process whose pid is sid
// would be a new leader that reused the number, and its session not ours.
func killSession(sid int) {
	for range 50 {
		members := sessionMembers(sid)
		if len(members) == 0 {
			return
		}
		for _, pid := range members {
			if pid == sid {
				return
			}
		}
		for _, pid := range members {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(pollEvery)
	}
}

// stopped reports whether pid is stopped (by a signal or job control).
func stopped(pid int) bool {
	f := procStat(pid)
	return len(f) > 0 && (f[0] == "T" || f[0] == "t")
}

// running reports whether pid is a live process (a zombie is not).
func running(pid int) bool {
	f := procStat(pid)
	return len(f) > 0 && f[0] != "Z"
}

// gone waits, within procTimeout, until pid no longer runs.
func gone(pid int) bool {
	deadline := time.Now().Add(procTimeout)
	for running(pid) {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pollEvery)
	}
	return true
}

// shellStatus is a process's end as a shell reports it: its exit code, or
// 128 + the signal that killed it.
func shellStatus(ps *os.ProcessState) int {
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ps.ExitCode()
}
