package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

const sample = `# a comment
mutant first-one
row    one holder
what   takes a held lock
test   . ^TestA$
test   ./internal/hub ^TestB$/sub
timeout 90s
file   a.lua
from   |if h[1] then
from   |	x = 1 -- a tab and a | inside
to     |if h[1] == token then

mutant second
row    fences strictly inc
what   deletes a line
test   . ^TestC$
file   b.go
from   |	f()
file   c.go
from   |x
to     |
to     |y
`

func TestParse(t *testing.T) {
	ms, err := Parse(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 {
		t.Fatalf("%d mutants", len(ms))
	}
	a, b := ms[0], ms[1]
	if a.ID != "first-one" || a.Row != "one holder" || a.What != "takes a held lock" || a.Timeout != 90*time.Second || a.Line != 2 {
		t.Errorf("first: %+v", a)
	}
	if len(a.Tests) != 2 || a.Tests[1] != (TestRef{"./internal/hub", "^TestB$/sub"}) {
		t.Errorf("first's tests: %v", a.Tests)
	}
	if len(a.Edits) != 1 || a.Edits[0] != (Edit{"a.lua", "if h[1] then\n\tx = 1 -- a tab and a | inside", "if h[1] == token then"}) {
		t.Errorf("first's edit: %q", a.Edits)
	}
	if len(b.Edits) != 2 || b.Edits[0] != (Edit{"b.go", "\tf()", ""}) || b.Edits[1] != (Edit{"c.go", "x", "\ny"}) {
		t.Errorf("second's edits: %q", b.Edits)
	}
}

func TestParseErrors(t *testing.T) {
	const ok = "mutant m\nrow r\nwhat w\ntest . ^T$\nfile f\nfrom |x\n"
	for _, tc := range []struct{ src, want string }{
		{"row r\n", "before the first mutant"},
		{"mutant Bad_ID\n", "lower-case"},
		{ok + ok, "already defined on line 1"},
		{"mutant m\nwhat w\ntest . ^T$\nfile f\nfrom |x\n", "no row"},
		{"mutant m\nrow r\nwhat w\nfile f\nfrom |x\n", "no test"},
		{"mutant m\nrow r\nwhat w\ntest . ^T$\n", "no edit"},
		{"mutant m\nrow r\nwhat w\ntest . ^T$\nfile f\n", "no from lines"},
		{"mutant m\nrow r\nwhat w\ntest . ^T$\nfrom |x\n", "from before file"},
		{"mutant m\nrow r\nwhat w\ntest . ^T$\nfile f\nfrom x\n", "after a '|'"},
		{"mutant m\nrow r\nwhat w\ntest . ^T$\nfile f\nfrom |x\nto |y\nfrom |z\n", "from after to"},
		{"mutant m\nrow r\nwhat w\ntest ^T$\n", "a package and a -run regex"},
		{"mutant m\nrow r\nwhat w\ntest internal/hub ^T$\n", "want . or ./dir"},
		{"mutant m\nrow r\nwhat w\ntest . ^(T$\n", "regex"},
		{"mutant m\nrow r\nwhat w\ntimeout soon\n", "timeout"},
		{"mutant m\nrow r\nwhat w\nfile ../x\n", "inside the repository"},
		{"mutant m\nrow r\nwhat w\nfrob x\n", "unknown keyword"},
	} {
		_, err := Parse(strings.NewReader(tc.src))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Parse(%q): %v, want an error about %q", tc.src, err, tc.want)
		}
	}
}

func TestApplyAndStale(t *testing.T) {
	files := map[string]string{"a.go": "x := 1\ny := 2\n", "b.go": "z\nz\n"}
	read := func(p string) (string, error) {
		if s, ok := files[p]; ok {
			return s, nil
		}
		return "", os.ErrNotExist
	}
	m := Mutant{ID: "m", Edits: []Edit{{"a.go", "x := 1\ny", "x := 0\ny"}, {"a.go", "y := 2\n", ""}}}
	got, err := Apply(m, read)
	if err != nil || got["a.go"] != "x := 0\n" || len(got) != 1 {
		t.Fatalf("Apply: %q, %v", got, err)
	}
	for _, tc := range []struct {
		e    Edit
		want string
	}{
		{Edit{"a.go", "w := 3", ""}, "no longer has"},
		{Edit{"b.go", "z", ""}, "2 times"},
		{Edit{"gone.go", "z", ""}, "gone.go"},
	} {
		if _, err := Apply(Mutant{Edits: []Edit{tc.e}}, read); err == nil || !strings.HasPrefix(err.Error(), "stale") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Apply(%+v): %v, want stale: %s", tc.e, err, tc.want)
		}
	}
}

const safety = `# Safety
## Guarantees

| promise | how | test | mutants (make mutate) |
|---|---|---|---|
| one holder at a time | scripts | TestA | ` + "`first-one`" + ` |
| fences strictly increase | max | TestC | ` + "`second`, `third`" + ` |
| fences strictly decrease | never | TestD | |

## Limits

| limit | test |
|---|---|
| not a guarantee | TestE |
`

func TestSafetyRows(t *testing.T) {
	rows, err := SafetyRows(safety)
	if err != nil {
		t.Fatal(err)
	}
	if len(rows) != 3 || rows[1].Promise != "fences strictly increase" || strings.Join(rows[1].Mutants, ",") != "second,third" || rows[0].Line != 6 {
		t.Fatalf("rows %+v", rows)
	}
	ms, _ := Parse(strings.NewReader(sample))
	ms = append(ms, Mutant{ID: "vague", Row: "fences strictly"}, Mutant{ID: "nowhere", Row: "no such row"})
	var got []string
	for _, err := range CheckRows(ms, rows) {
		got = append(got, err.Error())
	}
	for _, want := range []string{
		"mutant vague: row \"fences strictly\" begins 2 guarantees",
		"mutant nowhere: row \"no such row\" begins 0 guarantees",
		"line 7 names mutant third, which the list does not give this row",
		"line 8: no mutant guards \"fences strictly decrease\"",
	} {
		if !strings.Contains(strings.Join(got, "\n"), want) {
			t.Errorf("CheckRows did not report %q; it said:\n%s", want, strings.Join(got, "\n"))
		}
	}
	if len(got) != 4 {
		t.Errorf("%d problems, want 4:\n%s", len(got), strings.Join(got, "\n"))
	}
	if _, err := SafetyRows(strings.Replace(safety, "mutants (make mutate)", "notes", 1)); err == nil {
		t.Error("a table without a mutants column was accepted")
	}
}

// TestRepositoryList: the list in the repository parses, agrees with
// docs/SAFETY.md, and no mutant is stale against the tree as it is.
func TestRepositoryList(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	tr := &tree{root: root}
	ms, errs := load(tr, "internal/mutate/mutants.txt", "docs/SAFETY.md")
	for _, err := range errs {
		t.Error(err)
	}
	for _, m := range ms {
		if _, err := Apply(m, tr.read); err != nil {
			t.Errorf("mutant %s (mutants.txt line %d): %v", m.ID, m.Line, err)
		}
	}
}
