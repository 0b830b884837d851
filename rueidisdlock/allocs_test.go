package rueidisdlock

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/rueidis"
)

// TestBuildNamesInCapitals: build sends the engine's lower-case command
// names in capitals, so that rueidis need not upper-case them (an
// allocation per call), and leaves the rest of the line as it is.
func TestBuildNamesInCapitals(t *testing.T) {
	s := redistest.Start(t)
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.Addr()}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	sha, key := "0123456789abcdef0123456789abcdef01234567", "dlock:{k}"
	for _, line := range [][]any{
		{"evalsha", &sha, "1", &key, "tok", 10000},
		{"eval", "return 1", "0"},
		{"exists", &key},
		{"wait", 1, int64(100)},
		{"spublish", "ch", ""},
		{"publish", "ch", ""},
		{"script", "load", "return 1"},
	} {
		cmd := build(rc.B(), line)
		got := cmd.Commands()
		if len(got) != len(line) {
			t.Fatalf("%v: built %q", line, got)
		}
		if want := strings.ToUpper(line[0].(string)); got[0] != want {
			t.Errorf("%v: name %q, want %q", line, got[0], want)
		}
		for i := 1; i < len(line); i++ {
			if got[i] != str(line[i]) {
				t.Errorf("%v: element %d %q, want %q", line, i, got[i], str(line[i]))
			}
		}
	}
}

// TestCallAllocs bounds what one call of an acquire-shaped line costs in
// allocations, through Do and through Submit (the path of a call whose ctx
// can end): the reply {1, fence} is rueidis's []RedisMessage (its
// reader's), then the engine's shape: the []any, its box, and the boxed
// fence. Nothing else: the command's strings go through a buffer on the
// stack into rueidis's pooled command, under a name in capitals, and
// Submit's lone call starts a flusher without making a closure.
func TestCallAllocs(t *testing.T) {
	if raceOn {
		t.Skip("-race: the race detector allocates on its own (make test's rueidis pass counts without it)")
	}
	s := redistest.Start(t)
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.Addr()}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	k := newConn(rc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	src := "return {1, 1764000000000000}"
	sha, err := rc.Do(ctx, rc.B().ScriptLoad().Script(src).Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	key := "dlock:{allocs}"
	line := []any{"evalsha", &sha, "1", &key, "tok", "10000"}
	goBg := func(f func()) bool { go f(); return true }
	stop := make(chan struct{}) // an acquire's: the Client's Close (never here)
	for _, tc := range []struct {
		name string
		call func() (any, error)
	}{
		{"Do", func() (any, error) { return k.Do(context.Background(), line, true) }},
		{"Submit", func() (any, error) { return k.Submit(ctx, line, nil, goBg, stop) }},
	} {
		// AllocsPerRun counts every goroutine's allocations: the least of
		// a few runs leaves out what the process did meanwhile (the test
		// server's start), which only adds.
		var cerr error
		allocs := 1e9
		for range 5 {
			allocs = min(allocs, testing.AllocsPerRun(200, func() {
				if _, err := tc.call(); err != nil {
					cerr = err
				}
			}))
		}
		if cerr != nil {
			t.Fatalf("%s: %v", tc.name, cerr)
		}
		if allocs > 4 {
			t.Errorf("%s of an acquire-shaped line: %v allocations, want at most 4", tc.name, allocs)
		}
	}
}
