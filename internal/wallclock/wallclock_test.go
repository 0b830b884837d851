package wallclock

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/childproc"
)

const childEnv = "WALLCLOCK_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		os.Exit(child())
	}
	os.Exit(m.Run())
}

// child answers each stdin line with its pid, its wall clock, the wall
// time since it started (monotonic reading stripped) and the monotonic
// time since it started.
func child() int {
	start := time.Now()
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		now := time.Now()
		fmt.Printf("%d %d %d %d %v\n", os.Getpid(), now.UnixNano(), now.Round(0).Sub(start.Round(0)), now.Sub(start), Traced())
	}
	return 0
}

type reading struct {
	pid       int
	wall      time.Time
	wallSince time.Duration // by the wall clock
	monoSince time.Duration // by the monotonic clock
	traced    bool
}

// The child's wall clock moves by the offset, both ways, while it runs; its
// monotonic clock does not; killing the tracer kills the child.
func TestOffsetMovesTheChildsWallClock(t *testing.T) {
	if err := Supported(); err != nil {
		t.Skip(err)
	}
	cmd, err := Command(os.Args[0], "-test.run=^$")
	if err != nil {
		t.Fatal(err)
	}
	stdin, out := childproc.Start(t, cmd, cmd.Cmd, childEnv+"=1")
	read := func() reading {
		t.Helper()
		if _, err := fmt.Fprintln(stdin, "now"); err != nil {
			t.Fatal(err)
		}
		if !out.Scan() {
			t.Fatalf("child gone: %v", out.Err())
		}
		f := strings.Fields(out.Text())
		if len(f) != 5 {
			t.Fatalf("child said %q", out.Text())
		}
		var n [4]int64
		for i := range n {
			if n[i], err = strconv.ParseInt(f[i], 10, 64); err != nil {
				t.Fatalf("child said %q: %v", out.Text(), err)
			}
		}
		return reading{int(n[0]), time.Unix(0, n[1]), time.Duration(n[2]), time.Duration(n[3]), f[4] == "true"}
	}
	// The bounds are far from both the offset and zero: what is checked is
	// that the clock moved by the hour, not how fast the child answers.
	near := func(got, want time.Duration) bool { return got > want-time.Minute && got < want+time.Minute }

	r := read()
	if !r.traced {
		t.Fatal("the child does not know it is traced")
	}
	if d := time.Until(r.wall); !near(d, 0) {
		t.Fatalf("child's wall clock %v from ours before any offset", d)
	}
	for _, off := range []time.Duration{time.Hour, -time.Hour, 0} {
		if err := cmd.SetOffset(off); err != nil {
			t.Fatal(err)
		}
		r = read()
		if d := time.Until(r.wall); !near(d, off) {
			t.Fatalf("offset %v: child's wall clock %v from ours", off, d)
		}
		if !near(r.wallSince, off) {
			t.Fatalf("offset %v: child's wall time since it started %v", off, r.wallSince)
		}
		if !near(r.monoSince, 0) || r.monoSince < 0 {
			t.Fatalf("offset %v: child's monotonic time since it started %v: the monotonic clock moved", off, r.monoSince)
		}
	}

	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	deadline := time.Now().Add(10 * time.Second)
	for alive(r.pid) {
		if time.Now().After(deadline) {
			t.Fatalf("child %d still alive 10 s after its tracer was killed", r.pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// alive reports whether pid runs: it exists and is not a zombie (one that
// waits for its new parent to reap it).
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces and parentheses.
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || (s[i+2] != 'Z' && s[i+2] != 'X')
}
