package redisproc

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Pdeathsig belongs to the thread that forked, not to the process: the
// kernel signals the child when that thread exits, and Go ends threads (one
// left locked by a goroutine that returned, for instance) while the program
// runs on. So every server is forked from one thread that never exits, and
// the child dies only when the whole program does, even if no Close runs
// (a panic, a test -timeout, SIGKILL).
var (
	spawnOnce sync.Once
	spawnReqs chan spawnReq
)

type spawnReq struct {
	cmd *exec.Cmd
	err chan error
}

func spawn(cmd *exec.Cmd) error {
	cmd.SysProcAttr = &syscall.SysProcAttr{
		// A group of its own: a terminal's Ctrl-C reaches only us, and
		// killGroup reaches the server's forked children too.
		Setpgid:   true,
		Pdeathsig: syscall.SIGKILL,
	}
	spawnOnce.Do(func() {
		spawnReqs = make(chan spawnReq)
		go spawnLoop()
	})
	r := spawnReq{cmd: cmd, err: make(chan error, 1)}
	spawnReqs <- r
	return <-r.err
}

// spawnLoop starts the commands sent to spawnReqs, for good. It is the one
// goroutine redisproc leaves running (goleak users ignore it by name).
func spawnLoop() {
	runtime.LockOSThread() // never unlocked: the thread lives on
	for r := range spawnReqs {
		r.err <- r.cmd.Start()
	}
}

// waitExit waits until the process has exited without reaping it
// (WNOWAIT), so that killGroup can still signal its group safely.
func waitExit(p *proc) (reaped bool, err error) {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, p.pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if !errors.Is(err, unix.EINTR) {
			// Any other error (there is none for our own child) leaves
			// the reaping to cmd.Wait, which reports it.
			return false, nil
		}
	}
}

// groupHeld reports whether the process group id is still ours: the leader
// is not reaped, so its pid cannot have been reused.
func (p *proc) groupHeld() bool { return !p.reaped }

// startTime returns when process pid started (field 22 of
// /proc/PID/stat, in clock ticks since boot): with the pid, it names one
// process for good, since pids are reused and start times are not.
func startTime(pid int) (string, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", false
	}
	// The command name (field 2) is in parentheses and may hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return "", false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return "", false
	}
	return f[19], true // fields 3.. follow ')'; field 22 is f[19]
}

// ownerGone reports whether the process that recorded pid and start has
// ended: no process has that pid, or the one that has it started at
// another time.
func ownerGone(pid int, start string) bool {
	now, ok := startTime(pid)
	if !ok {
		_, err := os.Stat("/proc/" + strconv.Itoa(pid))
		return errors.Is(err, fs.ErrNotExist)
	}
	return start != "" && now != start
}
