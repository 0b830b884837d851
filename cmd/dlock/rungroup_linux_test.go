package main

// Tests that nothing COMMAND started runs on without the lock: its
// background children, after a lost lease, a killed dlock, a dlock that
// cannot write its messages, and a COMMAND that is stopped.

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/redistest"
)

// pids parses the pids a COMMAND printed on one line.
func pids(t *testing.T, line string) []int {
	t.Helper()
	var ps []int
	for _, f := range strings.Fields(line) {
		pid, err := strconv.Atoi(f)
		if err != nil || pid <= 0 {
			t.Fatalf("not a list of pids: %q", line)
		}
		ps = append(ps, pid)
	}
	return ps
}

// mustBeGone fails unless each of pids has ended or ends within
// procTimeout (a process killed with SIGKILL may take a moment to go).
func mustBeGone(t *testing.T, what string, pids ...int) {
	t.Helper()
	for _, pid := range pids {
		if !gone(pid) {
			t.Errorf("%s (pid %d) still runs", what, pid)
		}
	}
}

// lockState returns the state dlock status reports for name.
func lockState(t *testing.T, addr, name string) string {
	t.Helper()
	code, out, errOut := runDlock(t, addr, "status", name)
	if code != 0 {
		t.Fatalf("status %s: exit %d; stderr %q", name, code, errOut)
	}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "state" {
			return f[1]
		}
	}
	t.Fatalf("status %s shows no state:\n%s", name, out)
	return ""
}

// A lost lease ends COMMAND's whole group within --kill-grace: a
// background child that ignores SIGTERM is killed even though the group's
// first process (sh) exits on SIGTERM at once.
func TestRunLeaseLostKillsWholeGroup(t *testing.T) {
	t.Parallel()
	for _, leftovers := range []string{"kill", "wait"} {
		t.Run(leftovers, func(t *testing.T) {
			t.Parallel()
			s := redistest.Start(t)
			rdb := s.Client(t)
			p := startDlock(t, s.Addr(), "run", "--ttl", "1s", "--kill-grace", "300ms", "--leftovers", leftovers, "lost-group", "--",
				"sh", "-c", `(trap "" TERM; exec sleep 301) & echo $!; wait`)
			bg := pids(t, p.line())[0]
			if n := rdb.Del(t.Context(), "dlock:{lost-group}").Val(); n != 1 {
				t.Fatalf("DEL removed %d keys", n)
			}
			if code := p.exit(); code != exitLeaseLost {
				t.Errorf("exit %d, want %d; stderr %q", code, exitLeaseLost, p.stderr)
			}
			mustBeGone(t, "a background child that ignores SIGTERM, after the lease was lost", bg)
		})
	}
}

// A dlock killed with SIGKILL takes COMMAND's whole group with it, not
// only its first process, so nothing runs on once the lease expires.
func TestRunKilledTakesGroup(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	p := startDlock(t, s.Addr(), "run", "--ttl", "2s", "killed", "--", "sh", "-c", `sleep 302 & echo $$ $!; wait`)
	ps := pids(t, p.line())
	p.signal(syscall.SIGKILL)
	<-p.done
	mustBeGone(t, "COMMAND and its background child, after dlock was killed", ps...)
}

// When COMMAND exits, what it left running in its group is killed (the
// default, --leftovers kill) or keeps the lock until it has exited
// (--leftovers wait, as with flock(1)): never does it run unlocked.
func TestRunLeftovers(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)

	p := startDlock(t, s.Addr(), "run", "leftovers-kill", "--", "sh", "-c", `sleep 303 & echo $!`)
	bg := pids(t, p.line())[0]
	if code := p.exit(); code != 0 {
		t.Errorf("--leftovers kill: exit %d; stderr %q", code, p.stderr)
	}
	mustBeGone(t, "a background child left by COMMAND (--leftovers kill)", bg)

	p = startDlock(t, s.Addr(), "run", "--leftovers", "wait", "leftovers-wait", "--", "sh", "-c", `sleep 304 & echo $$ $!; exit 3`)
	ps := pids(t, p.line())
	mustBeGone(t, "COMMAND", ps[0])
	if p.exited() {
		t.Fatalf("--leftovers wait: dlock exited (stderr %q) while COMMAND's background child runs", p.stderr)
	}
	if st := lockState(t, s.Addr(), "leftovers-wait"); st != "held" {
		t.Errorf("--leftovers wait: the lock is %s while COMMAND's background child runs", st)
	}
	if !running(ps[1]) {
		t.Fatalf("the background child (pid %d) ended on its own", ps[1])
	}
	_ = syscall.Kill(ps[1], syscall.SIGKILL)
	if code := p.exit(); code != 3 {
		t.Errorf("--leftovers wait: exit %d, want COMMAND's 3; stderr %q", code, p.stderr)
	}
	if st := lockState(t, s.Addr(), "leftovers-wait"); st != "free" {
		t.Errorf("--leftovers wait: the lock is %s after the group ended", st)
	}
}

// With stderr a pipe nobody reads any more, dlock's "lost lock" line fails
// with EPIPE instead of killing dlock (SIGPIPE) before it has stopped
// COMMAND's group.
func TestRunLeaseLostStderrClosed(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	rdb := s.Client(t)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	_ = r.Close()
	t.Cleanup(func() { _ = w.Close() })
	p := startDlockWith(t, func(c *exec.Cmd) {
		c.Env = append(c.Env, "DLOCK_REDIS_URL=redis://"+s.Addr(), "REDIS_URL=")
		c.Stderr = w
	}, "run", "--ttl", "1s", "--kill-grace", "0s", "stderr-closed", "--", "sh", "-c", `sleep 305 & echo $$ $!; wait`)
	ps := pids(t, p.line())
	if n := rdb.Del(t.Context(), "dlock:{stderr-closed}").Val(); n != 1 {
		t.Fatalf("DEL removed %d keys", n)
	}
	if code, sig := p.end(); code != exitLeaseLost {
		t.Errorf("exit %d (signal %v), want %d", code, sig, exitLeaseLost)
	}
	mustBeGone(t, "COMMAND's group after a lost lease, stderr closed", ps...)
}

// With "stty tostop", a dlock in a background job is not stopped by
// SIGTTOU when it writes its "lost lock" line to the terminal: it stops
// COMMAND and exits 76.
func TestRunLeaseLostTostop(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	rdb := s.Client(t)
	dir := t.TempDir()
	// bash with job control (-m) runs dlock as a background job of the
	// terminal; COMMAND writes only to a file, so only dlock's own write
	// meets tostop.
	script := `stty tostop; "$0" run --ttl 1s --kill-grace 0s tostop -- sh -c 'echo $$ > "$1/pid.tmp"; mv "$1/pid.tmp" "$1/pid"; exec sleep 306' sh "$1" >/dev/null & wait $!; echo "dlock ended $?"`
	p := startOnPTY(t, s.Addr(), "bash", "-m", "-c", script, dlockBinary(t), dir)
	var pid int
	deadline := time.Now().Add(procTimeout)
	for pid == 0 {
		if b, err := os.ReadFile(filepath.Join(dir, "pid")); err == nil {
			pid = pids(t, string(b))[0]
		} else if time.Now().After(deadline) {
			t.Fatalf("COMMAND did not start within %v; terminal: %q", procTimeout, p.out)
		} else {
			time.Sleep(pollEvery)
		}
	}
	if n := rdb.Del(t.Context(), "dlock:{tostop}").Val(); n != 1 {
		t.Fatalf("DEL removed %d keys", n)
	}
	p.waitFor("dlock ended", "")
	if out := p.out.String(); !strings.Contains(out, "dlock ended 76") || !strings.Contains(out, "lost lock") {
		t.Errorf("want dlock's lost-lock line and exit 76 on the terminal: %q", out)
	}
	mustBeGone(t, "COMMAND after a lost lease, with tostop", pid)
}

// A COMMAND that reads /dev/tty while dlock's standard input is a pipe is
// given the terminal (found on another descriptor or through /dev/tty),
// instead of being stopped by SIGTTIN while dlock holds the lock forever.
func TestRunTerminalNotOnStdin(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	p := startOnPTY(t, s.Addr(), "sh", "-c", `echo | "$0" run tty-not-stdin -- sh -c 'read x </dev/tty; echo "got $x"'`, dlockBinary(t))
	p.typeIn("hello\n")
	p.waitFor("got hello", "")
	if code := p.end(); code != 0 {
		t.Errorf("exit %d; terminal: %q", code, p.out)
	}
}

// A signal forwarded to a stopped COMMAND is followed by SIGCONT, so that
// it takes effect instead of staying pending while dlock keeps the lock.
func TestRunSignalsStoppedCommand(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	p := startDlock(t, s.Addr(), "run", "stopped", "--", "sh", "-c", `echo $$; kill -STOP $$; echo resumed`)
	sh := pids(t, p.line())[0]
	deadline := time.Now().Add(procTimeout)
	for !stopped(sh) {
		if time.Now().After(deadline) {
			t.Fatalf("COMMAND (pid %d) did not stop", sh)
		}
		time.Sleep(pollEvery)
	}
	p.signal(syscall.SIGTERM)
	p.killedBy(syscall.SIGTERM)
	if strings.Contains(p.stdout.String(), "resumed") {
		t.Errorf("COMMAND went on after SIGTERM: %q", p.stdout)
	}
}

// Ctrl-C on the terminal ends a shell loop of dlock runs, as it would a
// loop of COMMANDs: dlock dies of SIGINT (after releasing the lock) rather
// than exiting 130, so that the shell knows it was interrupted.
func TestRunCtrlCEndsCallingLoop(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	for i, shell := range [][]string{{"bash", "-c"}, {"bash", "-i", "-c"}} {
		name := "ctrl-c-loop-" + strconv.Itoa(i)
		t.Run(strings.Join(shell, " "), func(t *testing.T) {
			script := `for i in 1 2 3; do "$0" run ` + name + ` -- sh -c 'echo "run $1"; exec sleep 307' sh $i; done; echo after-loop`
			argv := append(append(append([]string{}, shell...), script), dlockBinary(t))
			p := startOnPTY(t, s.Addr(), argv...)
			p.waitFor("run 1", "")
			p.typeIn("\x03")
			select {
			case <-p.done:
			case <-time.After(procTimeout):
				t.Fatalf("the shell did not end within %v; terminal: %q", procTimeout, p.out)
			}
			if out := p.out.String(); strings.Contains(out, "run 2") || strings.Contains(out, "after-loop") {
				t.Errorf("the loop went on after Ctrl-C: %q", out)
			}
			if st := lockState(t, s.Addr(), name); st != "free" {
				t.Errorf("the lock is %s after Ctrl-C", st)
			}
		})
	}
}

// sigMasks reads the SigIgn and SigBlk masks a script printed.
func sigMasks(t *testing.T, out string) (ign, blk uint64) {
	t.Helper()
	for _, l := range strings.Split(out, ";") {
		k, v, ok := strings.Cut(strings.TrimSpace(l), ":")
		if !ok {
			continue
		}
		m, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64)
		if err != nil {
			t.Fatalf("bad mask in %q", out)
		}
		switch k {
		case "SigIgn":
			ign = m
		case "SigBlk":
			blk = m
		}
	}
	return ign, blk
}

// COMMAND starts with no signal ignored or blocked that it would not have
// had without dlock: dlock ignores SIGPIPE and SIGTTOU while it runs, and
// the guard catches the group's signals, but an ignored signal would stay
// ignored across exec.
func TestRunCommandSignalState(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	script := `grep -E '^Sig(Ign|Blk):' /proc/$$/status | tr '\n' ';'`
	direct, err := exec.Command("sh", "-c", script).Output()
	if err != nil {
		t.Fatal(err)
	}
	wantIgn, wantBlk := sigMasks(t, string(direct))
	p := startDlock(t, s.Addr(), "run", "sig-state", "--", "sh", "-c", script+`; echo`)
	ign, blk := sigMasks(t, p.line())
	if extra := ign &^ wantIgn; extra != 0 {
		t.Errorf("COMMAND starts with signals ignored (mask %#x) that it would not have without dlock", extra)
	}
	if blk != wantBlk {
		t.Errorf("COMMAND starts with blocked signals %#x, want %#x", blk, wantBlk)
	}
	if code := p.exit(); code != 0 {
		t.Errorf("exit %d; stderr %q", code, p.stderr)
	}
}

// If the guard that leads COMMAND's group is itself killed, dlock kills
// what is left of the group (its id is still reserved: dlock has not
// reaped the guard) before it releases the lock.
func TestRunGuardKilled(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	p := startDlock(t, s.Addr(), "run", "guard-killed", "--", "sh", "-c", `sleep 312 & echo $PPID $$ $!; wait`)
	ps := pids(t, p.line())
	if err := syscall.Kill(ps[0], syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	p.end()
	mustBeGone(t, "COMMAND and its child, after the guard was killed", ps[1:]...)
	if st := lockState(t, s.Addr(), "guard-killed"); st != "free" {
		t.Errorf("the lock is %s after dlock ended", st)
	}
}

// A COMMAND that leaves the group (setsid) is still COMMAND: a lost lease
// ends it too, SIGKILL after --kill-grace if it ignores SIGTERM.
func TestRunLeaseLostCommandLeftGroup(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	rdb := s.Client(t)
	p := startDlock(t, s.Addr(), "run", "--ttl", "1s", "--kill-grace", "300ms", "left-group", "--",
		"setsid", "sh", "-c", `trap "" TERM; echo $$; exec sleep 313`)
	cmd := pids(t, p.line())[0]
	if f := procStat(cmd); len(f) < 4 || f[3] != strconv.Itoa(cmd) {
		t.Fatalf("COMMAND (pid %d) did not lead a session of its own: %v", cmd, f)
	}
	if n := rdb.Del(t.Context(), "dlock:{left-group}").Val(); n != 1 {
		t.Fatalf("DEL removed %d keys", n)
	}
	if code := p.exit(); code != exitLeaseLost {
		t.Errorf("exit %d, want %d; stderr %q", code, exitLeaseLost, p.stderr)
	}
	mustBeGone(t, "COMMAND that left the group, after the lease was lost", cmd)
}

// A signal sent to dlock reaches COMMAND even when its whole group,
// guard included, was stopped with SIGSTOP (which the guard cannot catch).
func TestRunSignalsStoppedGroup(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	p := startDlock(t, s.Addr(), "run", "stopped-group", "--", "sh", "-c", `echo $PPID; exec sleep 314`)
	guard := pids(t, p.line())[0]
	if err := syscall.Kill(-guard, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(procTimeout)
	for !stopped(guard) {
		if time.Now().After(deadline) {
			t.Fatalf("the guard (pid %d) did not stop", guard)
		}
		time.Sleep(pollEvery)
	}
	p.signal(syscall.SIGTERM)
	p.killedBy(syscall.SIGTERM)
}

// On a terminal, Ctrl-C after Ctrl-Z still ends COMMAND: the guard
// continues the group when a terminating signal reaches it, as dlock does
// after each signal it forwards.
func TestRunCtrlCAfterCtrlZ(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	p := startOnPTY(t, s.Addr(), dlockBinary(t), "run", "ctrl-z", "--", "sh", "-c", `echo "pid $$"; exec sleep 315`)
	p.waitFor("pid ", "")
	var pid int
	for _, l := range strings.Split(p.out.String(), "\n") {
		if f := strings.Fields(l); len(f) == 2 && f[0] == "pid" {
			pid = pids(t, f[1])[0]
		}
	}
	p.typeIn("\x1a") // Ctrl-Z
	deadline := time.Now().Add(procTimeout)
	for !stopped(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("COMMAND (pid %d) was not stopped by Ctrl-Z; terminal %q", pid, p.out)
		}
		time.Sleep(pollEvery)
	}
	p.typeIn("\x03") // Ctrl-C
	if code := p.end(); code != 128+int(syscall.SIGINT) {
		t.Errorf("exit %d, want %d; terminal %q", code, 128+int(syscall.SIGINT), p.out)
	}
}

// A SIGINT sent to dlock alone (kill -INT, not the terminal's Ctrl-C) and
// forwarded to COMMAND ends dlock alone, on a terminal too: the calling
// shell then goes on, as it would if COMMAND had been sent SIGINT, and
// the rest of dlock's process group is not interrupted.
func TestRunForwardedSIGINTEndsDlockAlone(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	dir := t.TempDir()
	script := `"$0" run forwarded-int -- sh -c 'echo $PPID > "$1/guard.tmp"; mv "$1/guard.tmp" "$1/guard"; exec sleep 317' sh "$1"; echo "dlock ended $?" > "$1/after"`
	p := startOnPTY(t, s.Addr(), "bash", "-c", script, dlockBinary(t), dir)
	var guard int
	deadline := time.Now().Add(procTimeout)
	for guard == 0 {
		if b, err := os.ReadFile(filepath.Join(dir, "guard")); err == nil {
			guard = pids(t, string(b))[0]
		} else if time.Now().After(deadline) {
			t.Fatalf("COMMAND did not start within %v; terminal: %q", procTimeout, p.out)
		} else {
			time.Sleep(pollEvery)
		}
	}
	f := procStat(guard)
	if len(f) < 2 {
		t.Fatalf("the guard (pid %d) is gone", guard)
	}
	dlockPID, err := strconv.Atoi(f[1])
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(dlockPID, syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	code := p.end()
	after, _ := os.ReadFile(filepath.Join(dir, "after"))
	if code != 0 || string(after) != "dlock ended 130\n" {
		t.Errorf("the calling shell did not go on after dlock: exit %d, wrote %q; want 0 and \"dlock ended 130\"; terminal %q", code, after, p.out)
	}
}

// A dlock started with SIGINT and SIGHUP ignored (a background job of a
// script, nohup) leaves them ignored, for COMMAND too, as flock(1) does:
// neither sent to dlock nor sent to COMMAND's group (as a terminal's
// hangup is) does one end COMMAND.
func TestRunStartedIgnoringINTAndHUP(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	p := startDlockWith(t, func(c *exec.Cmd) {
		c.Env = append(c.Env, "DLOCK_REDIS_URL=redis://"+s.Addr(), "REDIS_URL=")
		// The shell sets them ignored and becomes dlock.
		c.Args = append([]string{"sh", "-c", `trap "" INT HUP; exec "$0" "$@"`, c.Path}, c.Args[1:]...)
		c.Path = "/bin/sh"
	}, "run", "started-ignoring", "--", "sh", "-c",
		`trap "exit 7" TERM; echo "$PPID $(grep '^SigIgn:' /proc/$$/status | cut -f2)"; while :; do sleep 0.1; done`)
	f := strings.Fields(p.line())
	if len(f) != 2 {
		t.Fatalf("COMMAND printed %q", f)
	}
	guard := pids(t, f[0])[0]
	ign, err := strconv.ParseUint(f[1], 16, 64)
	if err != nil {
		t.Fatal(err)
	}
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGHUP} {
		if ign&(1<<(sig-1)) == 0 {
			t.Errorf("COMMAND starts with %v not ignored (SigIgn %s), though dlock was started ignoring it", sig, f[1])
		}
		p.signal(sig)
		_ = syscall.Kill(-guard, sig)
	}
	p.signal(syscall.SIGTERM) // forwarded: the trap exits 7
	if code := p.exit(); code != 7 {
		t.Errorf("exit %d, want 7 (COMMAND's, on SIGTERM after SIGINT and SIGHUP); stderr %q", code, p.stderr)
	}
}
