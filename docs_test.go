package dlock_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
)

// TestUsageIsExample: the program a newcomer pastes from the README's "In
// thirty seconds" and the package doc's usage are the code of Example,
// which go test compiles, runs against a real server and checks the output
// of; and the README's lines for a test on miniredis are those that
// TestMiniredisTime runs.
func TestUsageIsExample(t *testing.T) {
	example := funcBody(t, "example_test.go", "Example")
	example, _, _ = strings.Cut(example, "// Output:")
	example = strings.ReplaceAll(example, "Addr: addr}", `Addr: "127.0.0.1:6379"}`)
	readme := readFile(t, "README.md")

	program := codeBlockAfter(t, readme, "## In thirty seconds")
	_, main, _ := strings.Cut(program, "func main() {\n")
	main = strings.TrimSuffix(strings.TrimSpace(main), "}")
	sameCode(t, "the README's program", main, example)

	f, err := parser.ParseFile(token.NewFileSet(), "dlock.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil {
		t.Fatal(err)
	}
	_, usage, _ := strings.Cut(f.Doc.Text(), "# Usage\n")
	var code []string
	for _, line := range strings.Split(usage, "\n") {
		if strings.HasPrefix(line, "\t") || line == "" && len(code) > 0 {
			code = append(code, line)
		} else if len(code) > 0 {
			break // the prose after the code block
		}
	}
	sameCode(t, "the package doc's usage", strings.Join(code, "\n"), example)

	_, test, _ := strings.Cut(readFile(t, "servers_test.go"), "// The README's lines for a unit test, as they are there.\n")
	test, _, _ = strings.Cut(test, "\n\n")
	sameCode(t, "the README's lines for miniredis", codeBlockAfter(t, readme, "## Testing your code with miniredis"), test)
}

func readFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// funcBody returns the source between the braces of the function name in file.
func funcBody(t *testing.T, file, name string) string {
	t.Helper()
	src := readFile(t, file)
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, src, parser.ParseComments)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Recv == nil && fd.Name.Name == name {
			return src[fset.Position(fd.Body.Lbrace).Offset+1 : fset.Position(fd.Body.Rbrace).Offset]
		}
	}
	t.Fatalf("%s has no func %s", file, name)
	return ""
}

// codeBlockAfter returns the first fenced code block after heading in md.
func codeBlockAfter(t *testing.T, md, heading string) string {
	t.Helper()
	_, after, ok := strings.Cut(md, "\n"+heading+"\n")
	if !ok {
		t.Fatalf("no heading %q", heading)
	}
	_, block, ok := strings.Cut(after, "```go\n")
	block, _, ok2 := strings.Cut(block, "```")
	if !ok || !ok2 {
		t.Fatalf("no code block after %q", heading)
	}
	return block
}

// sameCode compares two pieces of code line by line, ignoring indentation,
// blank lines and the width of spaces.
func sameCode(t *testing.T, what, got, want string) {
	t.Helper()
	norm := func(s string) []string {
		var out []string
		for _, line := range strings.Split(s, "\n") {
			if line = strings.Join(strings.Fields(line), " "); line != "" {
				out = append(out, line)
			}
		}
		return out
	}
	g, w := norm(got), norm(want)
	for i := range max(len(g), len(w)) {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			t.Errorf("%s differs from the tested code at line %d:\n  has:  %s\n  want: %s", what, i+1, gl, wl)
			return
		}
	}
}

// TestObservabilityDocIsExample: docs/OBSERVABILITY.md's Prometheus
// program is the code of ExampleWithMeterProvider, which go test compiles
// and runs, and the output it shows is the example's.
func TestObservabilityDocIsExample(t *testing.T) {
	example := funcBody(t, "example_observe_test.go", "ExampleWithMeterProvider")
	example, output, _ := strings.Cut(example, "// Output:")
	example = strings.ReplaceAll(example, "Addr: addr}", `Addr: "127.0.0.1:6379"}`)
	doc := readFile(t, "docs/OBSERVABILITY.md")
	sameCode(t, "docs/OBSERVABILITY.md's Prometheus program", codeBlockAfter(t, doc, "## Prometheus"), example)
	_, printed, _ := strings.Cut(doc, "It prints")
	_, printed, _ = strings.Cut(printed, "```\n")
	printed, _, _ = strings.Cut(printed, "```")
	sameCode(t, "docs/OBSERVABILITY.md's output", printed, strings.ReplaceAll(output, "// ", ""))
}

// TestElectionReadmeIsExample: the README's leader election is the code of
// ExampleClient_Election, which go test compiles, runs and checks.
func TestElectionReadmeIsExample(t *testing.T) {
	example := funcBody(t, "example_election_test.go", "ExampleClient_Election")
	example, _, _ = strings.Cut(example, "// Output:")
	example = strings.ReplaceAll(example, "Addr: addr}", `Addr: "127.0.0.1:6379"}`)
	sameCode(t, "the README's leader election", codeBlockAfter(t, readFile(t, "README.md"), "## Leader election"), example)
}

// TestMultiLockReadmeIsExample: the README's MultiLock is the code of
// ExampleClient_MultiLock, which go test compiles, runs and checks.
func TestMultiLockReadmeIsExample(t *testing.T) {
	example := funcBody(t, "example_multilock_test.go", "ExampleClient_MultiLock")
	example, _, _ = strings.Cut(example, "// Output:")
	example = strings.ReplaceAll(example, "Addr: addr}", `Addr: "127.0.0.1:6379"}`)
	sameCode(t, "the README's MultiLock", codeBlockAfter(t, readFile(t, "README.md"), "## Several names as one lock"), example)
}
