package redistest

import (
	_ "embed"
	"encoding/binary"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// clockShiftSource is the LD_PRELOAD shim that moves a server's wall clock
// (see the comment at its top).
//
//go:embed clockshift/clockshift.c
var clockShiftSource []byte

// buildClockShift compiles the shim into a temporary directory and returns
// the shared object's path. Without a C compiler the test is skipped, with
// a message saying what to install; any other failure fails it.
func buildClockShift(t testing.TB) string {
	t.Helper()
	if runtime.GOOS != "linux" {
		t.Skipf("redistest: ClockShift needs Linux (an LD_PRELOAD shim for glibc); this is %s", runtime.GOOS)
	}
	cc := findCC()
	if cc == "" {
		t.Skip("redistest: ClockShift builds an LD_PRELOAD shim with a C compiler, and none is installed " +
			"($CC, cc, gcc, clang): install gcc and libc6-dev with apt-get (make test does)")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "clockshift.c")
	so := filepath.Join(dir, "clockshift.so")
	if err := os.WriteFile(src, clockShiftSource, 0o644); err != nil {
		t.Fatalf("redistest: %v", err)
	}
	out, err := exec.Command(cc, "-shared", "-fPIC", "-O2", "-Wall", "-o", so, src).CombinedOutput()
	if err != nil {
		t.Fatalf("redistest: building the clock-shift shim with %s: %v (is libc6-dev installed?)\n%s", cc, err, out)
	}
	return so
}

// findCC returns the C compiler to use: $CC, then cc, gcc, clang; "" if
// there is none.
func findCC() string {
	names := []string{"cc", "gcc", "clang"}
	if cc := os.Getenv("CC"); cc != "" {
		names = append([]string{cc}, names...)
	}
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p
		}
	}
	return ""
}

// clockShiftEnv makes the offset file (offset 0) in dir and returns the
// environment that starts a server with the shim so and that file.
func clockShiftEnv(so, dir string) (file string, env []string, err error) {
	file = filepath.Join(dir, "clockshift")
	if err := os.WriteFile(file, make([]byte, 8), 0o644); err != nil {
		return "", nil, err
	}
	return file, []string{"LD_PRELOAD=" + so, "CLOCKSHIFT_FILE=" + file}, nil
}

// SetClockOffset sets the server's wall clock to the real time plus d: what
// Redis reads for key expiry, TIME (also inside scripts) and its log. The
// server must have been started with Options{ClockShift: true}; the change
// takes effect at its next reading of the clock, while it runs, and lasts
// across Restart. Its monotonic clock is left alone, as a real clock step
// leaves it. Offsets are absolute, not added up: SetClockOffset(t, 0) puts
// the clock back.
func (s *Server) SetClockOffset(t testing.TB, d time.Duration) {
	t.Helper()
	if s.clockFile == "" {
		t.Fatal("redistest: SetClockOffset on a server started without Options{ClockShift: true}")
	}
	f, err := os.OpenFile(s.clockFile, os.O_WRONLY, 0)
	if err != nil {
		t.Fatalf("redistest: %v", err)
	}
	defer f.Close()
	// One write of the 8 bytes, in place: the server maps this file.
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(d.Nanoseconds()))
	if _, err := f.WriteAt(b[:], 0); err != nil {
		t.Fatalf("redistest: %v", err)
	}
}
