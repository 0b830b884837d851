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
		{"market", "--redis", "http://example"},
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
	if code, out, _ := runCLI(t, "market", "-h"); code != exitOK || !strings.Contains(out, "-duration") {
		t.Errorf("dlock market -h: exit %d, output %q", code, out)
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
	code, stdout, stderr := runCLI(t, "market", "--duration", "200ms", "--loads", "1/1", "--variants", "coarse,lua", "--chart", chart)
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
}
