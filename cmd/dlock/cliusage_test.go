package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/redistest"
)

// dispatchLocal runs a command in this process (for errors found before any
// lock is touched) and returns the exit code, stdout and stderr.
func dispatchLocal(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := dispatch(context.Background(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func TestLockCommandUsageErrors(t *testing.T) {
	t.Setenv("DLOCK_REDIS_URL", "")
	t.Setenv("REDIS_URL", "")
	for _, args := range [][]string{
		{"run"},
		{"run", "name"},
		{"run", "name", "--"},
		{"run", "--bogus", "name", "--", "true"},
		{"run", "--wait", "soon", "name", "--", "true"},
		{"run", "--wait", "-1s", "name", "--", "true"},
		{"run", "--ttl", "0s", "name", "--", "true"},
		{"run", "--kill-grace", "-1s", "name", "--", "true"},
		{"run", "--conflict-exit-code", "256", "name", "--", "true"},
		{"run", "", "--", "true"},
		{"run", strings.Repeat("n", 1025), "--", "true"},
		{"run", "--redis", "http://example", "name", "--", "true"},
		{"run", "--redis", "redis+sentinel://127.0.0.1:26379", "name", "--", "true"},
		{"status"},
		{"status", "a", "b"},
		{"status", "--bogus", "a"},
		{"list", "a", "b"},
		{"list", "--limit", "-1"},
		{"unlock", "name"},
		{"unlock", "--force"},
		{"unlock", "--force", "a", "b"},
		{"unlock", "--force", "--idle", "10ms", "a"},
	} {
		code, _, stderr := dispatchLocal(t, args...)
		if code != exitUsage {
			t.Errorf("dlock %q: exit %d, want %d; stderr %q", args, code, exitUsage, stderr)
		}
		oneLine(t, strings.Join(args, " "), stderr)
	}
}

func TestLockCommandHelp(t *testing.T) {
	for _, c := range []string{"run", "status", "list", "unlock"} {
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
	if _, out, _ := dispatchLocal(t, "run", "-h"); !strings.Contains(out, "76") || !strings.Contains(out, "75") {
		t.Errorf("dlock run -h does not document exit codes 75 and 76")
	}
	_, out, _ := dispatchLocal(t, "help")
	for _, c := range []string{"run", "status", "list", "unlock"} {
		if !strings.Contains(out, "\n  "+c+" ") {
			t.Errorf("dlock help does not list %s:\n%s", c, out)
		}
	}
}

func TestLockCommandsUnavailable(t *testing.T) {
	url := "redis://127.0.0.1:1" // nothing listens on port 1
	for _, args := range [][]string{
		{"run", "--redis", url, "name", "--", "true"},
		{"status", "--redis", url, "name"},
		{"list", "--redis", url},
		{"unlock", "--force", "--redis", url, "name"},
	} {
		t.Run(args[0], func(t *testing.T) {
			t.Parallel() // go-redis retries the dial for a second or two
			code, _, stderr := dispatchLocal(t, args...)
			if code != exitUnavailable {
				t.Errorf("dlock %q: exit %d, want %d; stderr %q", args, code, exitUnavailable, stderr)
			}
			oneLine(t, strings.Join(args, " "), stderr)
		})
	}
}

func TestLockCommandsReadRedisURLFromEnvironment(t *testing.T) {
	t.Setenv("DLOCK_REDIS_URL", "redis://127.0.0.1:1?max_retries=-1")
	t.Setenv("REDIS_URL", "redis://127.0.0.1:2?max_retries=-1")
	code, _, stderr := dispatchLocal(t, "status", "name")
	if code != exitUnavailable || !strings.Contains(stderr, "127.0.0.1:1") {
		t.Errorf("DLOCK_REDIS_URL unreachable: exit %d; stderr %q", code, stderr)
	}
	t.Setenv("DLOCK_REDIS_URL", "")
	code, _, stderr = dispatchLocal(t, "status", "name")
	if code != exitUnavailable || !strings.Contains(stderr, "127.0.0.1:2") {
		t.Errorf("REDIS_URL unreachable: exit %d; stderr %q", code, stderr)
	}
}

func TestResolveRedisURL(t *testing.T) {
	t.Setenv("DLOCK_REDIS_URL", "")
	t.Setenv("REDIS_URL", "")
	if got := resolveRedisURLs(nil); !slices.Equal(got, []string{defaultRedisURL}) {
		t.Errorf("default: %q", got)
	}
	t.Setenv("REDIS_URL", "redis://b")
	t.Setenv("DLOCK_REDIS_URL", "redis://a")
	if got := resolveRedisURLs([]string{"redis://flag"}); !slices.Equal(got, []string{"redis://flag"}) {
		t.Errorf("flag: %q", got)
	}
	if got := resolveRedisURLs(nil); !slices.Equal(got, []string{"redis://a"}) {
		t.Errorf("DLOCK_REDIS_URL: %q", got)
	}
	t.Setenv("DLOCK_REDIS_URL", "redis://a:1, rediss://b:2,unix:///c.sock")
	if got := resolveRedisURLs(nil); !slices.Equal(got, []string{"redis://a:1", "rediss://b:2", "unix:///c.sock"}) {
		t.Errorf("DLOCK_REDIS_URL list: %q", got)
	}
	for _, u := range []string{"redis://h:1/2", "rediss://h:1", "unix:///tmp/r.sock", "redis+cluster://h:1?addr=h:2", "redis+sentinel://h:1?master_name=m"} {
		if _, err := parseRedisTarget(u); err != nil {
			t.Errorf("parseRedisTarget(%q): %v", u, err)
		}
	}
}

// A list splits only where a whole URL follows the comma: a comma in a
// password or a query value stays where it is.
func TestSplitURLs(t *testing.T) {
	for in, want := range map[string][]string{
		"redis://a:1":                          {"redis://a:1"},
		"redis://u:p,w@a:1":                    {"redis://u:p,w@a:1"},
		"redis://a:1?password=x,y":             {"redis://a:1?password=x,y"},
		"redis://a:1,redis://b:2,redis://c:3":  {"redis://a:1", "redis://b:2", "redis://c:3"},
		" redis://a:1 ,  redis+sentinel://s:2": {"redis://a:1", "redis+sentinel://s:2"},
		"redis://u:p,1@a:1,rediss://b:2":       {"redis://u:p,1@a:1", "rediss://b:2"},
	} {
		if got := splitURLs(in); !slices.Equal(got, want) {
			t.Errorf("splitURLs(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestParseInterleaved(t *testing.T) {
	for _, tc := range []struct {
		args []string
		pos  string
		json bool
	}{
		{[]string{"a"}, "a", false},
		{[]string{"a", "--json"}, "a", true},
		{[]string{"--json", "a", "b"}, "a,b", true},
		{[]string{"a", "--", "--json"}, "a,--json", false},
		{[]string{"--", "-x"}, "-x", false},
	} {
		fs := flag.NewFlagSet("test", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		j := fs.Bool("json", false, "")
		pos, err := parseInterleaved(fs, tc.args)
		if err != nil || strings.Join(pos, ",") != tc.pos || *j != tc.json {
			t.Errorf("parseInterleaved(%q) = %q, json %v, %v; want %q, %v", tc.args, pos, *j, err, tc.pos, tc.json)
		}
	}
}

func TestGlobEscape(t *testing.T) {
	if got := globEscape(`a*b?[c]\d:`); got != `a\*b\?\[c\]\\d:` {
		t.Errorf("globEscape = %q", got)
	}
}

// URLs that name no usable server are usage errors (64), not an
// unreachable server (69) nor a silent database 0.
func TestRedisURLUsageErrors(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	for _, u := range []string{
		"redis://127.0.0.1:99999",
		"redis://127.0.0.1:0",
		"redis://" + s.Addr() + "/-1",
		"redis://" + s.Addr() + "/99", // the server has 16 databases
		"redis://" + s.Addr() + "?db=99",
		"redis+cluster://127.0.0.1:1/3",
		"redis+cluster://127.0.0.1:1?skip_verify=true", // no TLS to verify
		"redis+cluster://127.0.0.1:1?addr=127.0.0.1:70000",
		"redis+sentinel://127.0.0.1:99999?master_name=m",
	} {
		for _, c := range [][]string{{"status", "n"}, {"run", "n", "--", "true"}} {
			args := append([]string{c[0], "--redis", u}, c[1:]...)
			code, _, errOut := runDlock(t, s.Addr(), args...)
			if code != exitUsage {
				t.Errorf("dlock %q: exit %d, want %d; stderr %q", args, code, exitUsage, errOut)
			}
			oneLine(t, strings.Join(args, " "), errOut)
		}
	}
}

// skip_verify=true, which go-redis takes in rediss:// and
// rediss+sentinel:// URLs, works in rediss+cluster:// URLs too.
func TestClusterURLSkipVerify(t *testing.T) {
	for u, want := range map[string]bool{
		"rediss+cluster://127.0.0.1:1?skip_verify=true":  true,
		"rediss+cluster://127.0.0.1:1?skip_verify=false": false,
		"rediss+cluster://127.0.0.1:1?addr=127.0.0.1:2":  false,
	} {
		target, err := parseRedisTarget(u)
		if err != nil {
			t.Errorf("parseRedisTarget(%q): %v", u, err)
			continue
		}
		c := target.newClient().(*redis.ClusterClient)
		if got := c.Options().TLSConfig.InsecureSkipVerify; got != want {
			t.Errorf("%s: InsecureSkipVerify %v, want %v", u, got, want)
		}
		_ = c.Close()
	}
}
