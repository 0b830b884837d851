package market

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// WriteTable prints every column of every cell, the way the book's table
// does (load, variant, listed, bought, purchase retries, average wait per
// purchase) followed by the extra columns, then what each column means, the
// skipped cells, notes, and the claims the run checks (see WriteSummary).
func WriteTable(w io.Writer, rs []Result) {
	cols := []column{
		{head: "load", left: true},
		{head: "variant", left: true},
		{head: "listed"},
		{head: "bought"},
		{head: "retries"},
		{head: "book wait"},
		{head: "gone"},
		{head: "timeouts"},
		{head: "lock fails"},
		{head: "in flight"},
		{head: "ok mean"},
		{head: "ok p50"},
		{head: "ok p99"},
		{head: "all mean"},
		{head: "all p99"},
		{head: "crit sect"},
		{head: "of ceiling"},
		{head: "commands"},
		{head: "ops/s"},
		{head: "zcard"},
		{head: "check", left: true},
	}
	rep := collect(rs)
	var rows [][]string
	for _, r := range rep.ran {
		cmds := count(r.Commands)
		if _, ok := r.CommandCalls["*"]; ok {
			cmds += "†"
		}
		rows = append(rows, []string{
			r.Load.String(), rowName(r),
			count(r.Listed), count(r.Bought), count(r.Retries), dur(r.BookWait),
			count(r.Gone), count(r.Timeouts), count(r.LockFailures), count(r.InFlight),
			dur(r.Success.Mean), dur(r.Success.P50), dur(r.Success.P99),
			dur(r.All.Mean), dur(r.All.P99),
			dashIfZero(r.CriticalSection, dur), dashIfZero(r.CeilingShare, pct),
			cmds, count(int64(r.OpsPerSec + 0.5)), count(r.FinalZCard), verdict(r),
		})
	}
	writeColumns(w, cols, rows)
	if len(rep.ran) > 0 {
		fmt.Fprintln(w)
		legend := append(variantLegend(rep.ran), [][2]string{
			{"load", "sellers/buyers: how many of each ran at once" + roundsNote(rep.rounds)},
			{"listed", "items the sellers put on the market"},
			{"bought", "items bought (higher is better)"},
			{"retries", "WATCH purchases started over because the market changed meanwhile"},
			{"book wait", `buyers × duration ÷ bought: the book's "average wait per purchase"`},
			{"gone", "purchases that found the item sold, or its price changed, once they got to it"},
			{"timeouts", "purchases that gave up after 10 s"},
			{"lock fails", "the book's lock: attempts that found it taken; dlock rows: lock errors"},
			{"in flight", "calls still running at the end of the row, not counted in the other columns"},
			{"ok mean, p50, p99", "time of a successful purchase, lock wait and retries included: the mean; the time half of them, and 99 in 100, took at most"},
			{"all mean, p99", "the same over every purchase call, gone items and timeouts included"},
			{"crit sect", "mean time of one critical section (a listing or a purchase inside its lock), measured inside the lock"},
			{"of ceiling", "coarse rows: critical sections per second ÷ (1 ÷ crit sect), the most one lock allows; 100% is one section right after another"},
			{"commands", "commands Redis ran, those run by scripts included" + daggerNote(rep.ran)},
			{"ops/s", "commands Redis ran per second"},
			{"zcard", "items still on the market at the end"},
			{"check", "ok: no money or item was created or lost; FAILED: something was; INVALID: a seller ran out of items, so the row measured less than it should"},
		}...)
		writeLegend(w, legend)
	}
	rep.writeRemarks(w)
}

// WriteSummary prints a table a person reads at a glance: for each load,
// one line per row that ran with what tells the rows apart (items bought,
// WATCH retries, the book's lock polls, purchase latency, the conservation
// check), then what each row and column means, the skipped rows and notes,
// and the claims the run checks, each marked ✓ (holds) or ✗ (does not).
// Lines stay within 100 columns.
func WriteSummary(w io.Writer, rs []Result) {
	rep := collect(rs)
	// The retries and polls columns only where a row has them.
	hasWatch := slices.ContainsFunc(rep.ran, func(r Result) bool { return r.Variant == VariantWatch })
	hasPolls := slices.ContainsFunc(rep.ran, func(r Result) bool { return specFor(r.Variant).lock == lockFaithful })
	cols := []column{{head: "variant", left: true}, {head: "bought"}}
	if hasWatch {
		cols = append(cols, column{head: "retries"})
	}
	if hasPolls {
		cols = append(cols, column{head: "polls"})
	}
	cols = append(cols, column{head: "p50"}, column{head: "p99"}, column{head: "check", left: true})
	for i, l := range rep.loads {
		if i > 0 {
			fmt.Fprintln(w)
		}
		var rows [][]string
		var d time.Duration
		for _, r := range rep.ran {
			if r.Load != l {
				continue
			}
			d = r.Duration
			row := []string{rowName(r), count(r.Bought)}
			if hasWatch {
				row = append(row, "-")
				if r.Variant == VariantWatch {
					row[len(row)-1] = count(r.Retries)
				}
			}
			if hasPolls {
				row = append(row, "-")
				if specFor(r.Variant).lock == lockFaithful {
					row[len(row)-1] = count(r.LockFailures)
				}
			}
			rows = append(rows, append(row, dur(r.All.P50), dur(r.All.P99), verdict(r)))
		}
		if rep.rounds > 1 {
			fmt.Fprintf(w, "%s, %v per row, each row the median of %d rounds by items bought:\n\n", loadWords(l), d, rep.rounds)
		} else {
			fmt.Fprintf(w, "%s, %v per row:\n\n", loadWords(l), d)
		}
		writeColumns(w, cols, rows)
	}
	if len(rep.ran) > 0 {
		fmt.Fprintln(w)
		bought := "items bought in the row's time (higher is better)"
		if len(rep.loads) == 1 {
			bought = fmt.Sprintf("items bought in %v by %s (higher is better)", rep.ran[0].Duration, plural(rep.loads[0].Buyers, "buyer"))
		}
		legend := append(variantLegend(rep.ran), [2]string{"bought", bought})
		if hasWatch {
			legend = append(legend, [2]string{"retries", "purchases WATCH started over because another client changed the market first"})
		}
		if hasPolls {
			legend = append(legend, [2]string{"polls", "the book's lock: attempts that found the lock taken and tried again 1 ms later, by sellers and buyers"})
		}
		legend = append(legend,
			[2]string{"p50, p99", "time of one purchase, lock wait and retries included: half of the purchases took at most p50, 99 in 100 at most p99"},
			[2]string{"check", "ok: after the row, no money or item was created or lost"})
		writeLegend(w, legend)
	}
	rep.writeRemarks(w)
}

// report is what both tables print besides their rows.
type report struct {
	ran     []Result // the rows to print: each cell that ran, or with rounds its median round
	all     []Result // every cell that ran, every round's
	rounds  int      // the most rounds any cell ran
	loads   []Load   // the loads of ran, in order of first appearance
	skipped []string // one line per reason a cell was skipped
	notes   []string
}

// collect sorts rs into a report.
func collect(rs []Result) report {
	var rep report
	byReason := map[string][]string{} // reason → variants
	var reasons []string
	for _, r := range rs {
		if !r.ran() {
			// Listed once below the table, not as rows of blanks.
			if !slices.Contains(reasons, r.Skipped) {
				reasons = append(reasons, r.Skipped)
			}
			if !slices.Contains(byReason[r.Skipped], r.Variant) {
				byReason[r.Skipped] = append(byReason[r.Skipped], r.Variant)
			}
			continue
		}
		rep.all = append(rep.all, r)
		rep.rounds = max(rep.rounds, r.Round)
		if !slices.Contains(rep.loads, r.Load) {
			rep.loads = append(rep.loads, r.Load)
		}
	}
	for _, r := range rep.all {
		where := fmt.Sprintf("%s %s", r.Load, r.Variant)
		if rep.rounds > 1 {
			where += fmt.Sprintf(" (round %d)", r.Round)
		}
		switch {
		case r.Check != nil || r.CheckError != "":
			rep.notes = append(rep.notes, fmt.Sprintf("%s: check failed: %s", where, r.CheckError))
		case !r.Valid:
			rep.notes = append(rep.notes, fmt.Sprintf("%s: invalid: %s", where, r.Invalid))
		}
		for _, n := range r.Notes {
			rep.notes = append(rep.notes, fmt.Sprintf("%s: %s", where, n))
		}
		if r.ListTimeouts > 0 || r.NoFunds > 0 {
			rep.notes = append(rep.notes, fmt.Sprintf("%s: %d listings timed out, %d purchases lacked funds", where, r.ListTimeouts, r.NoFunds))
		}
	}
	rep.ran = medianRows(rep.all)
	for _, reason := range reasons {
		rep.skipped = append(rep.skipped, fmt.Sprintf("skipped: %s (%s)", strings.Join(byReason[reason], ", "), reason))
	}
	return rep
}

// medianRows returns one row per load and variant of rs, in order of first
// appearance: the cell itself when it ran once, else its median round by
// items bought (the lower median of an even count). A round whose check
// failed is the row shown, so that no failure hides behind a median.
func medianRows(rs []Result) []Result {
	type cellKey struct {
		load    Load
		variant string
	}
	var order []cellKey
	byCell := map[cellKey][]Result{}
	for _, r := range rs {
		k := cellKey{r.Load, r.Variant}
		if byCell[k] == nil {
			order = append(order, k)
		}
		byCell[k] = append(byCell[k], r)
	}
	out := make([]Result, 0, len(order))
	for _, k := range order {
		cells := byCell[k]
		if i := slices.IndexFunc(cells, func(r Result) bool { return verdict(r) == "FAILED" }); i >= 0 {
			out = append(out, cells[i])
			continue
		}
		out = append(out, lowerMedian(cells, func(r Result) float64 { return float64(r.Bought) }))
	}
	return out
}

// lowerMedian returns the cell of rs (not empty) whose f is the median,
// the lower one of an even count.
func lowerMedian(rs []Result, f func(Result) float64) Result {
	sorted := slices.Clone(rs)
	slices.SortStableFunc(sorted, func(a, b Result) int { return cmp.Compare(f(a), f(b)) })
	return sorted[(len(sorted)-1)/2]
}

// writeRemarks prints the skipped cells, the notes and the claims.
func (rep report) writeRemarks(w io.Writer) {
	if len(rep.skipped)+len(rep.notes) > 0 {
		fmt.Fprintln(w)
	}
	for _, s := range rep.skipped {
		writeWrapped(w, "", s, "  ")
	}
	for _, n := range rep.notes {
		writeWrapped(w, "", "note: "+n, "  ")
	}
	cs := claims(rep.all)
	if len(cs) == 0 {
		return
	}
	fmt.Fprintf(w, "\nWhat the run shows (✓ holds, ✗ does not):\n")
	var last *Load
	for _, c := range cs {
		if len(rep.loads) > 1 && c.load != nil && (last == nil || *last != *c.load) {
			last = c.load
			fmt.Fprintf(w, "  %s:\n", loadWords(*c.load))
		}
		mark := "  ✓ "
		if !c.holds {
			mark = "  ✗ "
		}
		writeWrapped(w, mark, c.text, "    ")
	}
	if rep.rounds <= 1 && slices.ContainsFunc(cs, func(c claim) bool { return c.load != nil && !c.holds }) {
		fmt.Fprintln(w)
		writeWrapped(w, "", "One round compares rows that ran seconds apart, and a machine's load can change meanwhile: --rounds 5 runs the table five times and compares the rows round by round.", "")
	}
}

// roundsNote says, in the full table's legend, which round a row shows.
func roundsNote(rounds int) string {
	if rounds <= 1 {
		return ""
	}
	return fmt.Sprintf("; each row is the median of %d rounds by items bought (--json has every round)", rounds)
}

// verdict is a cell's check column.
func verdict(r Result) string {
	switch {
	case r.Check != nil || r.CheckError != "":
		return "FAILED"
	case !r.Valid:
		return "INVALID"
	}
	return "ok"
}

// rowName is a cell's variant, starred when the book has no such row.
func rowName(r Result) string {
	if r.Improved {
		return r.Variant + " *"
	}
	return r.Variant
}

// variantLegend explains each variant among rs, in table order, and the
// star of the improved rows.
func variantLegend(rs []Result) [][2]string {
	var out [][2]string
	improved := false
	for _, v := range variantSpecs {
		if slices.ContainsFunc(rs, func(r Result) bool { return r.Variant == v.name }) {
			out = append(out, [2]string{v.name, v.about})
			improved = improved || !v.book
		}
	}
	if improved {
		out = append(out, [2]string{"*", "a row the book does not have"})
	}
	return out
}

// daggerNote explains the † of a server without per-command counts.
func daggerNote(rs []Result) string {
	for _, r := range rs {
		if _, ok := r.CommandCalls["*"]; ok {
			return " († from INFO stats: this server has no INFO commandstats)"
		}
	}
	return ""
}

// legendWidth is the width lines of the legends and claims wrap at.
const legendWidth = 100

// writeLegend prints term–meaning pairs, the meanings aligned and wrapped
// within legendWidth.
func writeLegend(w io.Writer, entries [][2]string) {
	width := 0
	for _, e := range entries {
		width = max(width, len([]rune(e[0])))
	}
	for _, e := range entries {
		head := e[0] + strings.Repeat(" ", width+2-len([]rune(e[0])))
		writeWrapped(w, head, e[1], strings.Repeat(" ", width+2))
	}
}

// writeWrapped prints lead followed by s, s broken at spaces so that lines
// stay within legendWidth runes; lines after the first begin with indent.
func writeWrapped(w io.Writer, lead, s, indent string) {
	line, empty := lead, true
	for _, word := range strings.Fields(s) {
		if !empty && len([]rune(line))+1+len([]rune(word)) > legendWidth {
			fmt.Fprintln(w, line)
			line, empty = indent, true
		}
		if !empty {
			line += " "
		}
		line, empty = line+word, false
	}
	fmt.Fprintln(w, line)
}

// loadWords spells a load out: "5 sellers and 5 buyers".
func loadWords(l Load) string {
	return plural(l.Listers, "seller") + " and " + plural(l.Buyers, "buyer")
}

// plural is "1 buyer", "5 buyers".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// column is one column of a plain-text table.
type column struct {
	head string
	left bool // left-aligned (text); numbers are right-aligned
}

// writeColumns prints rows under cols, padded to the widest cell, two spaces
// apart. Widths count runes, so "µs" and "×" line up.
func writeColumns(w io.Writer, cols []column, rows [][]string) {
	width := make([]int, len(cols))
	for i, c := range cols {
		width[i] = len([]rune(c.head))
	}
	for _, row := range rows {
		for i, cell := range row {
			width[i] = max(width[i], len([]rune(cell)))
		}
	}
	line := func(cells []string) {
		var b strings.Builder
		for i, cell := range cells {
			pad := strings.Repeat(" ", width[i]-len([]rune(cell)))
			if i > 0 {
				b.WriteString("  ")
			}
			if cols[i].left {
				b.WriteString(cell)
				if i < len(cells)-1 {
					b.WriteString(pad)
				}
			} else {
				b.WriteString(pad)
				b.WriteString(cell)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
	heads := make([]string, len(cols))
	for i, c := range cols {
		heads[i] = c.head
	}
	line(heads)
	for _, row := range rows {
		line(row)
	}
}

// count formats n with thousands separators.
func count(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// dur formats a latency with three significant digits ("-" for none).
func dur(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Microsecond:
		return fmt.Sprintf("%dns", d.Nanoseconds())
	case d < time.Millisecond:
		return sig3(float64(d)/float64(time.Microsecond)) + "µs"
	case d < time.Second:
		return sig3(float64(d)/float64(time.Millisecond)) + "ms"
	default:
		return sig3(d.Seconds()) + "s"
	}
}

// sig3 formats v (≥ 1) with about three significant digits, never in
// exponent form.
func sig3(v float64) string {
	switch {
	case v >= 100:
		return strconv.FormatFloat(v, 'f', 0, 64)
	case v >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	default:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
}

// WriteJSON writes the results as an indented JSON array, one object per
// cell. Durations are integer nanoseconds (fields ending in _ns); a failed
// check is in check_error.
func WriteJSON(w io.Writer, rs []Result) error {
	out := make([]Result, len(rs))
	for i, r := range rs {
		if r.Check != nil && r.CheckError == "" {
			r.CheckError = r.Check.Error()
		}
		out[i] = r
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// dashIfZero formats v with f, or "-" for zero (a measure the row does not
// have).
func dashIfZero[T comparable](v T, f func(T) string) string {
	var zero T
	if v == zero {
		return "-"
	}
	return f(v)
}
