package main

import (
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/dlock-go/dlock/internal/redistest"
)

// COMMAND gets the descriptors dlock was given, as flock(1) passes them:
// a caller's fds 3 and 4 (a log opened with exec 3>, make's jobserver) are
// still open in COMMAND, on the same files, and none of COMMAND's
// descriptors is a pipe to the guard.
func TestRunPassesInheritedDescriptors(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	dir := t.TempDir()
	var files []*os.File
	for _, name := range []string{"fd3", "fd4", "fd5"} {
		f, err := os.Create(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = f.Close() })
		files = append(files, f)
	}
	p := startDlockWith(t, func(c *exec.Cmd) {
		c.Env = append(c.Env, "DLOCK_REDIS_URL=redis://"+s.Addr(), "REDIS_URL=")
		c.ExtraFiles = files
	}, "run", "fds", "--", "sh", "-c", `echo three >&3; echo four >&4; echo five >&5; echo $$; exec sleep 316`)
	sh := pids(t, p.line())[0]
	fdDir := "/proc/" + strconv.Itoa(sh) + "/fd"
	ours := fdTargets(t, "/proc/self/fd") // what the test itself inherited passes on too
	for fd, target := range fdTargets(t, fdDir) {
		if fd > 2 && strings.HasPrefix(target, "pipe:") && !slices.Contains(slices.Collect(maps.Values(ours)), target) {
			t.Errorf("COMMAND holds fd %d, a pipe (%s) it was not given", fd, target)
		}
	}
	p.signal(syscall.SIGTERM)
	p.end()
	for _, tc := range []struct{ name, want string }{{"fd3", "three\n"}, {"fd4", "four\n"}, {"fd5", "five\n"}} {
		b, err := os.ReadFile(filepath.Join(dir, tc.name))
		if err != nil {
			t.Fatal(err)
		}
		if string(b) != tc.want {
			t.Errorf("COMMAND's %s: file holds %q, want %q (the descriptor dlock was given was not passed on); stderr %q", tc.name, b, tc.want, p.stderr)
		}
	}
}

// fdTargets maps each open descriptor listed in dir (/proc/PID/fd) to
// what it refers to.
func fdTargets(t *testing.T, dir string) map[int]string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := map[int]string{}
	for _, e := range entries {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if target, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil {
			m[fd] = target
		}
	}
	return m
}
