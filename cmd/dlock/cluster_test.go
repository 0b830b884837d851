package main

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/wire"
)

// On a Redis Cluster every key of a lock name shares one slot, whatever
// the name, so that the scripts that touch several of them (a --fair
// release hands over through the lock, its line and its waiters) never
// fail with CROSSSLOT. Names and prefixes that would give the keys an
// empty hash tag (a name beginning with '}', a prefix holding "{}") are
// refused instead.
func TestClusterEveryKeyOfANameInOneSlot(t *testing.T) {
	t.Parallel()
	nodes := redistest.Cluster(t, 3)
	rdb := redistest.ClusterClient(t, nodes)
	url := "redis+cluster://" + nodes[0].Addr() + "?addr=" + nodes[1].Addr() + "&addr=" + nodes[2].Addr()
	env := []string{"DLOCK_REDIS_URL=" + url, "REDIS_URL="}

	for _, name := range []string{"plain", "a}b", "{x}", "x{y}z", "a}:q", "{", "x}"} {
		keys := wire.KeysOf(wire.DefaultPrefix, name)
		holder := startDlockEnv(t, env, "run", "--fair", name, "--", "sh", "-c", `echo ready; exec sleep 311`)
		holder.line()
		waiter := startDlockEnv(t, env, "run", "--fair", "--wait", "20s", name, "--", "echo", "handed over")
		deadline := time.Now().Add(procTimeout)
		for rdb.LLen(t.Context(), keys.Line).Val() != 1 {
			if time.Now().After(deadline) {
				t.Fatalf("%q: the waiter took no place in line within %v; stderr %q", name, procTimeout, waiter.stderr)
			}
			time.Sleep(pollEvery)
		}
		holder.signal(syscall.SIGTERM)
		holder.killedBy(syscall.SIGTERM)
		if strings.Contains(holder.stderr.String(), "CROSSSLOT") {
			t.Errorf("%q: the release failed: %s", name, holder.stderr)
		}
		if l := waiter.line(); l != "handed over" {
			t.Errorf("%q: waiter printed %q", name, l)
		}
		if code := waiter.exit(); code != 0 {
			t.Errorf("%q: waiter exit %d; stderr %q", name, code, waiter.stderr)
		}
		if code, out, errOut := runDlock(t, "", append([]string{"status", "--redis", url}, name)...); code != 0 || !strings.Contains(out, "free") {
			t.Errorf("%q: status exit %d: %s %s", name, code, out, errOut)
		}
	}

	for _, args := range [][]string{
		{"run", "}x", "--", "true"},
		{"status", "}x"},
		{"unlock", "--force", "}x"},
		{"run", "--prefix", "p{}", "x", "--", "true"},
		{"status", "--prefix", "{}", "x"},
		{"unlock", "--force", "--prefix", "a{}b:", "x"},
		{"list", "--prefix", "{}"},
	} {
		code, _, errOut := runDlock(t, "", append([]string{args[0], "--redis", url}, args[1:]...)...)
		if code != exitUsage {
			t.Errorf("dlock %q: exit %d, want %d; stderr %q", args, code, exitUsage, errOut)
		}
	}
}
