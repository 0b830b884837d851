package main

import (
	"encoding/json"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/dlock-go/dlock/internal/redistest"
)

// aclPassword is the password of the ACL tests' user.
const aclPassword = "acl-S3cret"

// docACL returns the ACL SETUSER line of docs/PRODUCTION.md, with the
// user's password, as command arguments: the tests create exactly the user
// the documentation tells operators to create.
func docACL(t *testing.T) []any {
	t.Helper()
	b, err := os.ReadFile("../../docs/PRODUCTION.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "ACL SETUSER dlock on >CHANGE-ME "); ok {
			args := []any{"ACL", "SETUSER", "dlock", "on", ">" + aclPassword}
			for _, f := range strings.Fields(rest) {
				args = append(args, f)
			}
			return args
		}
	}
	t.Fatal("docs/PRODUCTION.md has no line beginning `ACL SETUSER dlock on >CHANGE-ME`")
	return nil
}

// setACL makes the user on s from acl, with an empty ACL LOG.
func setACL(t *testing.T, s *redistest.Server, acl []any) {
	t.Helper()
	s.Do(t, acl...)
	s.Do(t, "ACL", "LOG", "RESET")
}

// userURL is s's URL as the ACL tests' user.
func userURL(s *redistest.Server) string {
	return "redis://dlock:" + aclPassword + "@" + s.Addr()
}

// The CLI's commands work as the user docs/PRODUCTION.md's ACL line makes,
// on one server and in quorum mode, and the servers refuse it nothing.
func TestCLIAsLeastPrivilegedUser(t *testing.T) {
	t.Parallel()
	acl := docACL(t)
	s := redistest.Start(t)
	setACL(t, s, acl)
	env := []string{"DLOCK_REDIS_URL=" + userURL(s), "REDIS_URL="}
	holder := startDlockEnv(t, env, "run", "acl-cli", "--", "sh", "-c", "echo ready; exec sleep 310")
	if l := holder.line(); l != "ready" {
		t.Fatalf("holder: %q", l)
	}
	fair := startDlockEnv(t, env, "run", "--fair", "acl-cli-fair", "--", "sh", "-c", "echo ready; exec sleep 310")
	if l := fair.line(); l != "ready" {
		t.Fatalf("fair holder: %q", l)
	}
	waiter := startDlockEnv(t, env, "run", "--wait", "25s", "acl-cli", "--", "echo", "got it")
	fairWaiter := startDlockEnv(t, env, "run", "--fair", "--wait", "25s", "acl-cli-fair", "--", "echo", "got it")
	waitSubscribed(t, s.Client(t), "dlock:{acl-cli}", 1)
	waitSubscribed(t, s.Client(t), "dlock:{acl-cli-fair}", 1)
	code, out, errOut := dlockTLS(t, env, "status", "--json", "acl-cli")
	var st lockInfo
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil || st.State != "held" {
		t.Fatalf("status: exit %d, %v, %+v; stderr %q", code, err, st, errOut)
	}
	code, out, errOut = dlockTLS(t, env, "list", "--json", "acl-*")
	var infos []lockInfo
	if err := json.Unmarshal([]byte(out), &infos); code != 0 || err != nil || len(infos) != 2 {
		t.Fatalf("list: exit %d, %v, %s; stderr %q", code, err, out, errOut)
	}
	for _, name := range []string{"acl-cli", "acl-cli-fair"} {
		if code, out, errOut := dlockTLS(t, env, "unlock", "--force", name); code != 0 {
			t.Fatalf("unlock --force %s: exit %d, %q; stderr %q", name, code, out, errOut)
		}
	}
	for _, w := range []*dlockProc{waiter, fairWaiter} {
		if l := w.line(); l != "got it" {
			t.Fatalf("waiter: %q; stderr %s", l, w.stderr)
		}
		if code := w.exit(); code != 0 {
			t.Errorf("waiter: exit %d; stderr %s", code, w.stderr)
		}
	}

	masters := redistest.Masters(t, 3)
	var urls []string
	for _, m := range masters {
		setACL(t, m, acl)
		urls = append(urls, userURL(m))
	}
	qenv := []string{"DLOCK_REDIS_URL=" + strings.Join(urls, ","), "REDIS_URL="}
	q := startDlockEnv(t, qenv, "run", "--restart-delay", "0", "acl-quorum", "--", "sh", "-c", "echo ready; exec sleep 310")
	if l := q.line(); l != "ready" {
		t.Fatalf("quorum holder: %q", l)
	}
	if code, out, errOut := dlockTLS(t, qenv, "status", "--restart-delay", "0", "acl-quorum"); code != 0 {
		t.Errorf("quorum status: exit %d, %q; stderr %q", code, out, errOut)
	}
	if code, out, errOut := dlockTLS(t, qenv, "unlock", "--force", "acl-quorum"); code != 0 {
		t.Errorf("quorum unlock --force: exit %d, %q; stderr %q", code, out, errOut)
	}
	for _, srv := range append(masters, s) {
		entries, _ := srv.Do(t, "ACL", "LOG").([]any)
		for _, e := range entries {
			t.Errorf("%s: ACL LOG: %v", srv.Addr(), e)
		}
	}
}

// A user that lacks a piece of the documented ACL gets, from each command,
// an error that says what the server refused (and for run, which lock),
// and COMMAND does not run.
func TestCLIMissingPermission(t *testing.T) {
	t.Parallel()
	acl := docACL(t)
	without := func(rule string) []any {
		i := slices.Index(acl, any(rule))
		if i < 0 {
			t.Fatalf("the documented ACL has no rule %q", rule)
		}
		return slices.Delete(slices.Clone(acl), i, i+1)
	}
	for _, c := range []struct {
		name string
		acl  []any
		args []string
		want []string
	}{
		{"run without channels", without("&dlock:*"), []string{"run", "acl-miss", "--", "echo", "ran"}, []string{`lock "acl-miss"`, "NOPERM", "&dlock:*"}},
		{"run --wait forever without channels", without("&dlock:*"), []string{"run", "--wait", "forever", "acl-miss", "--", "echo", "ran"}, []string{`lock "acl-miss"`, "NOPERM", "&dlock:*"}},
		{"run without EVALSHA", without("+evalsha"), []string{"run", "--wait", "forever", "acl-miss", "--", "echo", "ran"}, []string{`lock "acl-miss"`, "NOPERM", "'evalsha'"}},
		{"status without TYPE", without("+type"), []string{"status", "acl-miss"}, []string{"NOPERM", "'type'"}},
		{"list without SCAN", without("+scan"), []string{"list"}, []string{"NOPERM", "'scan'"}},
		{"unlock without EVALSHA", without("+evalsha"), []string{"unlock", "--force", "acl-miss"}, []string{"NOPERM", "'evalsha'"}},
		{"keys outside the prefix", append(without("~dlock:*"), "~app:*"), []string{"status", "acl-miss"}, []string{"NOPERM", "keys"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			s := redistest.Start(t)
			setACL(t, s, c.acl)
			s.Do(t, "HSET", "dlock:{acl-miss}", "f", "1") // a lock to look at, free
			code, out, errOut := dlockTLS(t, []string{"DLOCK_REDIS_URL=" + userURL(s), "REDIS_URL="}, c.args...)
			if code == 0 || strings.Contains(out, "ran") {
				t.Errorf("%v: exit %d, stdout %q: want a failure, and COMMAND not run", c.args, code, out)
			}
			for _, w := range c.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("%v: stderr %q does not say %q", c.args, errOut, w)
				}
			}
			oneLine(t, c.name, errOut)
		})
	}
}
