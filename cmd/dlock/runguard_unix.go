//go:build unix

// This file is the guard of "dlock run": a second dlock process that leads
// COMMAND's process group, so that everything COMMAND starts can be
// stopped together and nothing outlives the lock, even if dlock itself
// dies.
//
// dlock starts the guard (the hidden command guardCommand) with two pipes,
// at the descriptor numbers they have in dlock (given as arguments), so
// that the descriptors dlock was given (a caller's fds 3 and 4, say) reach
// COMMAND as they are. On the first, dlock sends one byte per request: a
// signal number to forward, or 0 when the lease is lost. End of file on it
// means dlock has gone (exited, or killed with SIGKILL): the guard kills
// the whole group at once, before the lease can expire. On the second, the
// guard reports how COMMAND ended; the guard exits once nothing of the
// group is left to wait for, and dlock releases the lock only then.
//
// The group's id is the guard's pid, so it cannot be reused (nor a signal
// to the group reach a stranger) while the guard lives, nor afterwards
// until dlock reaps it; COMMAND's own pid is the guard's to reap, so it is
// safe to signal too, even if COMMAND left the group.

package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// guardCommand is the hidden command that runs the guard. It is not listed
// by dlock help: only dlock run starts it, with the pipes as fds 3 and 4.
const guardCommand = "__run-guard"

// lostByte, sent on the request pipe, says the lease was lost.
const lostByte = 0

// guardJob is dlock's side of a guard.
type guardJob struct {
	cmd      *exec.Cmd
	requests *os.File      // write end: requests to the guard
	ended    chan struct{} // closed when the report pipe ends: the guard exited
	last     []string      // the reports read, in order
}

// startJob starts the guard, which runs f.command with env in a process
// group it leads; tty >= 0 is the terminal to give that group.
func startJob(f runFlags, env []string, stdout, stderr io.Writer, tty int) (job, error) {
	self, err := guardExecutable()
	if err != nil {
		return nil, err
	}
	reqR, reqW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	repR, repW, err := os.Pipe()
	if err != nil {
		closeAll(reqR, reqW)
		return nil, err
	}
	// The guard's ends keep their numbers in the guard (ExtraFiles would
	// move them to 3 and 4, in place of what the caller passed there): they
	// are made inheritable just for this start, which is the only process
	// dlock starts. Fd also puts them in blocking mode, for the guard.
	reqFD, repFD := int(reqR.Fd()), int(repW.Fd())
	for _, fd := range []int{reqFD, repFD} {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_SETFD, 0); err != nil {
			closeAll(reqR, reqW, repR, repW)
			return nil, err
		}
	}
	args := append([]string{guardCommand, f.leftovers, f.killGrace.String(), strconv.Itoa(reqFD), strconv.Itoa(repFD), "--"}, f.command...)
	cmd := exec.Command(self, args...)
	cmd.Args[0] = os.Args[0] // ps shows "dlock __run-guard ... COMMAND"
	cmd.Env = env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	// Output that is not a file is copied through pipes, which a process
	// that left the group may hold open.
	cmd.WaitDelay = time.Second
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if tty >= 0 {
		cmd.SysProcAttr.Foreground, cmd.SysProcAttr.Ctty = true, tty
	}
	err = cmd.Start()
	closeAll(reqR, repW)
	if err != nil {
		closeAll(reqW, repR)
		return nil, err
	}
	j := &guardJob{cmd: cmd, requests: reqW, ended: make(chan struct{})}
	go func() {
		defer close(j.ended)
		defer repR.Close()
		sc := bufio.NewScanner(repR)
		for sc.Scan() {
			j.last = append(j.last, sc.Text())
		}
	}()
	return j, nil
}

// closeAll closes files whose close errors tell nothing (pipe ends).
func closeAll(files ...*os.File) {
	for _, f := range files {
		_ = f.Close()
	}
}

// ignoreWhileRunning makes a write to a closed pipe fail with EPIPE
// instead of killing dlock, and a write to the terminal from the
// background (stty tostop) proceed instead of stopping dlock: either would
// leave COMMAND running while the lease expires. It returns the function
// that undoes it.
func ignoreWhileRunning() (restore func()) {
	signal.Ignore(syscall.SIGPIPE, syscall.SIGTTOU)
	return func() { signal.Reset(syscall.SIGPIPE, syscall.SIGTTOU) }
}

// guardExecutable is the dlock binary to run the guard with.
func guardExecutable() (string, error) {
	if _, err := os.Stat("/proc/self/exe"); err == nil {
		return "/proc/self/exe", nil // even if the file was replaced since
	}
	return os.Executable()
}

func (j *guardJob) signal(sig syscall.Signal) { j.request(byte(sig)) }

func (j *guardJob) stop() { j.request(lostByte) }

// request sends b to the guard, then continues the guard: one stopped with
// its group (SIGSTOP cannot be caught) would not read it. Only the guard:
// after a lost lease the rest of the group must not run again before it
// is signalled. The guard is not reaped before wait, so its pid is ours.
func (j *guardJob) request(b byte) {
	_, _ = j.requests.Write([]byte{b})
	_ = syscall.Kill(j.cmd.Process.Pid, syscall.SIGCONT)
}

func (j *guardJob) done() <-chan struct{} { return j.ended }

// wait, once done, kills whatever is left of the group (nothing, unless
// the guard itself was killed), reaps the guard and returns how COMMAND
// ended.
func (j *guardJob) wait() jobResult {
	<-j.ended
	// The guard is not reaped yet, so its group id is still ours.
	_ = syscall.Kill(-j.cmd.Process.Pid, syscall.SIGKILL)
	_ = j.requests.Close()
	werr := j.cmd.Wait()
	for _, r := range j.last {
		kind, rest, _ := strings.Cut(r, " ")
		switch kind {
		case "x": // COMMAND's wait status
			ws, err := strconv.Atoi(rest)
			if err == nil {
				return resultOf(syscall.WaitStatus(ws))
			}
		case "e": // COMMAND could not run: code and message
			code, msg, _ := strings.Cut(rest, " ")
			c, err := strconv.Atoi(code)
			if err == nil {
				return jobResult{startCode: c, startErr: msg}
			}
		}
	}
	// The guard ended without a report: killed before COMMAND ended, so
	// was COMMAND (by the guard's group kill, or just above).
	if ws, ok := j.cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return jobResult{code: 128 + int(ws.Signal()), sig: ws.Signal()}
	}
	return jobResult{startCode: exitFailed, startErr: fmt.Sprintf("the guard process ended without a report (%v)", werr)}
}

// resultOf turns a wait status into a result.
func resultOf(ws syscall.WaitStatus) jobResult {
	if ws.Signaled() {
		return jobResult{code: 128 + int(ws.Signal()), sig: ws.Signal()}
	}
	return jobResult{code: ws.ExitStatus()}
}

// guardSignals are caught by the guard: signals to the whole group (a
// terminal's Ctrl-C, Ctrl-\ and Ctrl-Z, dlock's forwarding) must not end
// or stop it. They are caught rather than ignored so that COMMAND
// starts with them at their defaults: an ignored signal stays ignored
// across exec.
var guardSignals = []os.Signal{
	syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT,
	syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU, syscall.SIGPIPE,
}

// guard is the guard process's state.
type guard struct {
	pgid      int
	cmd       *exec.Cmd
	report    *os.File
	leftovers string
	grace     time.Duration
	exited    bool // COMMAND has been reaped
	stopping  bool // SIGTERM sent to the group; SIGKILL follows at kill
	kill      <-chan time.Time
}

// runGuard is the guard process: "dlock __run-guard LEFTOVERS GRACE
// REQUESTFD REPORTFD -- COMMAND...". It returns its exit code, which nobody
// reads: what matters goes on the report pipe.
func runGuard(args []string, stderr io.Writer) int {
	if len(args) < 6 || args[4] != "--" {
		fmt.Fprintf(stderr, "dlock: %s is started by dlock run only\n", guardCommand)
		return exitUsage
	}
	grace, err := time.ParseDuration(args[1])
	reqFD, reqErr := strconv.Atoi(args[2])
	repFD, repErr := strconv.Atoi(args[3])
	if err != nil || reqErr != nil || repErr != nil || reqFD < 3 || repFD < 3 || reqFD == repFD ||
		!isPipe(reqFD) || !isPipe(repFD) || syscall.Getpgrp() != os.Getpid() {
		fmt.Fprintf(stderr, "dlock: %s is started by dlock run only\n", guardCommand)
		return exitUsage
	}
	requests, report := os.NewFile(uintptr(reqFD), "requests"), os.NewFile(uintptr(repFD), "report")
	syscall.CloseOnExec(reqFD) // COMMAND must not keep them open
	syscall.CloseOnExec(repFD)
	g := &guard{pgid: os.Getpid(), report: report, leftovers: args[0], grace: grace}
	caught := make(chan os.Signal, 16)
	// Not those dlock was started ignoring (and the guard with them):
	// COMMAND inherits them ignored.
	signal.Notify(caught, notIgnored(guardSignals...)...)
	adoptOrphans()

	reqs := make(chan byte)
	go func() {
		defer close(reqs) // dlock has gone
		buf := make([]byte, 64)
		for {
			n, err := requests.Read(buf)
			for _, b := range buf[:n] {
				reqs <- b
			}
			if err != nil {
				return
			}
		}
	}()

	// Children are reaped here, in the loop, so that COMMAND's pid is
	// never signalled after it has been reaped (and could be reused).
	chld := make(chan os.Signal, 1)
	signal.Notify(chld, syscall.SIGCHLD)
	g.cmd = exec.Command(args[5], args[6:]...)
	g.cmd.Stdin, g.cmd.Stdout, g.cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := g.cmd.Start(); err != nil {
		code := exitCannotRun
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			code = exitNotFound
		}
		fmt.Fprintf(report, "e %d %s\n", code, strings.ReplaceAll(err.Error(), "\n", " "))
		return code
	}
	for {
		if g.reap() {
			return exitOK
		}
		select {
		case <-chld:
		case b, ok := <-reqs:
			switch {
			case !ok:
				reqs = nil
				g.killAll()
			case b == lostByte:
				g.beginStop()
			default:
				g.signal(syscall.Signal(b))
				g.signal(syscall.SIGCONT) // a stopped process acts on it only once continued
			}
		case <-g.kill:
			g.killAll()
		case sig := <-caught:
			// The group got it too (a terminal's Ctrl-C after Ctrl-Z, say):
			// a stopped process acts on it only once continued.
			if sig == syscall.SIGINT || sig == syscall.SIGTERM || sig == syscall.SIGHUP || sig == syscall.SIGQUIT {
				_ = syscall.Kill(-g.pgid, syscall.SIGCONT)
			}
		}
	}
}

// reap reaps every child that has exited, reports COMMAND's end, and says
// whether the guard is done: COMMAND has exited and nothing is left of the
// group. With --leftovers kill, COMMAND's end stops the rest of the group.
func (g *guard) reap() (done bool) {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		switch {
		case errors.Is(err, syscall.EINTR):
			continue
		case err != nil || pid <= 0: // err: ECHILD, no child left at all
			if !g.exited {
				return false
			}
			if (err != nil && canAdoptOrphans) || groupEmpty(g.pgid) {
				return true
			}
			if g.leftovers == leftoversKill {
				g.beginStop()
			}
			return false
		case pid == g.cmd.Process.Pid:
			g.exited = true
			fmt.Fprintf(g.report, "x %d\n", int(ws))
		}
	}
}

// isPipe reports whether fd is open on a pipe.
func isPipe(fd int) bool {
	var st syscall.Stat_t
	return syscall.Fstat(fd, &st) == nil && st.Mode&syscall.S_IFMT == syscall.S_IFIFO
}

// signal sends sig to the group and to COMMAND, which may have left it.
func (g *guard) signal(sig syscall.Signal) {
	if !g.exited {
		_ = syscall.Kill(g.cmd.Process.Pid, sig)
	}
	_ = syscall.Kill(-g.pgid, sig)
}

// beginStop stops the group: SIGTERM now and SIGKILL after the grace (at
// once with no grace). Once COMMAND has exited, where the guard cannot
// tell when the rest of the group is gone (it adopts no orphans), the rest
// is killed at once.
func (g *guard) beginStop() {
	if g.stopping {
		return
	}
	g.stopping = true
	if g.exited && !canAdoptOrphans {
		g.killAll()
		return
	}
	if g.grace == 0 {
		g.killAll()
		return
	}
	g.signal(syscall.SIGTERM)
	g.signal(syscall.SIGCONT)
	g.kill = time.After(g.grace)
}

// killAll kills COMMAND and the whole group with SIGKILL, the guard
// included: dlock takes the guard's end for the group's.
func (g *guard) killAll() {
	g.signal(syscall.SIGKILL)
	// Only reached if the signal to our own group failed.
	os.Exit(exitFailed)
}
