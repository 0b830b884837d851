package main

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// marketPrivate starts "dlock market" on its private redis-server, with
// TMPDIR at tmp, and returns it once it has said which server it uses,
// with that server's pid and the directory it made for it.
func marketPrivate(t *testing.T, tmp string) (p *dlockProc, serverPID int, dir string) {
	t.Helper()
	p = startDlockEnv(t, []string{"TMPDIR=" + tmp, "DLOCK_REDIS_URL=", "REDIS_URL="},
		"market", "--duration", "1m", "--loads", "1/1", "--variants", "lua")
	pidRE := regexp.MustCompile(`private redis-server .*\(pid (\d+),`)
	deadline := time.After(procTimeout)
	for serverPID == 0 {
		select {
		case l := <-p.stderr.lines:
			if m := pidRE.FindStringSubmatch(l); m != nil {
				serverPID, _ = strconv.Atoi(m[1])
			}
		case <-p.done:
			t.Fatalf("dlock market exited (%s) before naming its server; stderr: %s", p.cmd.ProcessState, p.stderr)
		case <-deadline:
			t.Fatalf("dlock market named no private server within %v; stderr: %s", procTimeout, p.stderr)
		}
	}
	dirs, _ := filepath.Glob(filepath.Join(tmp, "dlock-market-"+strconv.Itoa(p.cmd.Process.Pid)+"-*"))
	if len(dirs) != 1 {
		t.Fatalf("directories of dlock market (pid %d) in TMPDIR: %v, want one", p.cmd.Process.Pid, dirs)
	}
	return p, serverPID, dirs[0]
}

// TestMarketStoppedBySignal: SIGHUP (the terminal went away) and SIGTERM
// stop dlock market in order: it exits 130, its private server is gone and
// so is the server's directory.
func TestMarketStoppedBySignal(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGHUP, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			tmp := t.TempDir()
			p, serverPID, dir := marketPrivate(t, tmp)
			p.signal(sig)
			if code := p.exit(); code != exitInterrupted {
				t.Errorf("exit %d, want %d; stderr: %s", code, exitInterrupted, p.stderr)
			}
			if running(serverPID) {
				t.Errorf("private server (pid %d) runs after dlock exited", serverPID)
			}
			if _, err := os.Stat(dir); err == nil {
				t.Errorf("%s left behind", dir)
			}
		})
	}
}

// TestMarketKilled: a dlock market killed with SIGKILL takes its private
// server with it (Pdeathsig) but cannot remove the server's directory; the
// next dlock market does.
func TestMarketKilled(t *testing.T) {
	tmp := t.TempDir()
	p, serverPID, dir := marketPrivate(t, tmp)
	p.signal(syscall.SIGKILL)
	<-p.done
	if !gone(serverPID) {
		t.Fatalf("private server (pid %d) outlived dlock killed with SIGKILL", serverPID)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("%s: %v; a killed dlock cannot have removed it", dir, err)
	}

	next := startDlockEnv(t, []string{"TMPDIR=" + tmp, "DLOCK_REDIS_URL=", "REDIS_URL="},
		"market", "--duration", "100ms", "--loads", "1/1", "--variants", "lua", "--quiet")
	if code := next.exit(); code != exitOK {
		t.Fatalf("the next dlock market: exit %d; stderr: %s", code, next.stderr)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Errorf("TMPDIR holds %v after the next dlock market, want nothing", left)
	}
}
