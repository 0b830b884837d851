package main

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
)

// A Row is one guarantee in the table of docs/SAFETY.md.
type Row struct {
	Promise string   // its first cell
	Mutants []string // the mutant ids its last cell names
	Line    int
}

var backticked = regexp.MustCompile("`([a-z0-9-]+)`")

// SafetyRows reads the guarantee table: the first table after the heading
// "## Guarantees". Its last column must name the mutants of each row.
func SafetyRows(md string) ([]Row, error) {
	var rows []Row
	in, header := false, 0
	for i, line := range strings.Split(md, "\n") {
		switch {
		case strings.HasPrefix(line, "## "):
			if in && len(rows) > 0 {
				return rows, nil
			}
			in = strings.HasPrefix(line, "## Guarantees")
			continue
		case !in:
			continue
		case !strings.HasPrefix(line, "|"):
			if len(rows) > 0 {
				return rows, nil
			}
			continue
		}
		cells := strings.Split(strings.Trim(strings.TrimSpace(line), "|"), "|")
		if header < 2 { // the header line and the |---| line
			if header == 0 && !strings.Contains(strings.ToLower(cells[len(cells)-1]), "mutant") {
				return nil, fmt.Errorf("line %d: the guarantee table's last column must name the mutants of each row", i+1)
			}
			header++
			continue
		}
		r := Row{Promise: strings.TrimSpace(cells[0]), Line: i + 1}
		for _, m := range backticked.FindAllStringSubmatch(cells[len(cells)-1], -1) {
			r.Mutants = append(r.Mutants, m[1])
		}
		rows = append(rows, r)
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("no guarantee table after a \"## Guarantees\" heading")
	}
	return rows, nil
}

// CheckRows checks that the list and the table agree: each mutant's row
// begins exactly one promise, every row has a mutant, and each row's last
// cell names exactly the mutants of that row.
func CheckRows(ms []Mutant, rows []Row) []error {
	var errs []error
	listed := make([][]string, len(rows))
	for _, m := range ms {
		var at []int
		for i, r := range rows {
			if strings.HasPrefix(r.Promise, m.Row) {
				at = append(at, i)
			}
		}
		if len(at) != 1 {
			errs = append(errs, fmt.Errorf("mutant %s: row %q begins %d guarantees of docs/SAFETY.md, want 1", m.ID, m.Row, len(at)))
			continue
		}
		listed[at[0]] = append(listed[at[0]], m.ID)
	}
	for i, r := range rows {
		if len(listed[i]) == 0 {
			errs = append(errs, fmt.Errorf("docs/SAFETY.md line %d: no mutant guards %q", r.Line, short(r.Promise)))
		}
		for _, id := range r.Mutants {
			if !slices.Contains(listed[i], id) {
				errs = append(errs, fmt.Errorf("docs/SAFETY.md line %d names mutant %s, which the list does not give this row", r.Line, id))
			}
		}
		for _, id := range listed[i] {
			if !slices.Contains(r.Mutants, id) {
				errs = append(errs, fmt.Errorf("docs/SAFETY.md line %d does not name mutant %s of its row", r.Line, id))
			}
		}
	}
	return errs
}

func short(s string) string {
	if r := []rune(s); len(r) > 60 {
		return string(r[:57]) + "..."
	}
	return s
}
