package redisproc

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// procStat returns the command name and the fields after it (state, ppid,
// pgrp, ...) of /proc/PID/stat; ok is false if there is no such process.
func procStat(pid int) (name string, f []string, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", nil, false
	}
	s := string(b)
	i, j := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if i < 0 || j < i {
		return "", nil, false
	}
	return s[i+1 : j], strings.Fields(s[j+1:]), true
}

// processes returns the pids of the running (not zombie) processes for
// which match(pid, name, ppid, pgrp) holds.
func processes(match func(pid int, name string, ppid, pgrp int) bool) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		name, f, ok := procStat(pid)
		if !ok || len(f) < 3 || f[0] == "Z" {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		pgrp, _ := strconv.Atoi(f[2])
		if match(pid, name, ppid, pgrp) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// redisChildren returns the redis-server processes this test binary
// started and that still run, but for except.
func redisChildren(t *testing.T, except int) []int {
	t.Helper()
	return processes(func(pid int, name string, ppid, _ int) bool {
		return strings.HasPrefix(name, "redis-server") && ppid == os.Getpid() && pid != except
	})
}

// waitGone waits until no running process matches, at most 5 s.
func waitGone(match func(pid int, name string, ppid, pgrp int) bool) []int {
	deadline := time.Now().Add(5 * time.Second)
	for {
		left := processes(match)
		if len(left) == 0 || time.Now().After(deadline) {
			return left
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestKillKillsForkedChildren: a paused server with a BGSAVE child (slowed
// down to live long) is killed, child and all.
func TestKillKillsForkedChildren(t *testing.T) {
	t.Parallel()
	s := start(t, Config{Args: []string{"--enable-debug-command", "yes"}})
	rdb := client(t, s.Addr())
	ctx := t.Context()
	for _, cmd := range [][]any{
		{"DEBUG", "POPULATE", 100},
		{"CONFIG", "SET", "rdb-key-save-delay", 1000000}, // a second per key
		{"BGSAVE"},
	} {
		if err := rdb.Do(ctx, cmd...).Err(); err != nil {
			t.Fatalf("%v: %v", cmd, err)
		}
	}
	pgid := s.PID()
	inGroup := func(_ int, _ string, _, pgrp int) bool { return pgrp == pgid }
	deadline := time.Now().Add(10 * time.Second)
	for len(processes(inGroup)) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no BGSAVE child in group %d", pgid)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	s.Kill()
	if left := waitGone(inGroup); len(left) > 0 {
		t.Fatalf("processes of group %d left after Kill: %v", pgid, left)
	}
}

// TestRemoveStaleOnlyOurs: of the directories that look like ours, only
// those provably made by makeTempRoot for a process that has ended go.
func TestRemoveStaleOnlyOurs(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	const prefix = "redisproc-stale-"
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	deadPID := dead.Process.Pid
	live := exec.Command("sleep", "60")
	if err := live.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = live.Process.Kill(); _ = live.Wait() })
	livePID := live.Process.Pid
	liveStart, ok := startTime(livePID)
	if !ok {
		t.Fatal("no start time for a live process")
	}

	mk := func(name, owner string) string {
		dir := filepath.Join(tmp, name)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if owner != "" {
			if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(owner), 0o600); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	d, l := strconv.Itoa(deadPID), strconv.Itoa(livePID)
	gone := []string{
		mk(prefix+d+"-dead", d+" 12345\n"),
		mk(prefix+l+"-reused", l+" 1\n"), // the pid now names a later process
	}
	kept := []string{
		mk(prefix+l+"-live", l+" "+liveStart+"\n"),
		mk(prefix+d+"-nofile", ""),
		mk(prefix+d+"-otherpid", l+" 1\n"),
		mk(prefix+strconv.Itoa(os.Getpid())+"-mine", strconv.Itoa(os.Getpid())+" 1\n"),
		mk("other-"+d+"-x", d+" 1\n"),
	}
	target := mk("target", d+" 1\n")
	link := filepath.Join(tmp, prefix+d+"-link")
	if err := os.Symlink(target, link); err != nil {
		t.Fatal(err)
	}
	kept = append(kept, link, target)

	removeStale(prefix)
	for _, dir := range gone {
		if _, err := os.Lstat(dir); err == nil {
			t.Errorf("%s kept, want it removed", filepath.Base(dir))
		}
	}
	for _, dir := range kept {
		if _, err := os.Lstat(dir); err != nil {
			t.Errorf("%s removed, want it kept", filepath.Base(dir))
		}
	}
}

// TestHelperStarter is not a test: TestDiesWithItsStarter runs the test
// binary with REDISPROC_HELPER set to run it as the starter of a server.
func TestHelperStarter(t *testing.T) {
	prefix := os.Getenv("REDISPROC_HELPER")
	if prefix == "" {
		t.Skip("run by TestDiesWithItsStarter")
	}
	// Start from a goroutine whose thread ends with it: a plain
	// exec.Cmd.Start with Pdeathsig there would see the server killed as
	// the thread goes. The main thread is never ended (Go wedges it), so
	// a goroutine that finds itself there keeps it and tries again.
	type started struct {
		s   *Server
		tid int
	}
	done := make(chan started)
	var try func()
	try = func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if syscall.Gettid() == os.Getpid() {
			go try()
			select {}
		}
		s, err := Start(t.Context(), Config{TempPrefix: prefix})
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		done <- started{s, syscall.Gettid()}
	}
	go try()
	st := <-done
	task := "/proc/self/task/" + strconv.Itoa(st.tid)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(task); err != nil {
			break // the thread is gone
		}
		if time.Now().After(deadline) {
			fmt.Println("error: thread", st.tid, "lives on")
			os.Exit(1)
		}
	}
	fmt.Println(st.s.PID(), st.s.Addr(), filepath.Dir(st.s.Dir()))
	select {} // until killed
}

// TestDiesWithItsStarter: a program that started a server and is killed
// with SIGKILL takes the server with it (Pdeathsig, from a thread that
// lives as long as the program), and the next Start with the same prefix
// removes the directory it left.
func TestDiesWithItsStarter(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	const prefix = "redisproc-starter-"
	helper := exec.Command(os.Args[0], "-test.run=^TestHelperStarter$")
	helper.Env = append(os.Environ(), "REDISPROC_HELPER="+prefix)
	out, err := helper.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := helper.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = helper.Process.Kill(); _ = helper.Wait() })
	var pid int
	var addr, dir string
	line, _ := bufio.NewReader(out).ReadString('\n')
	if _, err := fmt.Sscan(line, &pid, &addr, &dir); err != nil {
		t.Fatalf("helper said %q: %v", line, err)
	}

	// The goroutine that started it has ended, its thread with it.
	if got := answeringPID(t, addr); got != pid {
		t.Fatalf("%s answered by pid %d, want %d (the server died with the thread that forked it?)", addr, got, pid)
	}
	if err := helper.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = helper.Wait()
	if left := waitGone(func(_ int, _ string, _, pgrp int) bool { return pgrp == pid }); len(left) > 0 {
		t.Fatalf("server group %d outlived its starter: %v", pid, left)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("the killed starter's directory: %v; it should be there until the next Start", err)
	}

	s, err := Start(t.Context(), Config{TempPrefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := os.Stat(dir); err == nil {
		t.Errorf("the killed starter's directory %s survived the next Start", dir)
	}
	if entries, _ := os.ReadDir(tmp); len(entries) != 1 || !slices.ContainsFunc(entries, func(e os.DirEntry) bool {
		return filepath.Join(tmp, e.Name()) == filepath.Dir(s.Dir())
	}) {
		t.Errorf("TMPDIR holds %v, want only the new server's directory", entries)
	}
}
