package main

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/redistest"
)

// fenceOf parses a fence a child printed.
func fenceOf(t *testing.T, s string) uint64 {
	t.Helper()
	f, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
	if err != nil || f == 0 {
		t.Fatalf("not a fence: %q", s)
	}
	return f
}

// Two dlock runs on one name: the second gives up (--wait 0, or a --wait
// that runs out) or waits and runs once the first is done, with a larger
// fence.
func TestRunRace(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	rdb := s.Client(t)

	holder := startDlock(t, s.Addr(), "run", "race", "--", "sh", "-c", `echo "$DLOCK_FENCE"; exec sleep 30`)
	f1 := fenceOf(t, holder.line())

	code, out, errOut := runDlock(t, s.Addr(), "run", "--wait", "0", "race", "--", "echo", "ran")
	if code != exitNotObtained || out != "" {
		t.Fatalf("second run --wait 0: exit %d, stdout %q; want %d and no output (stderr %q)", code, out, exitNotObtained, errOut)
	}
	oneLine(t, "not obtained", errOut)
	if !strings.Contains(errOut, "not obtained") {
		t.Errorf("stderr does not say the lock was not obtained: %q", errOut)
	}
	if code, _, errOut := runDlock(t, s.Addr(), "run", "race", "--conflict-exit-code", "9", "--", "true"); code != 9 {
		t.Errorf("--conflict-exit-code 9: exit %d (stderr %q)", code, errOut)
	}
	if code, _, errOut := runDlock(t, s.Addr(), "run", "--wait", "200ms", "race", "--", "true"); code != exitNotObtained || !strings.Contains(errOut, "within 200ms") {
		t.Errorf("--wait 200ms on a held lock: exit %d, stderr %q; want %d", code, errOut, exitNotObtained)
	}

	waiter := startDlock(t, s.Addr(), "run", "--wait", "20s", "race", "--", "sh", "-c", `echo "$DLOCK_FENCE"`)
	waitSubscribed(t, rdb, "dlock:{race}", 1)
	if waiter.exited() {
		t.Fatalf("the waiter exited while the lock was held: %s", waiter.stderr)
	}
	holder.signal(syscall.SIGTERM) // forwarded: sleep dies of it, and dlock as it did
	holder.killedBy(syscall.SIGTERM)
	if f2 := fenceOf(t, waiter.line()); f2 <= f1 {
		t.Errorf("the waiter's fence %d is not above the first holder's %d", f2, f1)
	}
	if code := waiter.exit(); code != 0 {
		t.Errorf("waiter: exit %d; stderr %q", code, waiter.stderr)
	}
}

// COMMAND sees DLOCK_NAME, DLOCK_TOKEN and DLOCK_FENCE, and they are what
// Redis holds for the lock; the lock is free again afterwards.
func TestRunEnvironmentAndStatus(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)

	p := startDlock(t, s.Addr(), "run", "env-test", "--ttl", "7s", "--", "sh", "-c", `echo "$DLOCK_NAME $DLOCK_TOKEN $DLOCK_FENCE"; exec sleep 30`)
	fields := strings.Fields(p.line())
	if len(fields) != 3 {
		t.Fatalf("child printed %q, want NAME TOKEN FENCE", fields)
	}
	name, token, fence := fields[0], fields[1], fenceOf(t, fields[2])
	if name != "env-test" || len(token) != 22 {
		t.Errorf("DLOCK_NAME %q, DLOCK_TOKEN %q; want env-test and a 22-character token", name, token)
	}

	code, out, errOut := runDlock(t, s.Addr(), "status", "env-test", "--json")
	if code != 0 {
		t.Fatalf("status: exit %d; stderr %q", code, errOut)
	}
	var st lockInfo
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("status --json does not parse: %v\n%s", err, out)
	}
	if st.Name != "env-test" || st.Key != "dlock:{env-test}" || st.Type != "mutex" || st.State != "held" ||
		st.Token != token || st.Fence != fence || st.TTLMillis <= 0 || st.TTLMillis > 7000 {
		t.Errorf("status of a held lock: %+v; want held by %s, fence %d, 0 < ttl <= 7000", st, token, fence)
	}
	if code, out, _ := runDlock(t, s.Addr(), "status", "env-test"); code != 0 || !strings.Contains(out, token) || !strings.Contains(out, "held") {
		t.Errorf("status (text): exit %d, output:\n%s", code, out)
	}

	p.signal(syscall.SIGINT)
	p.killedBy(syscall.SIGINT)
	code, out, _ = runDlock(t, s.Addr(), "status", "--json", "env-test")
	st = lockInfo{}
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil {
		t.Fatalf("status after release: exit %d, %v\n%s", code, err, out)
	}
	if st.State != "free" || st.Token != "" || st.Fence != fence || st.TTLMillis <= 0 {
		t.Errorf("status after release: %+v; want free, no token, fence %d kept for the idle period", st, fence)
	}

	code, out, _ = runDlock(t, s.Addr(), "status", "--json", "never-taken")
	st = lockInfo{}
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil {
		t.Fatalf("status of a missing lock: exit %d, %v\n%s", code, err, out)
	}
	if st.Type != "none" || st.State != "free" || st.TTLMillis != -2 {
		t.Errorf("status of a missing lock: %+v", st)
	}
}

// dlock run exits with COMMAND's status, 128+N when a signal killed it, and
// 126/127 when it cannot run; each run releases the lock (else the next one
// would exit 75).
func TestRunExitStatus(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	for _, tc := range []struct {
		command []string
		want    int
	}{
		{[]string{"true"}, 0},
		{[]string{"sh", "-c", "exit 3"}, 3},
		{[]string{"sh", "-c", "exit 255"}, 255},
		{[]string{"sh", "-c", "kill -KILL $$"}, 128 + int(syscall.SIGKILL)},
		{[]string{"dlock-test-no-such-command"}, exitNotFound},
		{[]string{"/dev/null"}, exitCannotRun},
	} {
		args := append([]string{"run", "exit-status", "--"}, tc.command...)
		if code, _, errOut := runDlock(t, s.Addr(), args...); code != tc.want {
			t.Errorf("dlock %q: exit %d, want %d; stderr %q", args, code, tc.want, errOut)
		}
	}
}

// A lease lost under a running COMMAND (its key deleted) ends COMMAND's
// whole process group, with SIGKILL if it ignores SIGTERM, and dlock exits 76.
func TestRunLeaseLost(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, script string }{
		{"sigterm", `echo ready; sleep 31; echo survived`},
		{"sigkill", `trap "" TERM; echo ready; sleep 32; echo survived`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := redistest.Start(t)
			rdb := s.Client(t)
			p := startDlock(t, s.Addr(), "run", "--ttl", "1s", "--kill-grace", "300ms", "lost", "--", "sh", "-c", tc.script)
			if l := p.line(); l != "ready" {
				t.Fatalf("child printed %q", l)
			}
			if n := rdb.Del(t.Context(), "dlock:{lost}").Val(); n != 1 {
				t.Fatalf("DEL removed %d keys", n)
			}
			if code := p.exit(); code != exitLeaseLost {
				t.Errorf("exit %d, want %d; stderr %q", code, exitLeaseLost, p.stderr)
			}
			errOut := p.stderr.String()
			oneLine(t, "lost lease", errOut)
			if !strings.Contains(errOut, "lost lock") {
				t.Errorf("stderr does not say the lock was lost: %q", errOut)
			}
			if strings.Count(errOut, "dlock") != 1 || strings.Contains(errOut, "lock lost") {
				t.Errorf("stderr repeats the prefix or the loss: %q", errOut)
			}
			if strings.Contains(p.stdout.String(), "survived") {
				t.Errorf("COMMAND ran on after the lease was lost")
			}
		})
	}
}

// SIGTERM, SIGINT and SIGHUP sent to dlock reach COMMAND, whose exit
// status dlock returns.
func TestRunForwardsSignals(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	for _, tc := range []struct {
		sig  syscall.Signal
		name string
		code int
	}{
		{syscall.SIGTERM, "TERM", 7},
		{syscall.SIGINT, "INT", 8},
		{syscall.SIGHUP, "HUP", 9},
	} {
		// Short foreground sleeps, so that the trap runs soon and nothing
		// outlives the test (a background sleep could miss the signal while
		// the shell forks it, and a non-interactive shell's background jobs
		// ignore SIGINT).
		script := `trap 'exit ` + strconv.Itoa(tc.code) + `' ` + tc.name + `; echo ready; i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done`
		p := startDlock(t, s.Addr(), "run", "signals", "--", "sh", "-c", script)
		if l := p.line(); l != "ready" {
			t.Fatalf("child printed %q", l)
		}
		p.signal(tc.sig)
		if code := p.exit(); code != tc.code {
			t.Errorf("SIG%s: exit %d, want %d (the trap's); stderr %q", tc.name, code, tc.code, p.stderr)
		}
	}
}

// A signal while waiting for the lock aborts the wait: dlock dies of it,
// COMMAND not run.
func TestRunSignalWhileWaiting(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	rdb := s.Client(t)
	holder := startDlock(t, s.Addr(), "run", "busy", "--", "sh", "-c", `echo ready; exec sleep 30`)
	holder.line()
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP} {
		p := startDlock(t, s.Addr(), "run", "--wait", "forever", "busy", "--", "echo", "ran")
		waitSubscribed(t, rdb, "dlock:{busy}", 1)
		p.signal(sig)
		p.killedBy(sig)
		if out := p.stdout.String(); out != "" {
			t.Errorf("%v while waiting: COMMAND ran: %q", sig, out)
		}
		oneLine(t, "signal while waiting", p.stderr.String())
		if !strings.Contains(p.stderr.String(), "while waiting") {
			t.Errorf("stderr %q", p.stderr)
		}
		// The next waiter must not be mistaken for this one.
		waitSubscribed(t, rdb, "dlock:{busy}", 0)
	}
}

// With --fair, waiters get the lock in the order they lined up at Redis.
func TestRunFair(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	rdb := s.Client(t)
	holder := startDlock(t, s.Addr(), "run", "--fair", "fifo", "--", "sh", "-c", `echo ready; exec sleep 30`)
	holder.line()

	waitLine := func(n int64) {
		t.Helper()
		deadline := time.Now().Add(procTimeout)
		for rdb.LLen(t.Context(), "dlock:{fifo}:q").Val() != n {
			if time.Now().After(deadline) {
				t.Fatalf("the fair line did not reach %d within %v", n, procTimeout)
			}
			time.Sleep(pollEvery)
		}
	}
	first := startDlock(t, s.Addr(), "run", "--fair", "--wait", "20s", "fifo", "--", "sh", "-c", `echo "$DLOCK_FENCE"`)
	waitLine(1)
	second := startDlock(t, s.Addr(), "run", "--fair", "--wait", "20s", "fifo", "--", "sh", "-c", `echo "$DLOCK_FENCE"`)
	waitLine(2)

	code, out, errOut := runDlock(t, s.Addr(), "status", "--json", "fifo")
	var st lockInfo
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil {
		t.Fatalf("status: exit %d, %v; stderr %q", code, err, errOut)
	}
	if st.State != "held" || st.InLine != 2 || st.WaitingClients != 2 {
		t.Errorf("status with two in line: %+v", st)
	}

	holder.signal(syscall.SIGTERM)
	holder.killedBy(syscall.SIGTERM)
	f1, f2 := fenceOf(t, first.line()), fenceOf(t, second.line())
	if f1 >= f2 {
		t.Errorf("the first in line got fence %d, the second %d: not served in order", f1, f2)
	}
	for _, p := range []*dlockProc{first, second} {
		if code := p.exit(); code != 0 {
			t.Errorf("waiter: exit %d; stderr %q", code, p.stderr)
		}
	}
}

// A --wait shorter than one round trip still makes one attempt: a free
// lock is taken.
func TestRunWaitShorterThanRoundTrip(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	if code, _, errOut := runDlock(t, s.Addr(), "run", "--wait", "1ns", "short-wait", "--", "true"); code != 0 {
		t.Errorf("--wait 1ns on a free lock: exit %d; stderr %q", code, errOut)
	}
}

// A Redis outage during a finite --wait is reported as Redis unavailable
// (69), not as a lock held elsewhere, which --conflict-exit-code 0 would
// hide.
func TestRunRedisDownWhileWaiting(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	rdb := s.Client(t)
	holder := startDlock(t, s.Addr(), "run", "--ttl", "30s", "outage", "--", "sh", "-c", `echo ready; exec sleep 308`)
	holder.line()
	p := startDlock(t, s.Addr(), "run", "--wait", "3s", "--conflict-exit-code", "0", "outage", "--", "echo", "ran")
	waitSubscribed(t, rdb, "dlock:{outage}", 1)
	s.Pause()
	t.Cleanup(s.Resume)
	if code := p.exit(); code != exitUnavailable {
		t.Errorf("Redis paused during --wait: exit %d, want %d; stderr %q", code, exitUnavailable, p.stderr)
	}
	if strings.Contains(p.stdout.String(), "ran") {
		t.Errorf("COMMAND ran")
	}
}

// After a lost lease, with Redis not answering, a signal ends dlock at
// once (it dies of it) instead of waiting for a release that cannot
// happen.
func TestRunSignalAfterLostLease(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	p := startDlock(t, s.Addr(), "run", "--ttl", "1s", "--kill-grace", "0s", "lost-then-signal", "--", "sh", "-c", `echo ready; exec sleep 309`)
	p.line()
	s.Pause()
	t.Cleanup(s.Resume)
	deadline := time.Now().Add(procTimeout)
	for !strings.Contains(p.stderr.String(), "lost lock") {
		if time.Now().After(deadline) || p.exited() {
			t.Fatalf("no lost-lock line within %v; stderr %q", procTimeout, p.stderr)
		}
		time.Sleep(pollEvery)
	}
	p.signal(syscall.SIGTERM)
	p.killedBy(syscall.SIGTERM)
}

// dlock run --replica-ack N starts COMMAND only once N replicas confirmed
// the grant; with the replica stopped it exits 69, COMMAND does not run and
// the lock is left free.
func TestRunReplicaAck(t *testing.T) {
	t.Parallel()
	p := redistest.Start(t)
	r, _ := redistest.StartReplica(t, p, false)
	code, out, errOut := runDlock(t, p.Addr(), "run", "--replica-ack", "1", "acked", "--", "sh", "-c", "echo ran")
	if code != 0 || !strings.Contains(out, "ran") {
		t.Fatalf("replica up: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	r.Pause()
	t.Cleanup(r.Resume)
	code, out, errOut = runDlock(t, p.Addr(), "run", "--replica-ack", "1", "--replica-ack-timeout", "200ms", "acked", "--", "sh", "-c", "echo ran")
	if code != exitUnavailable || strings.Contains(out, "ran") || !strings.Contains(errOut, "0 of 1 replicas confirmed within 200ms") || !strings.Contains(errOut, "COMMAND not run") {
		t.Fatalf("replica stopped: exit %d (want %d), stdout %q, stderr %q", code, exitUnavailable, out, errOut)
	}
	oneLine(t, "stderr", errOut)
	if o, _ := p.Client(t).HGet(context.Background(), "dlock:{acked}", "o").Result(); o != "" {
		t.Fatalf("the lock is left owned by %q", o)
	}
	code, _, errOut = runDlock(t, p.Addr(), "run", "--replica-ack", "-1", "acked", "--", "true")
	if code != exitUsage || !strings.Contains(errOut, "--replica-ack -1") {
		t.Fatalf("--replica-ack -1: exit %d, stderr %q", code, errOut)
	}
}

// --replica-ack-timeout is a usage error, named as the flag, when it
// exceeds half the read timeout the --redis URL gives the client (the
// library refuses it then: WAIT would outlast the read) or when
// --replica-ack does not ask for replicas (it would do nothing).
func TestRunReplicaAckTimeoutFlag(t *testing.T) {
	t.Parallel()
	p := redistest.Start(t)
	url := "--redis=redis://" + p.Addr() + "?read_timeout=1s"
	for _, c := range []struct {
		args []string
		want []string
	}{
		// The default 1s is more than half the URL's read timeout.
		{[]string{"run", url, "--replica-ack", "1", "job", "--", "sh", "-c", "echo ran"},
			[]string{"--replica-ack-timeout 1s", "read_timeout"}},
		{[]string{"run", url, "--replica-ack", "1", "--replica-ack-timeout", "600ms", "job", "--", "sh", "-c", "echo ran"},
			[]string{"--replica-ack-timeout 600ms", "at most 500ms", "read_timeout"}},
		{[]string{"run", "--replica-ack-timeout", "300ms", "job", "--", "sh", "-c", "echo ran"},
			[]string{"--replica-ack-timeout", "without --replica-ack"}},
	} {
		code, out, errOut := runDlock(t, p.Addr(), c.args...)
		if code != exitUsage || strings.Contains(out, "ran") {
			t.Errorf("%q: exit %d (want %d), stdout %q, stderr %q", c.args, code, exitUsage, out, errOut)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(errOut, w) {
				t.Errorf("%q: stderr %q does not say %q", c.args, errOut, w)
			}
		}
		if strings.Contains(errOut, "WithReplicaAck") {
			t.Errorf("%q: stderr %q names the library's option, not the flag", c.args, errOut)
		}
		oneLine(t, "stderr", errOut)
	}
	// Within half the read timeout it runs (no replicas here: exit 69 says
	// the flags were taken).
	code, _, errOut := runDlock(t, p.Addr(), "run", url, "--replica-ack", "1", "--replica-ack-timeout", "500ms", "job", "--", "true")
	if code != exitUnavailable || !strings.Contains(errOut, "0 of 1 replicas confirmed within 500ms") {
		t.Fatalf("--replica-ack-timeout 500ms: exit %d (want %d), stderr %q", code, exitUnavailable, errOut)
	}
}
