// Command mutate checks that dlock's tests notice when a safety mechanism
// is broken. It reads a curated list of mutants (mutants.txt: each a small
// edit of a script or of a safety check, the docs/SAFETY.md guarantee it
// breaks, and the tests that must fail), and for each one copies the
// tracked tree to a temporary directory, applies the edit, and runs the
// cited tests there. A mutant is killed when a cited test fails, survived
// when they all pass, invalid when the mutated tree does not build, and
// stale when its text is no longer in the tree exactly once. It prints a
// table and a score, and exits non-zero unless every mutant was killed.
//
//	go run ./internal/mutate            # make mutate
//	go run ./internal/mutate -run pass  # the mutants whose id matches
//	go run ./internal/mutate -check     # the list only: no tests run
//	go run ./internal/mutate -all       # every cited test, to see which notice
//
// Mutants run one at a time by default: many of the tests bound how long
// something takes, and two runs at once on a small machine would stretch
// those times, killing mutants by accident.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// options are the command's flags.
type options struct {
	list, safety, only string
	par                int
	timeout            time.Duration
	check, baseline    bool
	verbose, keep, all bool
}

func main() {
	var o options
	flag.StringVar(&o.list, "list", "internal/mutate/mutants.txt", "the mutant list, relative to the repository root")
	flag.StringVar(&o.safety, "safety", "docs/SAFETY.md", "the guarantees the mutants map to, relative to the repository root")
	flag.StringVar(&o.only, "run", "", "run only the mutants whose id matches this regex")
	flag.IntVar(&o.par, "p", 1, "mutants run at once")
	flag.DurationVar(&o.timeout, "timeout", 3*time.Minute, "go test -timeout of each run, unless the mutant sets its own")
	flag.BoolVar(&o.check, "check", false, "check the list against the tree and docs/SAFETY.md, run nothing")
	flag.BoolVar(&o.baseline, "baseline", true, "first check that every cited test exists and passes on the unmutated tree")
	flag.BoolVar(&o.verbose, "v", false, "print the go test output of every mutant not killed")
	flag.BoolVar(&o.keep, "keep", false, "keep the mutated trees (their paths are printed)")
	flag.BoolVar(&o.all, "all", false, "run every test a mutant cites, not only until one fails (to see which notice)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	os.Exit(run(ctx, o))
}

func run(ctx context.Context, o options) int {
	start := time.Now()
	t, err := openTree()
	if err != nil {
		fmt.Fprintln(os.Stderr, "mutate:", err)
		return 2
	}
	t.keep, t.all = o.keep, o.all
	ms, errs := load(t, o.list, o.safety)
	for _, e := range errs {
		fmt.Fprintln(os.Stderr, "mutate:", e)
	}
	if ms == nil {
		return 2
	}
	if o.only != "" {
		re, err := regexp.Compile(o.only)
		if err != nil {
			fmt.Fprintln(os.Stderr, "mutate: -run:", err)
			return 2
		}
		var sel []Mutant
		for _, m := range ms {
			if re.MatchString(m.ID) {
				sel = append(sel, m)
			}
		}
		ms = sel
	}
	stale := 0
	for _, m := range ms {
		if _, err := Apply(m, t.read); err != nil {
			fmt.Fprintf(os.Stderr, "mutate: mutant %s (%s line %d): %v\n", m.ID, o.list, m.Line, err)
			stale++
		}
	}
	if o.check {
		fmt.Printf("%d mutants, %d stale, %d problems with the list\n", len(ms), stale, len(errs))
		if stale > 0 || len(errs) > 0 {
			return 1
		}
		return 0
	}
	if untracked := t.untracked(); len(untracked) > 0 {
		fmt.Printf("note: untracked files are not copied: %s\n", strings.Join(untracked, " "))
	}
	logf := func(format string, args ...any) { fmt.Printf(format, args...) }
	if o.baseline {
		if err := t.baseline(ctx, ms, o.timeout, logf); err != nil {
			fmt.Fprintln(os.Stderr, "mutate:", err)
			return 2
		}
	}
	results := runAll(ctx, t, ms, o.par, o.timeout, logf)
	if ctx.Err() != nil {
		fmt.Fprintln(os.Stderr, "mutate: interrupted")
		return 2
	}
	report(os.Stdout, results, o.verbose)
	counts := map[string]int{}
	for _, r := range results {
		counts[r.Outcome]++
	}
	pct := 0.0
	if len(results) > 0 {
		pct = 100 * float64(counts[Killed]) / float64(len(results))
	}
	fmt.Printf("\nscore: %d of %d mutants killed (%.0f%%); %d survived, %d invalid, %d stale\n",
		counts[Killed], len(results), pct, counts[Survived], counts[Invalid], counts[Stale])
	fmt.Printf("took %v on %d CPUs (%s/%s), commit %s\n", time.Since(start).Round(time.Second),
		runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, t.commit())
	if counts[Killed] != len(results) || len(errs) > 0 {
		return 1
	}
	return 0
}

// load parses the list and checks it against docs/SAFETY.md. It returns
// nil mutants only if the list cannot be read at all.
func load(t *tree, list, safety string) ([]Mutant, []error) {
	src, err := t.read(list)
	if err != nil {
		return nil, []error{err}
	}
	ms, err := Parse(strings.NewReader(src))
	if err != nil {
		return nil, []error{fmt.Errorf("%s: %w", list, err)}
	}
	md, err := t.read(safety)
	if err != nil {
		return ms, []error{err}
	}
	rows, err := SafetyRows(md)
	if err != nil {
		return ms, []error{fmt.Errorf("%s: %w", safety, err)}
	}
	return ms, CheckRows(ms, rows)
}

func openTree() (*tree, error) {
	root, err := git("", "rev-parse", "--show-toplevel")
	if err != nil {
		return nil, err
	}
	root = strings.TrimSpace(root)
	files, err := git(root, "ls-files", "-z")
	if err != nil {
		return nil, err
	}
	goCmd := os.Getenv("GO")
	if goCmd == "" {
		goCmd = "go"
	}
	return &tree{root: root, files: strings.Split(strings.TrimRight(files, "\x00"), "\x00"), goCmd: goCmd}, nil
}

func git(dir string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("git %s: %v", strings.Join(args, " "), err)
	}
	return string(out), nil
}

func (t *tree) untracked() []string {
	out, err := git(t.root, "ls-files", "--others", "--exclude-standard")
	if err != nil {
		return nil
	}
	return strings.Fields(out)
}

// commit names the commit the tree is at, and whether tracked files differ.
func (t *tree) commit() string {
	head, err := git(t.root, "rev-parse", "--short=12", "HEAD")
	if err != nil {
		return "unknown"
	}
	c := strings.TrimSpace(head)
	if st, err := git(t.root, "status", "--porcelain", "--untracked-files=no"); err == nil && strings.TrimSpace(st) != "" {
		c += " with uncommitted changes"
	}
	return c
}

// runAll runs the mutants, par at a time, logging each as it ends, and
// returns their results in list order.
func runAll(ctx context.Context, t *tree, ms []Mutant, par int, timeout time.Duration, logf func(string, ...any)) []Result {
	results := make([]Result, len(ms))
	next := make(chan int)
	var wg sync.WaitGroup
	var mu sync.Mutex
	done := 0
	for range max(par, 1) {
		wg.Go(func() {
			for i := range next {
				r := t.run(ctx, ms[i], timeout)
				results[i] = r
				mu.Lock()
				done++
				logf("[%2d/%d] %-8s %-40s %6.1fs  %s\n", done, len(ms), r.Outcome, r.M.ID, r.Took.Seconds(), r.By)
				if r.Dir != "" {
					logf("        kept in %s\n", r.Dir)
				}
				mu.Unlock()
			}
		})
	}
	for i := range ms {
		if ctx.Err() != nil {
			break
		}
		next <- i
	}
	close(next)
	wg.Wait()
	return results
}

// report prints the table: each mutant, the guarantee it breaks, and what
// noticed it.
func report(w *os.File, results []Result, verbose bool) {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "mutant\tresult\ttime\tguarantee (docs/SAFETY.md)\tnoticed by")
	for _, r := range results {
		if r.M.ID == "" {
			continue // not run (interrupted)
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1fs\t%s\t%s\n", r.M.ID, r.Outcome, r.Took.Seconds(), short(r.M.Row), r.By)
	}
	tw.Flush()
	if !verbose {
		return
	}
	for _, r := range results {
		if r.Outcome != Killed && r.Output != "" {
			fmt.Fprintf(w, "\n--- %s (%s): %s\n%s\n", r.M.ID, r.Outcome, r.M.What, r.Output)
		}
	}
}
