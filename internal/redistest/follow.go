package redistest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// WaitUntil polls cond every 5ms until it holds; if ctx ends first it
// fails t, saying what it waited for.
func WaitUntil(t testing.TB, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not by the test's deadline", what)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// NamedPrimary reports whether every sentinel of r names s the primary
// and s says (ROLE) that it is one: a test that stops the primary itself
// and waits for the sentinels' own failover polls it.
func (r *Replicated) NamedPrimary(t testing.TB, s *Server) bool {
	t.Helper()
	for _, sen := range r.Sentinels {
		a, _ := sen.Do(t, "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SentinelMaster).([]any)
		if len(a) != 2 || fmt.Sprint(a[1]) != fmt.Sprint(s.Port()) {
			return false
		}
	}
	role, _ := s.Do(t, "ROLE").([]any)
	return len(role) > 0 && fmt.Sprint(role[0]) == "master"
}

// RanCommand reports whether CLIENT LIST (list) shows a connection named
// name that ran a command past its handshake. A client has followed a
// promoted replica once it does: go-redis sends a command on it, rueidis
// asks it for its ROLE and moves to it a moment after the answer. A
// connection still in its handshake does not show that: rueidis could yet
// read the old primary's replies before it moves, as any client that has
// not heard of the switch would (fault 6).
func RanCommand(list, name string) bool {
	for _, line := range strings.Split(list, "\n") {
		if !strings.Contains(line, " name="+name+" ") {
			continue
		}
		_, cmd, _ := strings.Cut(line, " cmd=")
		cmd, _, _ = strings.Cut(cmd, " ")
		switch cmd {
		case "", "NULL", "hello", "auth", "select", "info", "client|setname", "client|setinfo":
		default:
			return true
		}
	}
	return false
}
