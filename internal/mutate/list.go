package main

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"strings"
	"time"
)

// A Mutant is one deliberate defect: one or more edits of the tracked tree
// that remove or weaken a safety mechanism, and the tests that must notice.
type Mutant struct {
	ID      string
	Row     string // the start of the docs/SAFETY.md guarantee it breaks
	What    string // one line: what it breaks
	Tests   []TestRef
	Edits   []Edit
	Timeout time.Duration // 0: the run's default
	Line    int           // where it begins in the list
}

// A TestRef is one go test invocation: a package and a -run regex.
type TestRef struct {
	Pkg string // as go test takes it: ".", "./internal/hub"
	Run string
}

func (r TestRef) String() string { return r.Pkg + " " + r.Run }

// An Edit replaces From, which must occur exactly once in File, by To.
type Edit struct {
	File     string
	From, To string
}

var idPattern = regexp.MustCompile(`^[a-z0-9]+(-[a-z0-9]+)*$`)

// Parse reads a mutant list (see mutants.txt for the format).
func Parse(r io.Reader) ([]Mutant, error) {
	var (
		out  []Mutant
		m    *Mutant
		ed   *Edit
		from []string // the current edit's from and to lines
		to   []string
		n    int
	)
	fail := func(format string, args ...any) error {
		return fmt.Errorf("line %d: %s", n, fmt.Sprintf(format, args...))
	}
	closeEdit := func() error {
		if ed == nil {
			return nil
		}
		if len(from) == 0 {
			return fmt.Errorf("mutant %s: the edit of %s has no from lines", m.ID, ed.File)
		}
		ed.From, ed.To = strings.Join(from, "\n"), strings.Join(to, "\n")
		m.Edits = append(m.Edits, *ed)
		ed, from, to = nil, nil, nil
		return nil
	}
	closeMutant := func() error {
		if m == nil {
			return nil
		}
		if err := closeEdit(); err != nil {
			return err
		}
		switch {
		case m.Row == "":
			return fmt.Errorf("mutant %s (line %d): no row", m.ID, m.Line)
		case m.What == "":
			return fmt.Errorf("mutant %s (line %d): no what", m.ID, m.Line)
		case len(m.Tests) == 0:
			return fmt.Errorf("mutant %s (line %d): no test", m.ID, m.Line)
		case len(m.Edits) == 0:
			return fmt.Errorf("mutant %s (line %d): no edit (file, from, to)", m.ID, m.Line)
		}
		out = append(out, *m)
		m = nil
		return nil
	}
	seen := map[string]int{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		n++
		line := sc.Text()
		if strings.TrimSpace(line) == "" || strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		key := line
		if i := strings.IndexAny(line, " \t"); i >= 0 {
			key = line[:i]
		}
		val := strings.TrimSpace(line[len(key):])
		if key != "mutant" && m == nil {
			return nil, fail("%q before the first mutant", key)
		}
		switch key {
		case "mutant":
			if err := closeMutant(); err != nil {
				return nil, err
			}
			if !idPattern.MatchString(val) {
				return nil, fail("mutant id %q: want lower-case words joined by '-'", val)
			}
			if at, dup := seen[val]; dup {
				return nil, fail("mutant %s already defined on line %d", val, at)
			}
			seen[val] = n
			m = &Mutant{ID: val, Line: n}
		case "row", "what":
			if val == "" {
				return nil, fail("empty %s", key)
			}
			if key == "row" {
				m.Row = val
			} else {
				m.What = val
			}
		case "test":
			f := strings.Fields(val)
			if len(f) != 2 {
				return nil, fail("test wants a package and a -run regex without spaces, got %q", val)
			}
			pkg, run := f[0], f[1]
			if pkg != "." && !strings.HasPrefix(pkg, "./") {
				return nil, fail("test package %q: want . or ./dir", pkg)
			}
			if _, err := regexp.Compile(run); err != nil {
				return nil, fail("test regex %q: %v", run, err)
			}
			m.Tests = append(m.Tests, TestRef{Pkg: pkg, Run: run})
		case "timeout":
			d, err := time.ParseDuration(val)
			if err != nil || d <= 0 {
				return nil, fail("timeout %q: want a positive duration", val)
			}
			m.Timeout = d
		case "file":
			if err := closeEdit(); err != nil {
				return nil, err
			}
			if val == "" || strings.HasPrefix(val, "/") || strings.Contains(val, "..") {
				return nil, fail("file %q: want a path inside the repository", val)
			}
			ed = &Edit{File: val}
		case "from", "to":
			if ed == nil {
				return nil, fail("%s before file", key)
			}
			_, text, ok := strings.Cut(line, "|")
			if !ok {
				return nil, fail("%s wants its text after a '|'", key)
			}
			if key == "from" {
				if len(to) > 0 {
					return nil, fail("from after to: start another edit with file")
				}
				from = append(from, text)
			} else {
				to = append(to, text)
			}
		default:
			return nil, fail("unknown keyword %q", key)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if err := closeMutant(); err != nil {
		return nil, err
	}
	return out, nil
}

// Apply returns the tree files with m's edits made, reading each file with
// read. An edit whose text does not occur exactly once makes m stale: the
// code it was written against has changed, and the list must follow.
func Apply(m Mutant, read func(path string) (string, error)) (map[string]string, error) {
	files := map[string]string{}
	for _, e := range m.Edits {
		src, ok := files[e.File]
		if !ok {
			var err error
			if src, err = read(e.File); err != nil {
				return nil, fmt.Errorf("stale: %s: %v", e.File, err)
			}
		}
		switch k := strings.Count(src, e.From); k {
		case 1:
			files[e.File] = strings.Replace(src, e.From, e.To, 1)
		case 0:
			return nil, fmt.Errorf("stale: %s no longer has %q", e.File, firstLine(e.From))
		default:
			return nil, fmt.Errorf("stale: %s has %q %d times: make it unique", e.File, firstLine(e.From), k)
		}
	}
	return files, nil
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i] + " …"
	}
	return s
}
