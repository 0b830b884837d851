package main

import (
	"os/exec"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/dlock-go/dlock/internal/redistest"
)

// --conflict-exit-code 0 skips silently: nothing on stderr (cron mails what
// a job writes there); --quiet is silent with any code; by default the
// conflict is said.
func TestRunConflictSilence(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	holder := startDlock(t, s.Addr(), "run", "busy", "--", "sh", "-c", `echo ready; exec sleep 30`)
	holder.line()
	for _, tc := range []struct {
		args   []string
		code   int
		silent bool
	}{
		{[]string{}, exitNotObtained, false},
		{[]string{"--conflict-exit-code", "0"}, 0, true},
		{[]string{"--conflict-exit-code", "0", "--wait", "200ms"}, 0, true},
		{[]string{"--quiet"}, exitNotObtained, true},
		{[]string{"--quiet", "--wait", "200ms", "--conflict-exit-code", "3"}, 3, true},
	} {
		args := append(append([]string{"run"}, tc.args...), "busy", "--", "echo", "ran")
		code, out, errOut := runDlock(t, s.Addr(), args...)
		if code != tc.code || out != "" {
			t.Errorf("dlock %q: exit %d, stdout %q; want %d and COMMAND not run", args, code, out, tc.code)
		}
		if tc.silent && errOut != "" {
			t.Errorf("dlock %q: wrote %q; want nothing on stderr", args, errOut)
		}
		if !tc.silent && !strings.Contains(errOut, "held elsewhere") {
			t.Errorf("dlock %q: stderr %q does not say the lock is held elsewhere", args, errOut)
		}
	}
}

// Usage errors say what is expected and what is wrong, once: the flag as
// typed, then the rule it breaks.
func TestFlagErrorsSayWhatIsExpected(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "--ttl", "abc", "x", "--", "true"}, "dlock run: --ttl abc: want a duration such as 10s (units ms, s, m, h) (see dlock run -h)\n"},
		{[]string{"run", "--ttl", "0", "x", "--", "true"}, "dlock run: --ttl 0: must be at least 1ms (see dlock run -h)\n"},
		{[]string{"run", "--ttl", "9000h", "x", "--", "true"}, "dlock run: --ttl 9000h: must be at most 8760h (see dlock run -h)\n"},
		{[]string{"run", "--kill-grace", "-1s", "x", "--", "true"}, "dlock run: --kill-grace -1s: must not be negative (see dlock run -h)\n"},
		{[]string{"run", "--wait", "soon", "x", "--", "true"}, "dlock run: --wait soon: want 0, a duration such as 30s, or forever (see dlock run -h)\n"},
		{[]string{"unlock", "--force", "--idle", "10ms", "x"}, "dlock unlock: --idle 10ms: must be at least 1s (see dlock unlock -h)\n"},
		{[]string{"market", "--duration", "x"}, "dlock market: --duration x: want a duration such as 3s (units ms, s, m, h) (see dlock market -h)\n"},
	} {
		code, _, errOut := runDlock(t, "127.0.0.1:1", tc.args...)
		if code != exitUsage || errOut != tc.want {
			t.Errorf("dlock %q: exit %d, stderr %q; want %d, %q", tc.args, code, errOut, exitUsage, tc.want)
		}
	}
}

// A database the server does not have is a usage error (64) that says so,
// for every command that takes --redis.
func TestNoSuchDatabase(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	url := "redis://" + s.Addr() + "/99"
	for _, args := range [][]string{
		{"run", "--redis", url, "x", "--", "true"},
		{"status", "--redis", url, "x"},
		{"list", "--redis", url},
		{"market", "--redis", url, "--duration", "100ms"},
	} {
		code, _, errOut := runDlock(t, s.Addr(), args...)
		oneLine(t, strings.Join(args, " "), errOut)
		if code != exitUsage || !strings.Contains(errOut, "the server has no database 99") || !strings.Contains(errOut, "this one has 16 (0..15)") {
			t.Errorf("dlock %q: exit %d, stderr %q; want %d and the databases it has", args, code, errOut, exitUsage)
		}
	}
}

// When PING gets no answer in time, the error says what was attempted and
// the likely cause: TLS asked of a server that speaks without it, or a
// server that accepts connections and answers nothing.
func TestTimeoutsExplained(t *testing.T) {
	t.Parallel()
	plain := redistest.Start(t)
	frozen := redistest.Start(t)
	frozen.Pause()
	t.Cleanup(frozen.Resume)
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"status", "--redis", "rediss://" + plain.Addr(), "x"}, []string{"TLS handshake", "use redis:// instead of rediss://"}},
		{[]string{"market", "--redis", "rediss://" + plain.Addr()}, []string{"TLS handshake", "use redis:// instead of rediss://"}},
		{[]string{"run", "--redis", "redis://" + frozen.Addr(), "x", "--", "true"}, []string{"no answer to PING within 5s", "frozen"}},
		{[]string{"list", "--redis", "rediss://" + frozen.Addr()}, []string{"TLS handshake", "frozen"}},
	} {
		t.Run(tc.args[0], func(t *testing.T) {
			t.Parallel()
			code, _, errOut := runDlock(t, plain.Addr(), tc.args...)
			oneLine(t, strings.Join(tc.args, " "), errOut)
			if code != exitUnavailable || strings.Contains(errOut, "context deadline exceeded") {
				t.Errorf("dlock %q: exit %d, stderr %q; want %d and no bare deadline", tc.args, code, errOut, exitUnavailable)
			}
			for _, w := range tc.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("dlock %q: stderr %q lacks %q", tc.args, errOut, w)
				}
			}
		})
	}
}

// A key that is not a dlock mutex is reported in one clause per fact, with
// the Redis type status would show, and no repeated prefix.
func TestForeignKeyMessage(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	s.Do(t, "RPUSH", "dlock:{xl}", "a")
	s.Do(t, "HSET", "dlock:{xh}", "field", "x")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "xl", "--", "true"}, "dlock run: lock \"xl\": Redis key \"dlock:{xl}\" is a list, not a dlock mutex\n"},
		{[]string{"run", "xh", "--", "true"}, "dlock run: lock \"xh\": Redis key \"dlock:{xh}\" is a hash that dlock did not write, not a dlock mutex\n"},
		{[]string{"unlock", "--force", "xl"}, "dlock unlock: lock \"xl\": Redis key \"dlock:{xl}\" is a list, not a dlock mutex; nothing removed (see dlock status xl)\n"},
	} {
		code, _, errOut := runDlock(t, s.Addr(), tc.args...)
		if code != exitFailed || errOut != tc.want {
			t.Errorf("dlock %q: exit %d, stderr\n%q\nwant %d,\n%q", tc.args, code, errOut, exitFailed, tc.want)
		}
	}
}

// dlock --version names the module, and the commit the toolchain recorded
// in the binary.
func TestVersion(t *testing.T) {
	t.Parallel()
	for _, arg := range []string{"--version", "version"} {
		code, out, errOut := runDlock(t, "127.0.0.1:1", arg)
		if code != exitOK || errOut != "" || !strings.HasPrefix(out, "dlock ") || !strings.Contains(out, "(module github.com/dlock-go/dlock)") {
			t.Fatalf("dlock %s: exit %d, stderr %q, stdout %q", arg, code, errOut, out)
		}
		// The commit the binary holds, as go version -m reads it.
		m, err := exec.Command("go", "version", "-m", dlockBinary(t)).Output()
		if err != nil {
			t.Fatal(err)
		}
		rev := "commit unknown"
		for _, l := range strings.Split(string(m), "\n") {
			if r, ok := strings.CutPrefix(strings.TrimSpace(l), "build\tvcs.revision="); ok {
				rev = "commit " + r
			}
		}
		if !strings.Contains(out, "\n"+rev) {
			t.Errorf("dlock %s does not say %q:\n%s", arg, rev, out)
		}
	}
	// The commit line, from what a build in a git clone records.
	var b strings.Builder
	formatVersion(&b, &debug.BuildInfo{
		GoVersion: "go1.26.8",
		Main:      debug.Module{Path: "github.com/dlock-go/dlock", Version: "v1.2.3"},
		Settings: []debug.BuildSetting{
			{Key: "vcs.revision", Value: "0123456789abcdef"},
			{Key: "vcs.time", Value: "2026-11-25T10:00:00Z"},
			{Key: "vcs.modified", Value: "true"},
		},
	})
	if !strings.HasPrefix(b.String(), "dlock v1.2.3 (module github.com/dlock-go/dlock)\ncommit 0123456789abcdef of 2026-11-25T10:00:00Z, with changes not committed\n") {
		t.Errorf("formatVersion:\n%s", b.String())
	}
}
