package market

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// storyResults are 5/5 cells (or load l) of the demo's rows with numbers
// for which every claim holds.
func storyResults(l Load) map[string]*Result {
	d := 3 * time.Second
	mk := func(v string, bought, retries, polls int64, p99 time.Duration, held time.Duration) *Result {
		r := baseResult(Config{Duration: d, Pick: PickCheapest10}, l, specFor(v))
		r.Bought, r.Retries, r.LockFailures, r.LockHeld = bought, retries, polls, held
		if held > 0 {
			// A listing for every purchase, critical sections as aggregate
			// makes them.
			r.LockSections = 2 * bought
			setCeiling(&r)
		}
		r.Calls, r.InFlight = bought, 10 // every worker in a call at the row's end
		r.All = Latency{Mean: p99 / 4, P50: p99 / 5, P99: p99}
		return &r
	}
	return map[string]*Result{
		VariantWatch:       mk(VariantWatch, 500, 20000, 0, 180*time.Millisecond, 0),
		VariantCoarse:      mk(VariantCoarse, 4600, 0, 22000, 72*time.Millisecond, d/3),
		VariantFine:        mk(VariantFine, 8900, 0, 2400, 4700*time.Microsecond, 2*d),
		VariantDlockCoarse: mk(VariantDlockCoarse, 6900, 0, 0, 6*time.Millisecond, d*95/100),
		VariantDlockFine:   mk(VariantDlockFine, 9100, 0, 0, 4*time.Millisecond, 2*d),
		VariantLua:         mk(VariantLua, 32000, 0, 0, 500*time.Microsecond, 0),
	}
}

func inOrder(m map[string]*Result) []Result {
	var rs []Result
	for _, v := range Variants() {
		if r, ok := m[v]; ok {
			rs = append(rs, *r)
		}
	}
	return rs
}

// claimWith returns the claim whose text contains s, failing if there is
// not exactly one.
func claimWith(t *testing.T, cs []claim, s string) claim {
	t.Helper()
	var found []claim
	for _, c := range cs {
		if strings.Contains(c.text, s) {
			found = append(found, c)
		}
	}
	if len(found) != 1 {
		t.Fatalf("%d claims mention %q, want 1: %+v", len(found), s, cs)
	}
	return found[0]
}

// TestClaims makes every claim hold, then breaks the numbers each one is
// about and checks that it, and only it, is marked as not holding.
func TestClaims(t *testing.T) {
	keys := map[string]string{
		"check":  "created or lost",
		"watch":  "WATCH starts most purchases over",
		"fine":   "a lock per item beats WATCH",
		"gap":    "one right after another",
		"p99":    "keeps the slowest purchases short",
		"dlock":  "dlock costs no purchases",
		"dlock2": "dlock costs no purchases",
		"hung":   "keeps the slowest purchases short",
	}
	breakers := map[string]func(m map[string]*Result){
		"check": func(m map[string]*Result) { m[VariantLua].CheckError = "total funds 1 ≠ 2" },
		"watch": func(m map[string]*Result) { m[VariantWatch].Retries = m[VariantWatch].Bought },
		"fine":  func(m map[string]*Result) { m[VariantFine].Bought = 10*m[VariantWatch].Bought - 1 },
		"gap": func(m map[string]*Result) {
			m[VariantDlockCoarse].LockHeld = 3 * time.Second * 89 / 100
			setCeiling(m[VariantDlockCoarse])
		},
		"p99": func(m map[string]*Result) {
			m[VariantDlockCoarse].All.P99 = m[VariantCoarse].All.P99/4 + time.Microsecond
		},
		"dlock":  func(m map[string]*Result) { m[VariantDlockFine].Bought = m[VariantFine].Bought - 1 },
		"dlock2": func(m map[string]*Result) { m[VariantDlockFine].All.P99 = m[VariantFine].All.P99 + time.Microsecond },
		// More calls still waiting at the end than 1 in 100 completed.
		"hung": func(m map[string]*Result) { m[VariantDlockCoarse].Calls = 100*m[VariantDlockCoarse].InFlight - 1 },
	}
	cs := claims(inOrder(storyResults(Load{5, 5})))
	if len(cs) != 6 {
		t.Fatalf("%d claims, want 6: %+v", len(cs), cs)
	}
	for _, c := range cs {
		if !c.holds {
			t.Errorf("claim does not hold on numbers made for it: %s", c.text)
		}
	}
	for name, brk := range breakers {
		m := storyResults(Load{5, 5})
		brk(m)
		cs := claims(inOrder(m))
		if c := claimWith(t, cs, keys[name]); c.holds {
			t.Errorf("%s broken: claim still holds: %s", name, c.text)
		}
		failed := 0
		for _, c := range cs {
			if !c.holds {
				failed++
			}
		}
		if failed != 1 {
			t.Errorf("%s broken: %d claims fail, want 1: %+v", name, failed, cs)
		}
	}

	// At 1/1 the claims made for a contended market do not apply; the
	// others do.
	cs = claims(inOrder(storyResults(Load{1, 1})))
	for _, s := range []string{keys["fine"], keys["dlock"], keys["gap"]} {
		for _, c := range cs {
			if strings.Contains(c.text, s) {
				t.Errorf("claim made at 1/1: %s", c.text)
			}
		}
	}
	claimWith(t, cs, keys["watch"])
	claimWith(t, cs, keys["p99"])

	// A claim needs its rows: without the dlock rows there is none about them.
	m := storyResults(Load{5, 5})
	delete(m, VariantDlockCoarse)
	delete(m, VariantDlockFine)
	for _, c := range claims(inOrder(m)) {
		if strings.Contains(c.text, "dlock") {
			t.Errorf("claim about a row that did not run: %s", c.text)
		}
	}
}

// TestSummaryAtAGlance: the demo's table fits 100 columns, explains every
// column under it, and marks each claim.
func TestSummaryAtAGlance(t *testing.T) {
	m := storyResults(Load{5, 5})
	m[VariantDlockFine].Bought = 100 // one claim that does not hold
	var b bytes.Buffer
	WriteSummary(&b, inOrder(m))
	out := b.String()
	t.Logf("\n%s", out)
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	for _, l := range lines {
		if n := len([]rune(l)); n > 100 {
			t.Errorf("line of %d columns: %q", n, l)
		}
	}
	if !strings.HasPrefix(lines[0], "5 sellers and 5 buyers, 3s per row") {
		t.Errorf("first line %q does not say the load and the time per row", lines[0])
	}
	head := strings.Fields(lines[2])
	if len(head) < 6 || head[0] != "variant" {
		t.Fatalf("header %q", lines[2])
	}
	legend := map[string]bool{} // the terms the lines below the table explain
	for _, l := range lines[3:] {
		if term, _, ok := strings.Cut(l, "  "); ok && term != "" {
			for _, t := range strings.Split(term, ", ") {
				legend[t] = true
			}
		}
	}
	for _, h := range head[1:] {
		if !legend[h] {
			t.Errorf("column %q is not explained under the table", h)
		}
	}
	for _, v := range demoRows() {
		if !legend[v] {
			t.Errorf("row %q is not explained under the table", v)
		}
	}
	if strings.Count(out, "\n  ✓ ") != 5 || strings.Count(out, "\n  ✗ ") != 1 {
		t.Errorf("want 5 claims marked ✓ and 1 ✗")
	}
	// A speed claim that does not hold in one round points at --rounds;
	// one that does, or a table of rounds, does not.
	if !strings.Contains(out, "--rounds") {
		t.Errorf("a speed claim failed in one round, and the summary does not suggest --rounds:\n%s", out)
	}
	var fine bytes.Buffer
	WriteSummary(&fine, inOrder(storyResults(Load{5, 5})))
	var rounds bytes.Buffer
	WriteSummary(&rounds, roundsOf(0.7, 0.8, 0.9))
	if strings.Contains(fine.String(), "--rounds") || strings.Contains(rounds.String(), "--rounds") {
		t.Errorf("--rounds suggested though every claim held, or the table has rounds:\n%s\n%s", fine.String(), rounds.String())
	}
	for _, word := range []string{"target", "spec", "MARKET"} {
		if strings.Contains(out, word) {
			t.Errorf("the summary cites %q, which the user cannot see", word)
		}
	}
}

func demoRows() []string {
	return []string{VariantWatch, VariantCoarse, VariantFine, VariantDlockCoarse, VariantDlockFine, VariantLua}
}

// setCeiling computes r's critical-section measures as aggregate does.
func setCeiling(r *Result) {
	r.CriticalSection, r.CeilingShare = 0, 0
	ceiling(r)
}
