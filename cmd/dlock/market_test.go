package main

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/market"
)

// runCLI runs dlock with args and returns the exit code, stdout and stderr.
func runCLI(t *testing.T, args ...string) (int, string, string) {
	t.Helper()
	var stdout, stderr bytes.Buffer
	code := dispatch(context.Background(), args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

func clearRedisEnv(t *testing.T) {
	t.Setenv("DLOCK_REDIS_URL", "")
	t.Setenv("REDIS_URL", "")
}

func TestUsageErrors(t *testing.T) {
	clearRedisEnv(t)
	for _, args := range [][]string{
		{},
		{"frobnicate"},
		{"market", "--bogus"},
		{"market", "extra"},
		{"market", "--loads", "5"},
		{"market", "--loads", "0/1"},
		{"market", "--variants", "optimistic"},
		{"market", "--variants", ""},
		{"market", "--pick", "dearest"},
		{"market", "--duration", "-1s"},
		{"market", "--rounds", "0"},
		{"market", "--rounds", "101"},
		{"market", "--redis", "http://example"},
		{"market", "--redis", "redis://127.0.0.1:1,redis://127.0.0.1:2,redis://127.0.0.1:3"},
	} {
		code, _, stderr := runCLI(t, args...)
		if code != exitUsage {
			t.Errorf("dlock %q: exit %d, want %d", args, code, exitUsage)
		}
		if lines := strings.Count(strings.TrimSpace(stderr), "\n") + 1; len(args) > 0 && lines != 1 {
			t.Errorf("dlock %q: stderr has %d lines, want one:\n%s", args, lines, stderr)
		}
	}
	if code, out, _ := runCLI(t, "help"); code != exitOK || !strings.Contains(out, "market") {
		t.Errorf("dlock help: exit %d, output %q", code, out)
	}
	code, out, _ := runCLI(t, "market", "-h")
	for _, want := range []string{"-duration", "-full", "Examples:\n\n  dlock market ", "Exit codes"} {
		if code != exitOK || !strings.Contains(out, want) {
			t.Errorf("dlock market -h: exit %d, output lacks %q:\n%s", code, want, out)
		}
	}
}

// TestMarketDemoFlags: without flags market is the short demo (one load, the
// rows that tell the story, 3 s each, the short table); --full is the
// book's whole experiment with every column; explicit flags win over both.
func TestMarketDemoFlags(t *testing.T) {
	clearRedisEnv(t)
	parse := func(args ...string) marketFlags {
		t.Helper()
		f, help, err := parseMarketFlags(args, io.Discard)
		if err != nil || help {
			t.Fatalf("parse %q: %v, help %v", args, err, help)
		}
		return f
	}
	f := parse()
	if len(f.loads) != 1 || f.loads[0] != (market.Load{Listers: 5, Buyers: 5}) || f.duration != 3*time.Second || f.wide ||
		strings.Join(f.variants, ",") != "watch,coarse,fine,dlock-coarse,dlock-fine,lua" {
		t.Errorf("demo: loads %v, duration %v, wide %v, variants %v", f.loads, f.duration, f.wide, f.variants)
	}
	f = parse("--full")
	if len(f.loads) != 3 || f.duration != time.Minute || !f.wide || len(f.variants) != len(market.Variants()) {
		t.Errorf("--full: loads %v, duration %v, wide %v, variants %v", f.loads, f.duration, f.wide, f.variants)
	}
	f = parse("--full", "--duration", "5s", "--loads", "2/2", "--variants", "lua")
	if len(f.loads) != 1 || f.duration != 5*time.Second || len(f.variants) != 1 {
		t.Errorf("--full with flags: loads %v, duration %v, variants %v", f.loads, f.duration, f.variants)
	}
}

// TestMarketDemo runs the demo's rows, shortened, on a private
// redis-server: every row runs (the dlock rows included), the table fits
// 100 columns, explains its columns and marks its claims.
func TestMarketDemo(t *testing.T) {
	clearRedisEnv(t)
	code, stdout, stderr := runCLI(t, "market", "--duration", "300ms")
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	t.Logf("stdout:\n%s\nstderr:\n%s", stdout, stderr)
	if strings.Contains(stdout, "skipped") || strings.Contains(stderr, "skipped") {
		t.Errorf("a row was skipped")
	}
	for _, l := range strings.Split(stdout, "\n") {
		if n := utf8.RuneCountInString(l); n > 100 {
			t.Errorf("line of %d columns: %q", n, l)
		}
	}
	for _, want := range []string{"5 sellers and 5 buyers, 300ms per row", "dlock-fine *", "polls  ", "What the run shows", "  ✓ no money or item"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("stdout lacks %q", want)
		}
	}
	if !strings.Contains(stderr, "6 rows of 300ms each") {
		t.Errorf("stderr does not say how long the run takes")
	}
}

func TestMarketUnavailable(t *testing.T) {
	clearRedisEnv(t)
	code, _, stderr := runCLI(t, "market", "--redis", "redis://127.0.0.1:1", "--duration", "100ms")
	if code != exitUnavailable {
		t.Fatalf("exit %d, want %d; stderr: %s", code, exitUnavailable, stderr)
	}
}

func TestMarketOnGivenServer(t *testing.T) {
	clearRedisEnv(t)
	srv := redistest.Start(t)
	srv.Do(t, "SET", "precious", "data")
	url := "redis://" + srv.Addr()
	args := []string{"market", "--duration", "200ms", "--loads", "1/1,2/2", "--variants", "watch,fine,lua", "--json", "--quiet"}

	code, _, stderr := runCLI(t, append(args, "--redis", url)...)
	if code != exitUsage || !strings.Contains(stderr, "--flush") {
		t.Fatalf("non-empty database: exit %d, stderr %q; want %d and a hint about --flush", code, stderr, exitUsage)
	}

	t.Setenv("DLOCK_REDIS_URL", url) // the environment is read too
	code, stdout, stderr := runCLI(t, append(args, "--flush")...)
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	var rs []market.Result
	if err := json.Unmarshal([]byte(stdout), &rs); err != nil {
		t.Fatalf("--json output does not parse: %v\n%s", err, stdout)
	}
	if len(rs) != 6 {
		t.Fatalf("got %d results, want 6", len(rs))
	}
	if stderr != "" {
		t.Errorf("--quiet still wrote to stderr:\n%s", stderr)
	}
}

func TestMarketEmbeddedRedisServer(t *testing.T) {
	clearRedisEnv(t)
	chart := filepath.Join(t.TempDir(), "market.svg")
	code, stdout, stderr := runCLI(t, "market", "--duration", "200ms", "--loads", "1/1", "--variants", "coarse,lua", "--wide", "--chart", chart)
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	if !strings.Contains(stderr, "private redis-server") {
		t.Errorf("stderr does not say which server was used:\n%s", stderr)
	}
	if !strings.Contains(stdout, "book wait") || !strings.Contains(stdout, "coarse") {
		t.Errorf("table missing:\n%s", stdout)
	}
	f, err := os.Open(chart)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	dec := xml.NewDecoder(f)
	for {
		if _, err := dec.Token(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("chart is not XML: %v", err)
		}
	}
}

func TestMarketEmbeddedMiniredis(t *testing.T) {
	clearRedisEnv(t)
	t.Setenv("PATH", t.TempDir()) // no redis-server to be found
	code, stdout, stderr := runCLI(t, "market", "--duration", "200ms", "--loads", "1/1")
	if code != exitOK {
		t.Fatalf("exit %d; stderr:\n%s", code, stderr)
	}
	if !strings.Contains(stderr, "in-process miniredis") || !strings.Contains(stderr, "skipping the watch row") {
		t.Errorf("stderr does not explain the fallback:\n%s", stderr)
	}
	if strings.Contains(stdout, "watch") || !strings.Contains(stdout, "lua") {
		t.Errorf("want the lua row and no watch row:\n%s", stdout)
	}
	// dlock runs on miniredis (plain pub/sub): its rows are run, not skipped.
	if strings.Contains(stdout+stderr, "skipped") || !strings.Contains(stderr, "dlock-fine       listed") {
		t.Errorf("want the dlock rows run on miniredis:\nstdout:\n%s\nstderr:\n%s", stdout, stderr)
	}
}
