package redisproc

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// ownerFile, in a directory that Start made, names the process that made
// it: "PID START\n", START being empty where the platform does not tell
// (see startTime). Only directories holding it are ever removed as stale.
const ownerFile = "redisproc.owner"

// makeTempRoot removes the stale directories of prefix (see removeStale),
// then makes os.TempDir()/PREFIX<pid>-<random> with an owner file.
func makeTempRoot(prefix string) (string, error) {
	removeStale(prefix)
	pid := os.Getpid()
	dir, err := os.MkdirTemp("", prefix+strconv.Itoa(pid)+"-")
	if err != nil {
		return "", err
	}
	start, _ := startTime(pid)
	if err := os.WriteFile(filepath.Join(dir, ownerFile), fmt.Appendf(nil, "%d %s\n", pid, start), 0o600); err != nil {
		_ = os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

// removeStale removes what makeTempRoot left behind for processes that
// ended without Close (killed with SIGKILL, say). A directory in
// os.TempDir() is removed only if we provably made it and its maker is
// gone: its name is prefix, a pid other than ours and a dash; it is a
// directory, not a link, of this user; its owner file names the same pid;
// and no process with that pid and start time runs. Errors are ignored:
// this is tidying, and what is not removed now may be next time.
func removeStale(prefix string) {
	tmp := os.TempDir()
	entries, err := os.ReadDir(tmp)
	if err != nil {
		return
	}
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok {
			continue
		}
		pidText, _, ok := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if !ok || err != nil || pid <= 0 || pid == os.Getpid() {
			continue
		}
		if dir := filepath.Join(tmp, e.Name()); stale(dir, pid) {
			_ = os.RemoveAll(dir)
		}
	}
}

// stale reports whether dir, named for pid, is ours and its maker gone.
func stale(dir string, pid int) bool {
	fi, err := os.Lstat(dir)
	if err != nil || !fi.IsDir() || !ownedByMe(fi) {
		return false
	}
	b, err := os.ReadFile(filepath.Join(dir, ownerFile))
	if err != nil {
		return false
	}
	pidText, start, _ := strings.Cut(strings.TrimSpace(string(b)), " ")
	if pidText != strconv.Itoa(pid) {
		return false
	}
	return ownerGone(pid, start)
}
