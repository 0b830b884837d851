package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"time"
)

// Outcomes of a mutant.
const (
	Killed   = "killed"   // a cited test failed (or timed out)
	Survived = "survived" // every cited test passed: they would not notice
	Invalid  = "invalid"  // the mutated tree does not build
	Stale    = "stale"    // an edit's text is not in the tree exactly once
)

// A Result is what became of one mutant.
type Result struct {
	M       Mutant
	Outcome string
	By      string // the tests that failed, or why it did not count
	Took    time.Duration
	Output  string // of the go test run that decided it
	Dir     string // the mutated tree, if kept
}

// tree is the repository being mutated: its root and its tracked files.
type tree struct {
	root  string
	files []string
	goCmd string
	keep  bool // keep each mutated tree
	all   bool // run every cited test of a mutant, not only until one fails
}

// copyTo copies the tracked files, as they are in the working tree, to dir,
// with over's contents in place of theirs.
func (t *tree) copyTo(dir string, over map[string]string) error {
	for _, f := range t.files {
		dst := filepath.Join(dir, filepath.FromSlash(f))
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			return err
		}
		if s, ok := over[f]; ok {
			if err := os.WriteFile(dst, []byte(s), 0o644); err != nil {
				return err
			}
			continue
		}
		if err := copyFile(filepath.Join(t.root, filepath.FromSlash(f)), dst); err != nil {
			if os.IsNotExist(err) {
				continue // deleted in the working tree
			}
			return err
		}
	}
	return nil
}

func copyFile(src, dst string) error {
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	b, err := os.ReadFile(src)
	if err != nil {
		return err
	}
	return os.WriteFile(dst, b, st.Mode().Perm())
}

func (t *tree) read(path string) (string, error) {
	b, err := os.ReadFile(filepath.Join(t.root, filepath.FromSlash(path)))
	return string(b), err
}

// run applies m to a fresh copy of the tree and runs its tests there, one
// go test at a time, until one fails (or all of them, with t.all).
func (t *tree) run(ctx context.Context, m Mutant, timeout time.Duration) (r Result) {
	start := time.Now()
	r.M = m
	defer func() { r.Took = time.Since(start) }()
	over, err := Apply(m, t.read)
	if err != nil {
		r.Outcome, r.By = Stale, err.Error()
		return r
	}
	dir, err := os.MkdirTemp("", "dlock-mutant-"+m.ID+"-")
	if err != nil {
		r.Outcome, r.By = Invalid, err.Error()
		return r
	}
	if t.keep {
		r.Dir = dir
	} else {
		defer os.RemoveAll(dir)
	}
	if err := t.copyTo(dir, over); err != nil {
		r.Outcome, r.By = Invalid, err.Error()
		return r
	}
	if m.Timeout > 0 {
		timeout = m.Timeout
	}
	var passed, failed strings.Builder
	var by []string
	for _, ref := range m.Tests {
		out, err := t.goTest(ctx, dir, timeout, "-count=1", "-failfast", "-vet=off", "-timeout", timeout.String(), "-run", ref.Run, ref.Pkg)
		if err == nil {
			passed.WriteString(out)
			continue
		}
		if ctx.Err() != nil {
			r.Outcome, r.By, r.Output = Invalid, "interrupted", out
			return r
		}
		if buildFailed(out) {
			r.Outcome, r.By, r.Output = Invalid, "does not build: "+firstError(out), out
			return r
		}
		failed.WriteString(out)
		by = append(by, failures(out, ref))
		if !t.all {
			break
		}
	}
	if len(by) > 0 {
		r.Outcome, r.By, r.Output = Killed, strings.Join(by, ", "), failed.String()
		return r
	}
	r.Outcome, r.By, r.Output = Survived, "every cited test passed", passed.String()
	return r
}

// goTest runs go test in dir, killing it (and the test binaries and
// servers it started) if it outlives timeout by a minute.
func (t *tree) goTest(ctx context.Context, dir string, timeout time.Duration, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout+time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, t.goCmd, append([]string{"test"}, args...)...)
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	ownGroup(cmd)
	cmd.WaitDelay = 10 * time.Second
	err := cmd.Run()
	return out.String(), err
}

var (
	failLine  = regexp.MustCompile(`(?m)^\s*--- FAIL: (\S+)`)
	buildFail = regexp.MustCompile(`(?m)^FAIL\s+\S+\s+\[(build|setup) failed\]`)
)

func buildFailed(out string) bool { return buildFail.MatchString(out) }

// failures names what failed in a go test output.
func failures(out string, ref TestRef) string {
	var names []string
	for _, m := range failLine.FindAllStringSubmatch(out, -1) {
		if !strings.Contains(m[1], "/") || len(names) == 0 {
			names = append(names, m[1])
		}
	}
	switch {
	case strings.Contains(out, "panic: test timed out"):
		names = append(names, "(timed out)")
	case len(names) == 0 && strings.Contains(out, "goleak"):
		names = append(names, "(goleak in TestMain)")
	case len(names) == 0:
		names = append(names, "("+ref.Pkg+" failed: "+firstError(out)+")")
	}
	return strings.Join(names, ", ")
}

// firstError is the first line of out that looks like an error.
func firstError(out string) string {
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		if l != "" && !strings.HasPrefix(l, "#") && !strings.HasPrefix(l, "=== ") && !strings.HasPrefix(l, "ok ") {
			return short(l)
		}
	}
	return "no output"
}

// listTests returns the names of the top-level tests, examples and
// benchmarks of pkg, as go test -list sees them in dir.
func (t *tree) listTests(ctx context.Context, dir, pkg string) ([]string, error) {
	out, err := t.goTest(ctx, dir, time.Minute, "-count=1", "-vet=off", "-list", ".", pkg)
	if err != nil {
		return nil, fmt.Errorf("go test -list . %s: %v\n%s", pkg, err, out)
	}
	var names []string
	for _, l := range strings.Split(out, "\n") {
		for _, p := range []string{"Test", "Example", "Benchmark", "Fuzz"} {
			if strings.HasPrefix(l, p) {
				names = append(names, strings.TrimSpace(l))
			}
		}
	}
	return names, nil
}

// baseline checks, on an unmutated copy, that every cited test exists and
// passes: a mutant killed by a test that fails anyway proves nothing.
func (t *tree) baseline(ctx context.Context, ms []Mutant, timeout time.Duration, logf func(string, ...any)) error {
	dir, err := os.MkdirTemp("", "dlock-mutant-baseline-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	if err := t.copyTo(dir, nil); err != nil {
		return err
	}
	names := map[string][]string{}
	var refs []TestRef
	seen := map[TestRef]bool{}
	for _, m := range ms {
		for _, ref := range m.Tests {
			if _, ok := names[ref.Pkg]; !ok {
				if names[ref.Pkg], err = t.listTests(ctx, dir, ref.Pkg); err != nil {
					return err
				}
			}
			top, _, _ := strings.Cut(ref.Run, "/") // -run matches subtests by their parent first
			re := regexp.MustCompile(top)
			if !matchesAny(re, names[ref.Pkg]) {
				return fmt.Errorf("mutant %s cites %s, which matches no test: stale", m.ID, ref)
			}
			if !seen[ref] {
				seen[ref] = true
				refs = append(refs, ref)
			}
		}
	}
	for _, ref := range refs {
		start := time.Now()
		out, err := t.goTest(ctx, dir, timeout, "-count=1", "-vet=off", "-timeout", timeout.String(), "-run", ref.Run, ref.Pkg)
		if err != nil {
			return fmt.Errorf("baseline: %s fails on the unmutated tree:\n%s", ref, out)
		}
		logf("baseline ok  %-60s %5.1fs\n", ref, time.Since(start).Seconds())
	}
	return nil
}

func matchesAny(re *regexp.Regexp, names []string) bool {
	for _, n := range names {
		if re.MatchString(n) {
			return true
		}
	}
	return false
}
