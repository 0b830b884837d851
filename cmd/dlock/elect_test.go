package main

import (
	"encoding/json"
	"strings"
	"syscall"
	"testing"

	"github.com/dlock-go/dlock/internal/redistest"
)

// leaderOf runs dlock leader --json NAME and returns what it printed.
func leaderOf(t *testing.T, addr, name string) leaderInfo {
	t.Helper()
	code, out, errOut := runDlock(t, addr, "leader", "--json", name)
	var li leaderInfo
	if err := json.Unmarshal([]byte(out), &li); code != 0 || err != nil {
		t.Fatalf("leader --json %s: exit %d, %v; stdout %q, stderr %q", name, code, err, out, errOut)
	}
	return li
}

// watchLine reads the next report of dlock leader --watch --json.
func watchLine(t *testing.T, p *dlockProc) leaderInfo {
	t.Helper()
	line := p.line()
	var li leaderInfo
	if err := json.Unmarshal([]byte(line), &li); err != nil {
		t.Fatalf("leader --watch --json printed %q: %v", line, err)
	}
	return li
}

// dlock elect runs COMMAND once elected, with the term as DLOCK_FENCE; a
// second candidate waits, and leads at once when the first one's COMMAND
// ends; dlock leader shows each leader, and --watch follows the change.
func TestElectRunsWhileLeader(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	rdb := s.Client(t)
	if li := leaderOf(t, s.Addr(), "jobs"); li.Leader || li.Name != "jobs" {
		t.Fatalf("leader before any candidate: %+v", li)
	}
	if code, out, _ := runDlock(t, s.Addr(), "leader", "jobs"); code != 0 || out != "no leader\n" {
		t.Fatalf("leader (text) before any candidate: exit %d, %q", code, out)
	}
	first := startDlock(t, s.Addr(), "elect", "--ttl", "2s", "--value", "first", "jobs", "--", "sh", "-c", `echo "$DLOCK_FENCE"; exec sleep 30`)
	f1 := fenceOf(t, first.line())
	if li := leaderOf(t, s.Addr(), "jobs"); li != (leaderInfo{Name: "jobs", Leader: true, Value: "first", Fence: f1}) {
		t.Fatalf("leader of the first candidate: %+v, want first with fence %d", li, f1)
	}
	if code, out, _ := runDlock(t, s.Addr(), "leader", "jobs"); code != 0 || !strings.Contains(out, "first") || !strings.Contains(out, "fence") {
		t.Fatalf("leader (text): exit %d, %q", code, out)
	}
	second := startDlock(t, s.Addr(), "elect", "--value", "second", "jobs", "--", "sh", "-c", `echo "$DLOCK_FENCE"`)
	waitSubscribed(t, rdb, "dlock:{jobs}", 1)
	watch := startDlock(t, s.Addr(), "leader", "--watch", "--json", "jobs")
	if li := watchLine(t, watch); li.Value != "first" || li.Fence != f1 {
		t.Fatalf("the watch's first report: %+v", li)
	}
	if second.exited() {
		t.Fatalf("the second candidate exited while the first led: %s", second.stderr)
	}
	first.signal(syscall.SIGTERM) // forwarded: sleep dies of it, and dlock as it did, after resigning
	first.killedBy(syscall.SIGTERM)
	f2 := fenceOf(t, second.line())
	if f2 <= f1 {
		t.Fatalf("the second leader's term %d is not above the first's %d", f2, f1)
	}
	if code := second.exit(); code != 0 {
		t.Fatalf("second candidate: exit %d; stderr %q", code, second.stderr)
	}
	for li := watchLine(t, watch); li.Value != "second"; li = watchLine(t, watch) {
		if li.Leader { // nobody may lead in between, never the first again
			t.Fatalf("the watch reported %+v before the second leader", li)
		}
	}
	if li := watchLine(t, watch); li.Leader {
		t.Fatalf("the watch reported %+v after the second leader resigned, want no leader", li)
	}
	watch.signal(syscall.SIGINT)
	if code := watch.exit(); code != exitInterrupted {
		t.Errorf("leader --watch after SIGINT: exit %d, want %d", code, exitInterrupted)
	}
}

// Leadership lost while COMMAND runs is handled as dlock run handles a
// lost lock: COMMAND is stopped and dlock exits 76, saying so once.
func TestElectLeadershipLost(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	rdb := s.Client(t)
	p := startDlock(t, s.Addr(), "elect", "--ttl", "1s", "--kill-grace", "300ms", "lost-leader", "--", "sh", "-c", `echo ready; sleep 31; echo survived`)
	if l := p.line(); l != "ready" {
		t.Fatalf("child printed %q", l)
	}
	if n := rdb.Del(t.Context(), "dlock:{lost-leader}").Val(); n != 1 {
		t.Fatalf("DEL removed %d keys", n)
	}
	if code := p.exit(); code != exitLeaseLost {
		t.Errorf("exit %d, want %d; stderr %q", code, exitLeaseLost, p.stderr)
	}
	errOut := p.stderr.String()
	oneLine(t, "lost leadership", errOut)
	if !strings.HasPrefix(errOut, "dlock elect: lost lock") {
		t.Errorf("stderr does not say the leadership's lock was lost: %q", errOut)
	}
	if strings.Contains(p.stdout.String(), "survived") {
		t.Errorf("COMMAND ran on after leadership was lost")
	}
}

func TestElectUsage(t *testing.T) {
	t.Setenv("DLOCK_REDIS_URL", "")
	t.Setenv("REDIS_URL", "")
	for _, args := range [][]string{
		{"elect"},
		{"elect", "name"},
		{"elect", "name", "--"},
		{"elect", "--bogus", "name", "--", "true"},
		{"elect", "--ttl", "0s", "name", "--", "true"},
		{"elect", "--leftovers", "some", "name", "--", "true"},
		{"elect", "", "--", "true"},
		{"elect", "--redis", "redis://127.0.0.1:1,redis://127.0.0.1:2,redis://127.0.0.1:3", "name", "--", "true"},
		{"leader"},
		{"leader", "a", "b"},
		{"leader", "--bogus", "a"},
		{"leader", "}a"},
	} {
		code, _, stderr := dispatchLocal(t, args...)
		if code != exitUsage {
			t.Errorf("dlock %q: exit %d, want %d; stderr %q", args, code, exitUsage, stderr)
		}
		oneLine(t, strings.Join(args, " "), stderr)
	}
	for _, c := range []string{"elect", "leader"} {
		code, out, stderr := dispatchLocal(t, c, "-h")
		if code != exitOK || stderr != "" {
			t.Errorf("dlock %s -h: exit %d, stderr %q", c, code, stderr)
		}
		for _, want := range []string{"Usage: dlock " + c, "Examples:", "Exit codes", "-redis", "-prefix"} {
			if !strings.Contains(out, want) {
				t.Errorf("dlock %s -h lacks %q:\n%s", c, want, out)
			}
		}
	}
}
