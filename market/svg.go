package market

import (
	"bufio"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// variantColors gives each variant a fixed color: warm for the book's rows,
// cool for the improved ones.
var variantColors = map[string]string{
	VariantWatch:         "#d62728",
	VariantCoarse:        "#ff7f0e",
	VariantFine:          "#e6b800",
	VariantDlockCoarse:   "#1f77b4",
	VariantDlockFine:     "#17becf",
	VariantDlockFairFine: "#9467bd",
	VariantDlockMulti:    "#393b79",
	VariantLua:           "#2ca02c",
}

// Chart geometry, in SVG user units (pixels).
const (
	svgBarW     = 16.0
	svgGroupGap = 36.0
	svgLeft     = 80.0 // room for the y axis labels
	svgRight    = 230.0
	svgPanelH   = 260.0
	svgTitleH   = 70.0
	svgPanelGap = 110.0
	svgBottom   = 40.0
	// svgHeadroom is how far above the largest value an axis reaches, so
	// that the labels above the bars stay inside the panel.
	svgHeadroom = 4.0
)

// WriteSVG draws the results as a standalone SVG image with two panels,
// each grouping bars by load with one bar per variant: purchases completed
// (log scale, value on each bar) and purchase latency over all calls (bar:
// mean, whisker: p99; log scale). Skipped cells are left out. It returns an
// error if no cell ran or w fails.
func WriteSVG(w io.Writer, rs []Result) error {
	var loads []Load
	var variants []string
	cells := map[string]Result{}
	var cellDur time.Duration
	pick := ""
	for _, r := range medianRows(rs) { // with rounds, each cell's median round, as the tables show
		if !r.ran() {
			continue
		}
		cellDur, pick = r.Duration, r.Pick
		key := r.Load.String() + " " + r.Variant
		if _, ok := cells[key]; ok {
			continue
		}
		cells[key] = r
		if !slices.Contains(loads, r.Load) {
			loads = append(loads, r.Load)
		}
		if !slices.Contains(variants, r.Variant) {
			variants = append(variants, r.Variant)
		}
	}
	if len(cells) == 0 {
		return errors.New("market: no results to chart")
	}
	// Keep variants in table order.
	ordered := variants[:0:0]
	for _, v := range Variants() {
		if slices.Contains(variants, v) {
			ordered = append(ordered, v)
		}
	}
	variants = ordered

	// Spread the groups over at least a readable width.
	plotW := max(float64(len(loads))*(float64(len(variants))*svgBarW+svgGroupGap), 360)
	groupW := plotW / float64(len(loads))
	width := svgLeft + plotW + svgRight
	height := svgTitleH + 2*svgPanelH + svgPanelGap + svgBottom + 30

	bw := bufio.NewWriter(w)
	s := &svgWriter{w: bw}
	s.printf(`<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n", width, height, width, height)
	s.printf(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	s.text(width/2, 28, "middle", 18, "bold", "Marketplace experiment (Redis in Action, ch. 6)")
	s.text(width/2, 50, "middle", 12, "", fmt.Sprintf("%v per cell, pick = %s; groups are loads (listers/buyers), one bar per variant", cellDur, pick))

	cell := func(l Load, v string) (Result, bool) {
		r, ok := cells[l.String()+" "+v]
		return r, ok
	}

	// Panel 1: purchases.
	top1 := svgTitleH + 20
	maxBought := 1.0
	for _, r := range cells {
		maxBought = max(maxBought, float64(r.Bought))
	}
	// Headroom above the tallest bar for its label.
	ax1 := logAxis{lo: 1, hi: math.Pow(10, math.Ceil(math.Log10(maxBought*svgHeadroom)))}
	s.panel(top1, plotW, "Purchases completed before the deadline (log scale)", ax1, countTick)
	for gi, l := range loads {
		x0 := svgLeft + float64(gi)*groupW + (groupW-float64(len(variants))*svgBarW)/2
		for vi, v := range variants {
			r, ok := cell(l, v)
			if !ok {
				continue
			}
			x := x0 + float64(vi)*svgBarW
			y := ax1.y(float64(r.Bought), top1)
			s.bar(x, y, top1+svgPanelH, variantColors[v], fmt.Sprintf("%s %s: %s bought", l, v, count(r.Bought)))
			s.vtext(x+svgBarW/2+3, y-4, shortCount(r.Bought))
		}
		s.text(x0+float64(len(variants))*svgBarW/2, top1+svgPanelH+18, "middle", 12, "bold", l.String())
	}

	// Panel 2: latency.
	top2 := top1 + svgPanelH + svgPanelGap
	lo, hi := math.Inf(1), 0.0
	for _, r := range cells {
		for _, d := range []time.Duration{r.All.Mean, r.All.P99} {
			if d > 0 {
				lo = min(lo, d.Seconds())
				hi = max(hi, d.Seconds())
			}
		}
	}
	if hi == 0 {
		lo, hi = 1e-5, 1e-3
	}
	ax2 := logAxis{lo: math.Pow(10, math.Floor(math.Log10(lo))), hi: math.Pow(10, math.Ceil(math.Log10(hi*svgHeadroom)))}
	s.panel(top2, plotW, "Purchase latency, all calls (bar: mean, whisker: p99; log scale)", ax2, secondsTick)
	for gi, l := range loads {
		x0 := svgLeft + float64(gi)*groupW + (groupW-float64(len(variants))*svgBarW)/2
		for vi, v := range variants {
			r, ok := cell(l, v)
			if !ok || r.All.Mean <= 0 {
				continue
			}
			x := x0 + float64(vi)*svgBarW
			y := ax2.y(r.All.Mean.Seconds(), top2)
			s.bar(x, y, top2+svgPanelH, variantColors[v], fmt.Sprintf("%s %s: mean %s, p99 %s", l, v, dur(r.All.Mean), dur(r.All.P99)))
			yp := ax2.y(r.All.P99.Seconds(), top2)
			cx := x + svgBarW/2
			s.printf(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333" stroke-width="1.2"/>`+"\n", cx, y, cx, yp)
			s.printf(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#333" stroke-width="1.2"/>`+"\n", cx-4, yp, cx+4, yp)
			s.vtext(cx+3, yp-4, dur(r.All.P99))
		}
		s.text(x0+float64(len(variants))*svgBarW/2, top2+svgPanelH+18, "middle", 12, "bold", l.String())
	}

	// Legend.
	lx := svgLeft + plotW + 24
	ly := top1 + 10
	s.text(lx, ly, "start", 12, "bold", "variant")
	for i, v := range variants {
		y := ly + 14 + float64(i)*20
		s.printf(`<rect x="%.1f" y="%.1f" width="14" height="14" fill="%s"/>`+"\n", lx, y, variantColors[v])
		label := v
		if sp := specFor(v); sp != nil && !sp.book {
			label += " (improved)"
		} else {
			label += " (book)"
		}
		s.text(lx+20, y+11, "start", 12, "", label)
	}
	s.printf("</svg>\n")
	if s.err != nil {
		return s.err
	}
	return bw.Flush()
}

// logAxis maps values in [lo, hi] to a panel's height on a log scale.
type logAxis struct{ lo, hi float64 }

// y returns the y coordinate of v in a panel whose top is at top; values
// below lo sit on the baseline.
func (a logAxis) y(v, top float64) float64 {
	v = max(v, a.lo)
	f := (math.Log10(v) - math.Log10(a.lo)) / (math.Log10(a.hi) - math.Log10(a.lo))
	return top + svgPanelH*(1-min(f, 1))
}

// svgWriter writes SVG elements and remembers the first write error.
type svgWriter struct {
	w   io.Writer
	err error
}

func (s *svgWriter) printf(format string, args ...any) {
	if s.err == nil {
		_, s.err = fmt.Fprintf(s.w, format, args...)
	}
}

// text writes a text element; anchor is start, middle or end.
func (s *svgWriter) text(x, y float64, anchor string, size float64, weight, body string) {
	w := ""
	if weight != "" {
		w = fmt.Sprintf(` font-weight="%s"`, weight)
	}
	s.printf(`<text x="%.1f" y="%.1f" text-anchor="%s" font-size="%.0f"%s>%s</text>`+"\n", x, y, anchor, size, w, esc(body))
}

// vtext writes a small label reading upwards from (x, y).
func (s *svgWriter) vtext(x, y float64, body string) {
	s.printf(`<text x="%.1f" y="%.1f" font-size="10" transform="rotate(-90 %.1f %.1f)">%s</text>`+"\n", x, y, x, y, esc(body))
}

// bar draws one bar from y down to base, with a tooltip.
func (s *svgWriter) bar(x, y, base float64, color, title string) {
	s.printf(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" stroke="white" stroke-width="1"><title>%s</title></rect>`+"\n",
		x, y, svgBarW, max(base-y, 0), color, esc(title))
}

// panel draws a panel's title, frame and log-scale grid with tick labels.
func (s *svgWriter) panel(top, plotW float64, title string, ax logAxis, tick func(float64) string) {
	s.text(svgLeft, top-12, "start", 13, "bold", title)
	s.printf(`<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#fafafa" stroke="#999"/>`+"\n", svgLeft, top, plotW, svgPanelH)
	for p := math.Log10(ax.lo); p <= math.Log10(ax.hi)+1e-9; p++ {
		v := math.Pow(10, p)
		y := ax.y(v, top)
		s.printf(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", svgLeft, y, svgLeft+plotW, y)
		s.text(svgLeft-6, y+4, "end", 11, "", tick(v))
	}
}

// countTick labels a power of ten as a count: 1, 10, 100, 1k, 10k, ...
func countTick(v float64) string {
	switch {
	case v >= 1e9:
		return fmt.Sprintf("%.0fG", v/1e9)
	case v >= 1e6:
		return fmt.Sprintf("%.0fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.0fk", v/1e3)
	default:
		return fmt.Sprintf("%.0f", v)
	}
}

// secondsTick labels a power of ten of seconds: 10µs, 1ms, 1s, ...
func secondsTick(v float64) string {
	for _, u := range []struct {
		scale float64
		name  string
	}{{1, "s"}, {1e-3, "ms"}, {1e-6, "µs"}} {
		if v >= u.scale*0.999 {
			return strconv.FormatFloat(math.Round(v/u.scale), 'f', -1, 64) + u.name
		}
	}
	return strconv.FormatFloat(v*1e9, 'f', -1, 64) + "ns"
}

// shortCount abbreviates n for a bar label: 950, 12.3k, 1.5M.
func shortCount(n int64) string {
	f := float64(n)
	switch {
	case f >= 1e6:
		return sig3(f/1e6) + "M"
	case f >= 1e4:
		return sig3(f/1e3) + "k"
	default:
		return count(n)
	}
}

// esc escapes s for XML character data and attribute values.
func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}
