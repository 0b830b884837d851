package market

import (
	"fmt"
	"math"
	"slices"
	"strings"
)

// claim is one statement about the rows of a run, checked against what the
// run measured.
type claim struct {
	load  *Load // the load it is about; nil: every row
	holds bool
	// text states the claim, what was measured, and why it should hold,
	// in words that need nothing outside the table.
	text string
}

// Thresholds of the claims. The book's own figures at its busiest load (5
// sellers, 5 buyers) show the fine lock buying far more than ten times
// what WATCH buys; the dlock rows are expected to do at least as well as
// the book's lock they replace.
const (
	fineOverWatch   = 10.0 // fine lock purchases ÷ WATCH purchases, heavy loads
	coarseCeiling   = 0.9  // dlock-coarse's critical sections per second ÷ (1 ÷ their mean length)
	coarseP99Factor = 0.25 // dlock-coarse p99 ÷ the book's coarse p99
)

// heavy reports whether a load is as contended as the book's busiest
// (5 sellers and 5 buyers) or more: the claims about WATCH's collapse, the
// coarse lock's hand-over without a gap and the cost of dlock against the
// book's fine lock are made there, where every row has competition.
func heavy(l Load) bool { return l.Listers >= 5 && l.Buyers >= 5 }

// claims checks rs (cells that ran) against what the experiment shows;
// only the claims whose rows ran are made.
func claims(rs []Result) []claim {
	if len(rs) == 0 {
		return nil
	}
	var out []claim
	var bad []string
	for _, r := range rs {
		if verdict(r) == "FAILED" {
			bad = append(bad, r.Load.String()+" "+r.Variant)
		}
	}
	if len(bad) == 0 {
		out = append(out, claim{holds: true, text: "no money or item was created or lost: the check after every row balanced funds, inventories and the market"})
	} else {
		out = append(out, claim{text: "money or items were created or lost in " + strings.Join(bad, ", ") + ": see the notes above"})
	}

	// The cells of each load, by round: a round's rows ran close together,
	// so the claims compare rows of one round and take the median over
	// the rounds in which every row they need ran.
	var loads []Load
	cells := map[Load]map[int]map[string]Result{}
	rounds := 0
	for _, r := range rs {
		if verdict(r) != "ok" {
			continue // a failed or invalid row says nothing about speed
		}
		if cells[r.Load] == nil {
			cells[r.Load] = map[int]map[string]Result{}
			loads = append(loads, r.Load)
		}
		if cells[r.Load][r.Round] == nil {
			cells[r.Load][r.Round] = map[string]Result{}
		}
		if _, seen := cells[r.Load][r.Round][r.Variant]; !seen {
			cells[r.Load][r.Round][r.Variant] = r
		}
		rounds = max(rounds, r.Round)
	}
	for _, l := range loads {
		add := func(holds bool, format string, args ...any) {
			out = append(out, claim{load: &l, holds: holds, text: fmt.Sprintf(format, args...)})
		}
		// med is the median over l's rounds that ran every variant of
		// need of f's value in the round, and how many rounds it took.
		med := func(f func(round map[string]Result) float64, need ...string) (float64, int) {
			var vs []float64
			for _, round := range cells[l] {
				if !slices.ContainsFunc(need, func(v string) bool { _, ok := round[v]; return !ok }) {
					vs = append(vs, f(round))
				}
			}
			if len(vs) == 0 {
				return 0, 0
			}
			slices.Sort(vs)
			if len(vs)%2 == 1 {
				return vs[len(vs)/2], len(vs)
			}
			return (vs[len(vs)/2-1] + vs[len(vs)/2]) / 2, len(vs)
		}
		// of says over how many rounds a median was taken, if more than one.
		of := func(n int) string {
			if rounds <= 1 {
				return ""
			}
			return fmt.Sprintf(", the median of %s", plural(n, "round"))
		}
		div := func(a, b int64) float64 {
			if b == 0 && a == 0 {
				return 0
			}
			if b == 0 {
				return math.Inf(1)
			}
			return float64(a) / float64(b)
		}

		if r, n := med(func(c map[string]Result) float64 { return div(c[VariantWatch].Retries, c[VariantWatch].Bought) }, VariantWatch); n > 0 {
			add(r > 1,
				"WATCH starts most purchases over: %s restarts per item bought%s (a purchase aborts whenever another client changed the market first)",
				per(r), of(n))
		}
		if heavy(l) {
			if r, n := med(func(c map[string]Result) float64 { return div(c[VariantFine].Bought, c[VariantWatch].Bought) }, VariantWatch, VariantFine); n > 0 {
				add(r >= fineOverWatch,
					"a lock per item beats WATCH under contention: the book's fine lock bought %s as many items as WATCH%s (%g× or more expected: buyers of different items no longer undo each other's work)",
					ratio(r), of(n), fineOverWatch)
			}
		}
		// Only where someone always wants the lock: with fewer workers it
		// is often free because nobody asks for it. With rounds, every
		// figure is the median round's (by its share).
		if dc, n := medianOf(cells[l], VariantDlockCoarse, func(r Result) float64 { return r.CeilingShare }); n > 0 && heavy(l) {
			then := ""
			if cs, m := med(func(c map[string]Result) float64 { return c[VariantCoarse].CeilingShare }, VariantCoarse); m > 0 {
				then = fmt.Sprintf("; the book's coarse lock %s, as its waiters see it free only at their next try, 1 ms apart", pct(cs))
			}
			secs := dc.Duration.Seconds()
			ceiling := 0.0
			if dc.CriticalSection > 0 {
				ceiling = 1 / dc.CriticalSection.Seconds()
			}
			add(dc.LockSections > 0 && dc.CeilingShare >= coarseCeiling,
				"dlock-coarse runs its critical sections one right after another: %s a second (%s of them purchases), %s of the %s a second that sections of their mean length, %s, allow back to back%s (%s or more expected%s)",
				count(int64(float64(dc.LockSections)/secs+0.5)), count(int64(float64(dc.Bought)/secs+0.5)),
				pct(dc.CeilingShare), count(int64(ceiling+0.5)), dur(dc.CriticalSection), of(n), pct(coarseCeiling), then)
		}
		// p99 is of the calls that completed in the row's time: those
		// still waiting at its end, the slowest, are not in it. More than
		// 1 in 100 of them (a row whose waiters hung) leaves p99 saying
		// nothing of the slowest purchases.
		if r, n := med(func(c map[string]Result) float64 {
			return float64(c[VariantDlockCoarse].All.P99) / float64(c[VariantCoarse].All.P99)
		}, VariantDlockCoarse, VariantCoarse); n > 0 {
			dc, _ := medianOf(cells[l], VariantDlockCoarse, func(r Result) float64 { return float64(r.All.P99) })
			coarse, _ := medianOf(cells[l], VariantCoarse, func(r Result) float64 { return float64(r.All.P99) })
			hung := 0
			for _, c := range cells[l] {
				if dc, ok := c[VariantDlockCoarse]; ok && (dc.Calls == 0 || 100*dc.InFlight > dc.Calls) {
					hung++
				}
			}
			unseen := ""
			switch {
			case hung > 0 && rounds <= 1:
				unseen = fmt.Sprintf("; but %d calls were still waiting at the row's end, against %d completed: too many for p99 to show the slowest", dc.InFlight, dc.Calls)
			case hung > 0:
				unseen = fmt.Sprintf("; but in %s of them more than 1 in 100 calls were still waiting at the row's end: too many for p99 to show the slowest", plural(hung, "round"))
			}
			add(hung == 0 && r <= coarseP99Factor,
				"dlock-coarse keeps the slowest purchases short: p99 %s against the book's coarse lock's %s%s (a quarter or less expected: waiters are served in turn, not whoever tries at the right moment)%s",
				dur(dc.All.P99), dur(coarse.All.P99), of(n), unseen)
		}
		if heavy(l) {
			bought, n := med(func(c map[string]Result) float64 { return div(c[VariantDlockFine].Bought, c[VariantFine].Bought) }, VariantDlockFine, VariantFine)
			p99, _ := med(func(c map[string]Result) float64 {
				return float64(c[VariantDlockFine].All.P99) / float64(c[VariantFine].All.P99)
			}, VariantDlockFine, VariantFine)
			if n > 0 {
				df, _ := medianOf(cells[l], VariantDlockFine, func(r Result) float64 { return float64(r.All.P99) })
				fine, _ := medianOf(cells[l], VariantFine, func(r Result) float64 { return float64(r.All.P99) })
				const expected = "(as many or more, with a p99 no longer, expected: it replaces that lock and adds expiry, renewal and fencing)"
				if rounds > 1 {
					add(bought >= 1 && p99 <= 1,
						"dlock costs no purchases: round by round, dlock-fine bought a median %s what the book's fine lock bought, with a p99 a median %s the book's (%s; median p99s %s and %s) "+expected,
						ratio(bought), ratio(p99), plural(n, "round"), dur(df.All.P99), dur(fine.All.P99))
				} else {
					add(bought >= 1 && p99 <= 1,
						"dlock costs no purchases: dlock-fine bought %s what the book's fine lock bought, p99 %s against %s "+expected,
						ratio(bought), dur(df.All.P99), dur(fine.All.P99))
				}
			}
		}
	}
	return out
}

// pct formats a share as a whole percentage.
func pct(f float64) string { return fmt.Sprintf("%.0f%%", 100*f) }

// medianOf returns variant's cell of the round whose f is the median (the
// lower median of an even count) among rounds, and in how many rounds it
// ran (0: none, and the zero Result).
func medianOf(rounds map[int]map[string]Result, variant string, f func(Result) float64) (Result, int) {
	var rs []Result
	for _, c := range rounds {
		if r, ok := c[variant]; ok {
			rs = append(rs, r)
		}
	}
	if len(rs) == 0 {
		return Result{}, 0
	}
	return lowerMedian(rs, f), len(rs)
}

// ratio formats a ratio as "1.23×" (an infinite one: a ÷ 0).
func ratio(r float64) string {
	if math.IsInf(r, 1) {
		return "n/a (÷ 0)"
	}
	return sig3(r) + "×"
}

// per formats restarts per item bought with one decimal (infinite: none
// bought).
func per(r float64) string {
	if math.IsInf(r, 1) {
		return "n/a (nothing bought)"
	}
	return fmt.Sprintf("%.1f", r)
}
