package main

import (
	"encoding/json"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/dlock-go/dlock/internal/redistest"
)

// quorumMasters starts n independent masters whose epoch keys say their
// data is old, so that they vote at once (a new master otherwise waits out
// the restart delay), and returns them with their URLs.
func quorumMasters(t *testing.T, n int) ([]*redistest.Server, []string) {
	t.Helper()
	servers := redistest.Masters(t, n)
	urls := make([]string, n)
	for i, s := range servers {
		s.SetOldEpoch(t, "dlock:epoch")
		urls[i] = "redis://" + s.Addr()
	}
	return servers, urls
}

// startQuorum starts dlock with args on the masters urls, given as a list
// in DLOCK_REDIS_URL.
func startQuorum(t *testing.T, urls []string, args ...string) *dlockProc {
	t.Helper()
	return startDlockEnv(t, []string{"DLOCK_REDIS_URL=" + strings.Join(urls, ","), "REDIS_URL="}, args...)
}

// runQuorum runs dlock to completion on the masters urls and returns its
// exit code and output.
func runQuorum(t *testing.T, urls []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	p := startQuorum(t, urls, args...)
	code = p.exit()
	return code, p.stdout.String(), p.stderr.String()
}

// redisFlags is urls as repeated --redis flags.
func redisFlags(urls []string) []string {
	var args []string
	for _, u := range urls {
		args = append(args, "--redis", u)
	}
	return args
}

// ownerOn returns the owner token of lock name on each of servers ("" for
// none).
func ownerOn(t *testing.T, servers []*redistest.Server, name string) []string {
	t.Helper()
	owners := make([]string, len(servers))
	for i, s := range servers {
		owners[i], _ = s.Do(t, "hget", "dlock:{"+name+"}", "o").(string)
	}
	return owners
}

// count is how many of owners are token.
func count(owners []string, token string) int {
	n := 0
	for _, o := range owners {
		if o == token {
			n++
		}
	}
	return n
}

// holderOf reads the "TOKEN FENCE" line a holder's COMMAND prints.
func holderOf(t *testing.T, p *dlockProc) (string, uint64) {
	t.Helper()
	fields := strings.Fields(p.line())
	if len(fields) != 2 {
		t.Fatalf("holder printed %q, want TOKEN FENCE", fields)
	}
	return fields[0], fenceOf(t, fields[1])
}

// quorumStatusJSON runs dlock status --json on the masters urls and parses it.
func quorumStatusJSON(t *testing.T, urls []string, wantCode int, args ...string) quorumInfo {
	t.Helper()
	code, out, errOut := runQuorum(t, urls, append([]string{"status", "--json"}, args...)...)
	if code != wantCode {
		t.Fatalf("status %q: exit %d, want %d; stderr %q", args, code, wantCode, errOut)
	}
	var q quorumInfo
	if err := json.Unmarshal([]byte(out), &q); err != nil {
		t.Fatalf("status --json does not parse: %v\n%s", err, out)
	}
	return q
}

// dlock run on 5 masters takes the lock on a majority of them; a second
// run on the same name (its masters given as --redis flags this time)
// gives up with the not-obtained code, and a third waits, woken by the
// release, and runs with a larger fence. Nothing is left held.
func TestRunQuorumExcludes(t *testing.T) {
	t.Parallel()
	servers, urls := quorumMasters(t, 5)

	holder := startQuorum(t, urls, "run", "q", "--", "sh", "-c", `echo "$DLOCK_TOKEN $DLOCK_FENCE"; exec sleep 30`)
	token, fence := holderOf(t, holder)
	if n := count(ownerOn(t, servers, "q"), token); n < 3 {
		t.Fatalf("the holder's token is on %d of 5 masters, want a majority", n)
	}

	args := append(append([]string{"run"}, redisFlags(urls)...), "--wait", "0", "q", "--", "echo", "ran")
	code, out, errOut := runDlock(t, "127.0.0.1:1", args...) // the flags win over DLOCK_REDIS_URL
	if code != exitNotObtained || out != "" {
		t.Fatalf("second run --wait 0: exit %d, stdout %q; want %d and no output (stderr %q)", code, out, exitNotObtained, errOut)
	}
	oneLine(t, "not obtained", errOut)

	waiter := startQuorum(t, urls, "run", "--wait", "20s", "q", "--", "sh", "-c", `echo "$DLOCK_FENCE"`)
	for _, s := range servers {
		waitSubscribed(t, s.Client(t), "dlock:{q}", 1) // it listens on every master
	}
	if waiter.exited() {
		t.Fatalf("the waiter exited while the lock was held: %s", waiter.stderr)
	}
	holder.signal(syscall.SIGTERM)
	holder.killedBy(syscall.SIGTERM)
	if f2 := fenceOf(t, waiter.line()); f2 <= fence {
		t.Errorf("the waiter's fence %d is not above the first holder's %d", f2, fence)
	}
	if code := waiter.exit(); code != 0 {
		t.Errorf("waiter: exit %d; stderr %q", code, waiter.stderr)
	}
	if owners := ownerOn(t, servers, "q"); count(owners, "") != 5 {
		t.Errorf("owners left after both runs ended: %q", owners)
	}
}

// dlock status on a quorum shows each master's view: what it holds (the
// holder's token, fence and lease on a majority), whether it votes (one
// master has no epoch key yet and was up for less than the restart delay),
// and a master that cannot be reached; and sums them up.
func TestStatusQuorumPerMaster(t *testing.T) {
	t.Parallel()
	servers, urls := quorumMasters(t, 5)
	servers[3].Do(t, "del", "dlock:epoch") // new: it does not vote for 30s
	servers[4].Kill()

	holder := startQuorum(t, urls, "run", "--ttl", "7s", "st", "--", "sh", "-c", `echo "$DLOCK_TOKEN $DLOCK_FENCE"; exec sleep 30`)
	token, fence := holderOf(t, holder)
	// The master that cannot be reached is named on stderr; the run goes on.
	if !strings.Contains(holder.stderr.String(), urls[4]) {
		t.Errorf("dlock run does not name the master it cannot reach: %q", holder.stderr)
	}
	owners := ownerOn(t, servers[:4], "st")
	held := count(owners, token)
	if held != 3 || owners[3] != "" {
		t.Fatalf("owners %q: want the token on the 3 voting masters", owners)
	}

	q := quorumStatusJSON(t, urls, 0, "st")
	if q.State != "held" || q.Token != token || q.HeldOn != 3 || q.Fence != fence || q.Masters != 5 || q.Majority != 3 ||
		q.Answered != 4 || q.TTLMillis <= 0 || q.TTLMillis > 7000 || q.Voting == nil || *q.Voting != 3 || len(q.PerMaster) != 5 {
		t.Fatalf("status --json: %+v; want held by %s (fence %d) on 3 of 5, 4 answered, 3 voting, 5 views", q, token, fence)
	}
	for i, v := range q.PerMaster[:3] {
		if v.Master != urls[i] || v.Lock == nil || v.Lock.State != "held" || v.Lock.Token != token || v.Lock.Fence != fence ||
			v.Lock.TTLMillis <= 0 || v.Vote == nil || !v.Vote.Votes || v.Vote.EpochMillis == nil || *v.Vote.EpochMillis != 0 {
			t.Errorf("master %d's view: %+v (lock %+v, vote %+v); want it held by the token, voting, epoch 0", i, v, v.Lock, v.Vote)
		}
	}
	if v := q.PerMaster[3]; v.Lock == nil || v.Lock.Token != "" || v.Vote == nil || v.Vote.Votes || v.Vote.EpochMillis == nil || v.Vote.VotesInMillis <= 0 {
		t.Errorf("the new master's view: %+v (vote %+v); want not held, not voting, its epoch just set by dlock run", v, v.Vote)
	}
	if v := q.PerMaster[4]; v.Master != urls[4] || v.Lock != nil || !strings.Contains(v.Error, "unreachable") {
		t.Errorf("the killed master's view: %+v; want unreachable", v)
	}

	code, out, errOut := runQuorum(t, urls, "status", "st")
	if code != 0 {
		t.Fatalf("status: exit %d; stderr %q", code, errOut)
	}
	for _, want := range []string{"held (held on 3 of 5 masters; a majority is 3)", "token    " + token, "voting   3 of 5 masters"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	for i, u := range urls {
		want := []string{"held", token[:8], "yes (data"}
		switch i {
		case 3:
			want = []string{"none", "no: data"}
		case 4:
			want = []string{"unreachable"}
		}
		if !lineWith(out, u, want...) {
			t.Errorf("status has no line for %s with %q:\n%s", u, want, out)
		}
	}
}

// lineWith reports whether a line of out begins with prefix and holds all
// of words.
func lineWith(out, prefix string, words ...string) bool {
	for _, l := range strings.Split(out, "\n") {
		if !strings.HasPrefix(l, prefix+" ") {
			continue
		}
		for _, w := range words {
			if !strings.Contains(l, w) {
				return false
			}
		}
		return true
	}
	return false
}

// dlock unlock --force on a quorum removes the holder on every master that
// holds it and says so per master; --token of another holder removes
// nothing anywhere. The removed holder loses its lease (exit 76).
func TestUnlockQuorum(t *testing.T) {
	t.Parallel()
	servers, urls := quorumMasters(t, 5)
	holder := startQuorum(t, urls, "run", "--ttl", "2s", "uq", "--", "sh", "-c", `echo "$DLOCK_TOKEN $DLOCK_FENCE"; exec sleep 30`)
	token, fence := holderOf(t, holder)
	before := ownerOn(t, servers, "uq")

	code, out, errOut := runQuorum(t, urls, "unlock", "--force", "--token", "someone-else", "uq")
	if code != exitFailed || !strings.Contains(errOut, "nothing removed") {
		t.Errorf("unlock --token of another holder: exit %d, stderr %q; want %d, nothing removed", code, errOut, exitFailed)
	}
	for i, o := range before {
		if o == token && !lineWith(out, urls[i], "held by token "+token, "left as it is") {
			t.Errorf("unlock --token of another holder does not say that master %d holds it for %s:\n%s", i, token, out)
		}
	}
	if after := ownerOn(t, servers, "uq"); strings.Join(after, ",") != strings.Join(before, ",") {
		t.Fatalf("a refused unlock changed the owners from %q to %q", before, after)
	}

	code, out, errOut = runQuorum(t, urls, "unlock", "--force", "--json", "uq")
	if code != 0 {
		t.Fatalf("unlock --force: exit %d; stderr %q", code, errOut)
	}
	var res struct {
		unlockResult
		PerMaster []masterUnlock `json:"per_master"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("unlock --json does not parse: %v\n%s", err, out)
	}
	if !res.Removed || res.Token != token || res.Fence != fence || len(res.PerMaster) != 5 {
		t.Fatalf("unlock --json: %+v; want removed token %s fence %d, 5 masters", res, token, fence)
	}
	for i, m := range res.PerMaster {
		// A master that granted after the majority has a fence of its own.
		if m.Master != urls[i] || m.Removed != (before[i] == token) || m.Removed && (m.Token != token || m.Fence == 0) {
			t.Errorf("master %d: %+v; it held %q", i, m, before[i])
		}
	}
	if owners := ownerOn(t, servers, "uq"); count(owners, "") != 5 {
		t.Errorf("owners left after unlock --force: %q", owners)
	}
	if code := holder.exit(); code != exitLeaseLost {
		t.Errorf("removed holder: exit %d, want %d; stderr %q", code, exitLeaseLost, holder.stderr)
	}
}

// With 3 of 5 masters killed under a running dlock run, its lease is lost
// (exit 76), and nothing is left held on the 2 that remain; a run waiting
// for the lock then exits 69 when its --wait runs out (the quorum cannot
// grant: not a lock held elsewhere), and a new run fails at once with a
// clear error (69), COMMAND not run, nothing held; status and unlock say
// the same (69).
func TestRunQuorumMajorityDown(t *testing.T) {
	t.Parallel()
	servers, urls := quorumMasters(t, 5)
	holder := startQuorum(t, urls, "run", "--ttl", "2s", "--kill-grace", "300ms", "down", "--", "sh", "-c", `echo "$DLOCK_TOKEN $DLOCK_FENCE"; exec sleep 30`)
	token, _ := holderOf(t, holder)
	// A waiter whose --wait runs out after the masters went down.
	waiter := startQuorum(t, urls, "run", "--wait", "6s", "down", "--", "echo", "ran")
	for _, s := range servers {
		waitSubscribed(t, s.Client(t), "dlock:{down}", 1)
	}
	// Two masters that hold the lock live on: they must not keep it.
	var live, dead []*redistest.Server
	var deadURLs []string
	for i, o := range ownerOn(t, servers, "down") {
		if o == token && len(live) < 2 {
			live = append(live, servers[i])
		} else {
			dead, deadURLs = append(dead, servers[i]), append(deadURLs, urls[i])
		}
	}
	for _, s := range dead {
		s.Kill()
	}
	if code := holder.exit(); code != exitLeaseLost {
		t.Errorf("holder: exit %d, want %d; stderr %q", code, exitLeaseLost, holder.stderr)
	}
	// (The waiter's attempts, given back at once, may hold it for a moment.)
	if owners := ownerOn(t, live, "down"); count(owners, token) != 0 {
		t.Errorf("the holder's token %s left on the live masters after its lease was lost: %q", token, owners)
	}
	// Not "held elsewhere": the quorum cannot grant it.
	if code := waiter.exit(); code != exitUnavailable || waiter.stdout.String() != "" || !strings.Contains(waiter.stderr.String(), "2 of 5 masters answer and vote, and a lock needs 3") {
		t.Errorf("waiter: exit %d, stdout %q, stderr %q; want %d, COMMAND not run, the quorum unavailable", code, waiter.stdout, waiter.stderr, exitUnavailable)
	}
	if owners := ownerOn(t, live, "down"); count(owners, "") != 2 {
		t.Errorf("owners left on the live masters after the waiter's attempts: %q", owners)
	}

	code, out, errOut := runQuorum(t, urls, "run", "down", "--", "echo", "ran")
	if code != exitUnavailable || out != "" {
		t.Errorf("run with 3 of 5 masters down: exit %d, stdout %q; want %d and COMMAND not run (stderr %q)", code, out, exitUnavailable, errOut)
	}
	oneLine(t, "majority down", errOut)
	for _, want := range append([]string{"only 2 of the quorum's 5 masters answer", "majority (3)"}, deadURLs...) {
		if !strings.Contains(errOut, want) {
			t.Errorf("run's error lacks %q: %q", want, errOut)
		}
	}
	if owners := ownerOn(t, live, "down"); count(owners, "") != 2 {
		t.Errorf("owners left on the live masters after the failed run: %q", owners)
	}

	q := quorumStatusJSON(t, urls, exitUnavailable, "down")
	if q.Answered != 2 || q.HeldOn != 0 || len(q.PerMaster) != 5 {
		t.Errorf("status with 3 of 5 masters down: %+v", q)
	}
	for i, v := range q.PerMaster {
		if down := slices.Contains(deadURLs, urls[i]); down != (v.Error != "") || down == (v.Lock != nil) {
			t.Errorf("status with 3 of 5 masters down, master %d (down %v): %+v", i, down, v)
		}
	}
	if code, _, errOut := runQuorum(t, urls, "unlock", "--force", "down"); code != exitUnavailable || !strings.Contains(errOut, "only 2 of the quorum's 5 masters") {
		t.Errorf("unlock with 3 of 5 masters down: exit %d, stderr %q; want %d", code, errOut, exitUnavailable)
	}
}

// dlock list on a quorum lists each name found on any master with how
// many hold it; the masters' epoch keys (dlock:epoch) are no locks and
// never listed, on a quorum or on one of its masters alone.
func TestListQuorumWithoutEpochKey(t *testing.T) {
	t.Parallel()
	servers, urls := quorumMasters(t, 5)
	holder := startQuorum(t, urls, "run", "held", "--", "sh", "-c", `echo "$DLOCK_TOKEN $DLOCK_FENCE"; exec sleep 30`)
	token, _ := holderOf(t, holder)
	// What a failed acquire leaves on one master until its TTL.
	servers[0].Do(t, "hset", "dlock:{part}", "o", "leftover-token", "f", "7")
	servers[0].Do(t, "pexpire", "dlock:{part}", "60000")

	code, out, errOut := runQuorum(t, urls, "list", "--json")
	if code != 0 {
		t.Fatalf("list: exit %d; stderr %q", code, errOut)
	}
	var infos []quorumInfo
	if err := json.Unmarshal([]byte(out), &infos); err != nil {
		t.Fatalf("list --json does not parse: %v\n%s", err, out)
	}
	if len(infos) != 2 {
		t.Fatalf("list: %d locks, want held and part: %+v", len(infos), infos)
	}
	if h := infos[0]; h.Name != "held" || h.State != "held" || h.Token != token || h.HeldOn < 3 || h.Masters != 5 {
		t.Errorf("list's held: %+v", h)
	}
	if p := infos[1]; p.Name != "part" || p.State != "partial" || p.Token != "leftover-token" || p.HeldOn != 1 || p.Fence != 7 {
		t.Errorf("list's part: %+v", p)
	}
	code, out, _ = runQuorum(t, urls, "list")
	if code != 0 || !lineWith(out, "held", "held", "/5", token) || !lineWith(out, "part", "partial", "1/5") || strings.Contains(out, "epoch") {
		t.Errorf("list (text): exit %d\n%s", code, out)
	}
	// A master alone, as a single server: it has the epoch key too.
	one := servers[slices.Index(ownerOn(t, servers, "held"), token)]
	code, out, _ = runDlock(t, one.Addr(), "list", "--json")
	if code != 0 || strings.Contains(out, "epoch") || !strings.Contains(out, `"name": "held"`) {
		t.Errorf("list on one master: exit %d\n%s", code, out)
	}
}

// Quorum mode's usage errors, each found before any lock is touched: two
// servers, the same server twice, a Cluster among the masters, flags that
// quorum mode cannot honour, and quorum flags without a quorum.
func TestQuorumUsageErrors(t *testing.T) {
	t.Parallel()
	a, b, c := "redis://127.0.0.1:1", "redis://127.0.0.1:2", "redis://127.0.0.1:3"
	three := func(cmd string) []string { return []string{cmd, "--redis", a, "--redis", b, "--redis", c} }
	for _, tc := range []struct {
		env  string // DLOCK_REDIS_URL
		args []string
		want string // in the message
	}{
		{"", []string{"run", "--redis", a, "--redis", b, "n", "--", "true"}, "at least 3"},
		{a + "," + b, []string{"status", "n"}, "at least 3"},
		{a + "," + b, []string{"list"}, "at least 3"},
		{a + "," + b, []string{"unlock", "--force", "n"}, "at least 3"},
		{a + "," + b + "," + a, []string{"status", "n"}, "same server"},
		{"", []string{"run", "--redis", a + "," + b, "--redis", "redis://localhost:9/1,redis://localhost:9/2", "n", "--", "true"}, "same server"},
		{"", append(three("list"), "--redis", "redis+cluster://127.0.0.1:4"), "Cluster"},
		{"", []string{"status", "--redis", "redis://127.0.0.1:1,127.0.0.1:2", "n"}, "whole URL"},
		{"", append(three("run"), "--replica-ack", "1", "n", "--", "true"), "--replica-ack"},
		{"", append(three("run"), "--fair", "n", "--", "true"), "--fair"},
		{"", append(three("run"), "--ttl", "1m", "n", "--", "true"), "--restart-delay"},
		{"", append(three("run"), "--node-timeout", "20s", "n", "--", "true"), "--node-timeout"},
		{"", []string{"run", "--redis", a, "--node-timeout", "10ms", "n", "--", "true"}, "quorum mode only"},
		{"", []string{"run", "--redis", a, "--restart-delay", "1m", "n", "--", "true"}, "quorum mode only"},
		{"", []string{"status", "--restart-delay", "1m", "n"}, "quorum mode only"},
	} {
		p := startDlockEnv(t, []string{"DLOCK_REDIS_URL=" + tc.env, "REDIS_URL="}, tc.args...)
		code, errOut := p.exit(), p.stderr.String()
		if code != exitUsage || !strings.Contains(errOut, tc.want) {
			t.Errorf("DLOCK_REDIS_URL=%q dlock %q: exit %d, stderr %q; want %d naming %q", tc.env, tc.args, code, errOut, exitUsage, tc.want)
		}
		oneLine(t, strings.Join(tc.args, " "), errOut)
	}
}
