package market

import (
	"fmt"
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

	var loads []Load
	cells := map[Load]map[string]Result{}
	for _, r := range rs {
		if verdict(r) != "ok" {
			continue // a failed or invalid row says nothing about speed
		}
		if cells[r.Load] == nil {
			cells[r.Load] = map[string]Result{}
			loads = append(loads, r.Load)
		}
		if _, seen := cells[r.Load][r.Variant]; !seen {
			cells[r.Load][r.Variant] = r
		}
	}
	for _, l := range loads {
		get := func(v string) (Result, bool) { r, ok := cells[l][v]; return r, ok }
		add := func(holds bool, format string, args ...any) {
			out = append(out, claim{load: &l, holds: holds, text: fmt.Sprintf(format, args...)})
		}
		watch, hasWatch := get(VariantWatch)
		coarse, hasCoarse := get(VariantCoarse)
		fine, hasFine := get(VariantFine)
		dc, hasDC := get(VariantDlockCoarse)
		df, hasDF := get(VariantDlockFine)

		if hasWatch {
			add(watch.Retries > watch.Bought,
				"WATCH starts most purchases over: %s restarts per item bought (a purchase aborts whenever another client changed the market first)",
				per(watch.Retries, watch.Bought))
		}
		if hasWatch && hasFine && heavy(l) {
			add(float64(fine.Bought) >= fineOverWatch*float64(watch.Bought),
				"a lock per item beats WATCH under contention: the book's fine lock bought %s as many items as WATCH (%g× or more expected: buyers of different items no longer undo each other's work)",
				ratio(fine.Bought, watch.Bought), fineOverWatch)
		}
		if hasDC && heavy(l) {
			// Only where someone always wants the lock: with fewer
			// workers it is often free because nobody asks for it.
			then := ""
			if hasCoarse {
				then = fmt.Sprintf("; the book's coarse lock %s, as its waiters see it free only at their next try, 1 ms apart", pct(coarse.CeilingShare))
			}
			secs := dc.Duration.Seconds()
			ceiling := 0.0
			if dc.CriticalSection > 0 {
				ceiling = 1 / dc.CriticalSection.Seconds()
			}
			add(dc.LockSections > 0 && dc.CeilingShare >= coarseCeiling,
				"dlock-coarse runs its critical sections one right after another: %s a second (%s of them purchases), %s of the %s a second that sections of their mean length, %s, allow back to back (%s or more expected%s)",
				count(int64(float64(dc.LockSections)/secs+0.5)), count(int64(float64(dc.Bought)/secs+0.5)),
				pct(dc.CeilingShare), count(int64(ceiling+0.5)), dur(dc.CriticalSection), pct(coarseCeiling), then)
		}
		if hasDC && hasCoarse {
			// p99 is of the calls that completed in the row's time: those
			// still waiting at its end, the slowest, are not in it. More
			// than 1 in 100 of them (a row whose waiters hung) leaves p99
			// saying nothing of the slowest purchases.
			seen, unseen := dc.Calls > 0 && 100*dc.InFlight <= dc.Calls, ""
			if !seen {
				unseen = fmt.Sprintf("; but %d calls were still waiting at the row's end, against %d completed: too many for p99 to show the slowest", dc.InFlight, dc.Calls)
			}
			add(seen && float64(dc.All.P99) <= coarseP99Factor*float64(coarse.All.P99),
				"dlock-coarse keeps the slowest purchases short: p99 %s against the book's coarse lock's %s (a quarter or less expected: waiters are served in turn, not whoever tries at the right moment)%s",
				dur(dc.All.P99), dur(coarse.All.P99), unseen)
		}
		if hasDF && hasFine && heavy(l) {
			add(df.Bought >= fine.Bought && df.All.P99 <= fine.All.P99,
				"dlock costs no purchases: dlock-fine bought %s what the book's fine lock bought, p99 %s against %s (as many or more, with a p99 no longer, expected: it replaces that lock and adds expiry, renewal and fencing)",
				ratio(df.Bought, fine.Bought), dur(df.All.P99), dur(fine.All.P99))
		}
	}
	return out
}

// pct formats a share as a whole percentage.
func pct(f float64) string { return fmt.Sprintf("%.0f%%", 100*f) }

// per formats a ÷ b with one decimal, "n/a" when b is 0.
func per(a, b int64) string {
	if b == 0 {
		return "n/a (nothing bought)"
	}
	return fmt.Sprintf("%.1f", float64(a)/float64(b))
}
