package market

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"
)

// WriteTable prints the results the way the book's table does (load,
// variant, listed, bought, purchase retries, average wait per purchase),
// followed by the extra columns, the rows' verdicts, and the ratios that
// the experiment targets, for each load where both rows ran.
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
		{head: "commands"},
		{head: "ops/s"},
		{head: "zcard"},
		{head: "check", left: true},
	}
	var rows [][]string
	var notes, reasons []string
	skipped := map[string][]string{} // reason → variants
	improved := false
	for _, r := range rs {
		name := r.Variant
		if r.Improved {
			name += " *"
			improved = true
		}
		if !r.ran() {
			// Listed once below the table, not as rows of blanks.
			if !slices.Contains(skipped[r.Skipped], r.Variant) {
				skipped[r.Skipped] = append(skipped[r.Skipped], r.Variant)
			}
			if !slices.Contains(reasons, r.Skipped) {
				reasons = append(reasons, r.Skipped)
			}
			continue
		}
		verdict := "ok"
		switch {
		case r.Check != nil || r.CheckError != "":
			verdict = "FAILED"
			notes = append(notes, fmt.Sprintf("%s %s: check failed: %s", r.Load, r.Variant, r.CheckError))
		case !r.Valid:
			verdict = "INVALID"
			notes = append(notes, fmt.Sprintf("%s %s: invalid: %s", r.Load, r.Variant, r.Invalid))
		}
		for _, n := range r.Notes {
			notes = append(notes, fmt.Sprintf("%s %s: %s", r.Load, r.Variant, n))
		}
		if r.ListTimeouts > 0 || r.NoFunds > 0 {
			notes = append(notes, fmt.Sprintf("%s %s: %d listings timed out, %d purchases lacked funds", r.Load, r.Variant, r.ListTimeouts, r.NoFunds))
		}
		cmds, ops := count(r.Commands), count(int64(r.OpsPerSec+0.5))
		if _, ok := r.CommandCalls["*"]; ok {
			cmds += "†"
		}
		rows = append(rows, []string{
			r.Load.String(), name,
			count(r.Listed), count(r.Bought), count(r.Retries), dur(r.BookWait),
			count(r.Gone), count(r.Timeouts), count(r.LockFailures), count(r.InFlight),
			dur(r.Success.Mean), dur(r.Success.P50), dur(r.Success.P99),
			dur(r.All.Mean), dur(r.All.P99),
			cmds, ops, count(r.FinalZCard), verdict,
		})
	}
	writeColumns(w, cols, rows)

	if len(rs) > 0 {
		fmt.Fprintf(w, "\nbook wait = buyers × duration ÷ bought (the book's \"average wait per purchase\"); latencies are per purchase call, lock wait and retries included.\n")
		if improved {
			fmt.Fprintf(w, "* improved row, not in the book.\n")
		}
		for _, r := range rs {
			if _, ok := r.CommandCalls["*"]; ok {
				fmt.Fprintf(w, "† total commands from INFO stats (the server has no INFO commandstats).\n")
				break
			}
		}
	}
	for _, reason := range reasons {
		fmt.Fprintf(w, "skipped: %s (%s)\n", strings.Join(skipped[reason], ", "), reason)
	}
	for _, n := range notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	if shape := shapeLines(rs); len(shape) > 0 {
		fmt.Fprintf(w, "\nshape against the targets:\n")
		for _, s := range shape {
			fmt.Fprintf(w, "  %s\n", s)
		}
	}
}

// shapeLines compares rows of the same load against the targets.
func shapeLines(rs []Result) []string {
	var out []string
	var loads []Load
	byKey := map[string]Result{}
	for _, r := range rs {
		if !r.ran() {
			continue
		}
		key := r.Load.String() + " " + r.Variant
		if _, seen := byKey[key]; !seen {
			byKey[key] = r
		}
		known := false
		for _, l := range loads {
			known = known || l == r.Load
		}
		if !known {
			loads = append(loads, r.Load)
		}
	}
	for _, l := range loads {
		get := func(v string) (Result, bool) {
			r, ok := byKey[l.String()+" "+v]
			return r, ok
		}
		watch, hasWatch := get(VariantWatch)
		coarse, hasCoarse := get(VariantCoarse)
		fine, hasFine := get(VariantFine)
		dc, hasDC := get(VariantDlockCoarse)
		df, hasDF := get(VariantDlockFine)
		lua, hasLua := get(VariantLua)
		if hasWatch {
			out = append(out, fmt.Sprintf("%s: WATCH retries per purchase %s (book: far above 1)", l, ratio(watch.Retries, watch.Bought)))
		}
		if hasWatch && hasFine {
			out = append(out, fmt.Sprintf("%s: fine lock bought %s WATCH's (target at 5/5: ≥ 10×)", l, ratio(fine.Bought, watch.Bought)))
		}
		if hasWatch && hasCoarse {
			out = append(out, fmt.Sprintf("%s: coarse lock bought %s WATCH's", l, ratio(coarse.Bought, watch.Bought)))
		}
		if hasCoarse && hasDC {
			out = append(out, fmt.Sprintf("%s: dlock-coarse bought %s the coarse lock's, p99 %s of it (target at 5/5: ≥ 3×, ≤ 0.25×)",
				l, ratio(dc.Bought, coarse.Bought), ratio(int64(dc.All.P99), int64(coarse.All.P99))))
		}
		if hasFine && hasDF {
			out = append(out, fmt.Sprintf("%s: dlock-fine bought %s the fine lock's, p99 %s (target at 5/5: ≥ 1.5×, ≤ 2ms)",
				l, ratio(df.Bought, fine.Bought), dur(df.All.P99)))
		}
		if hasLua && hasDF {
			out = append(out, fmt.Sprintf("%s: dlock-fine bought %s of lua's (the round-trip floor)", l, percent(df.Bought, lua.Bought)))
		}
	}
	return out
}

func ratio(a, b int64) string {
	if b == 0 {
		if a == 0 {
			return "n/a (0 ÷ 0)"
		}
		return fmt.Sprintf("%s ÷ 0", count(a))
	}
	return fmt.Sprintf("%.2f×", float64(a)/float64(b))
}

func percent(a, b int64) string {
	if b == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.0f%%", 100*float64(a)/float64(b))
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
