package dlock_test

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
)

// TestObserveChart draws docs/observability.svg: what a dashboard of
// dlock's metrics shows under contention. Two Clients (two processes'
// worth) lock one hot name in default mode, each waiter holding it 1ms,
// in four phases of a different number of waiters; every 250ms the
// metrics are collected, as a Prometheus scrape would, and the chart
// plots acquire-duration quantiles interpolated within the histogram's
// buckets (as PromQL's histogram_quantile does), the rates of
// acquisitions, contentions, hand-overs and passes, and the waiters
// gauge. It runs only when DLOCK_OBS_CHART names the file to write:
//
//	DLOCK_OBS_CHART=docs/observability.svg go test -run TestObserveChart -count=1 .
func TestObserveChart(t *testing.T) {
	out := os.Getenv("DLOCK_OBS_CHART")
	if out == "" {
		t.Skip("set DLOCK_OBS_CHART to the SVG file to write")
	}
	s := redistest.Start(t)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	var cs []*dlock.Client
	for range 2 {
		c, _ := newClient(t, s, dlock.WithMeterProvider(mp))
		cs = append(cs, c)
	}
	phases := []int{2, 8, 16, 4} // waiters per Client
	const phase, tick, hold = 4 * time.Second, 250 * time.Millisecond, time.Millisecond

	start := time.Now()
	var samples []chartSample
	prev, prevAt := scrape(t, reader), time.Duration(0)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, n := range phases {
			ctx, cancel := context.WithTimeout(context.Background(), phase)
			var wg sync.WaitGroup
			for _, c := range cs {
				for range n {
					wg.Go(func() {
						m := c.Mutex("chart/hot")
						for ctx.Err() == nil {
							l, err := m.Lock(ctx)
							if err != nil {
								return
							}
							time.Sleep(hold)
							_ = l.Unlock(context.Background())
						}
					})
				}
			}
			wg.Wait()
			cancel()
		}
	}()
	ticker := time.NewTicker(tick)
	defer ticker.Stop()
	for running := true; running; {
		select {
		case <-done:
			running = false
		case <-ticker.C:
		}
		cur, at := scrape(t, reader), time.Since(start)
		samples = append(samples, cur.since(prev, at, at-prevAt))
		prev, prevAt = cur, at
	}
	var load string
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		load = strings.Fields(string(b))[0]
	}
	caption := [2]string{
		fmt.Sprintf("2 Clients, one name, default mode, 1ms holds; %v waiters per Client in phases of %v; scraped every %v", phases, phase, tick),
		fmt.Sprintf("TestObserveChart at commit %s, %s, %d CPUs, 1-minute load %s at the end, %s", commit(), runtime.Version(), runtime.NumCPU(), load, time.Now().UTC().Format("2006-01-02")),
	}
	svg := chartSVG(samples, phases, phase, caption)
	if err := os.WriteFile(out, []byte(svg), 0o644); err != nil {
		t.Fatal(err)
	}
	for i, n := range phases {
		var acq, cont, p50, p99 []float64
		for _, sm := range samples {
			if sm.at > time.Duration(i)*phase+time.Second && sm.at <= time.Duration(i+1)*phase {
				acq, cont = append(acq, sm.acquired), append(cont, sm.contentions)
				p50, p99 = append(p50, sm.q[0]), append(p99, sm.q[2])
			}
		}
		t.Logf("phase %d (%d waiters): acquisitions/s %.0f, contentions/s %.0f, p50 %.1fms, p99 %.1fms (medians over the phase's scrapes after its first second)",
			i+1, 2*n, median(acq), median(cont), 1000*median(p50), 1000*median(p99))
	}
}

// commit names the checked-out commit, with "-dirty" if files differ.
func commit() string {
	out, err := exec.Command("git", "describe", "--always", "--dirty", "--abbrev=7").Output()
	if err != nil {
		return "unknown"
	}
	return strings.TrimSpace(string(out))
}

// scraped is one collection: cumulative values.
type scraped struct {
	bounds   []float64
	buckets  []uint64 // acquire.duration of Lock calls that acquired, cumulative per bucket
	acquired uint64
	counts   map[string]int64 // counters
	waiters  int64
}

func scrape(t *testing.T, r *sdkmetric.ManualReader) scraped {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	s := scraped{counts: map[string]int64{}}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Histogram[float64]:
				if m.Name != "dlock.acquire.duration" {
					continue
				}
				for _, p := range d.DataPoints {
					if v, _ := p.Attributes.Value("dlock.outcome"); v.AsString() != "acquired" {
						continue
					}
					if s.buckets == nil {
						s.bounds, s.buckets = p.Bounds, make([]uint64, len(p.BucketCounts))
					}
					for i, c := range p.BucketCounts {
						s.buckets[i] += c
					}
					s.acquired += p.Count
				}
			case metricdata.Sum[int64]:
				for _, p := range d.DataPoints {
					if m.Name == "dlock.waiters" {
						s.waiters += p.Value
					} else {
						s.counts[m.Name] += p.Value
					}
				}
			}
		}
	}
	return s
}

// chartSample is one scrape interval.
type chartSample struct {
	at                                       time.Duration
	q                                        [3]float64 // p50, p90, p99 of acquire.duration, s
	acquired, contentions, handovers, passes float64    // per second
	waiters                                  float64
}

// since is the interval from prev, interval long, to s, taken at at.
func (s scraped) since(prev scraped, at, interval time.Duration) chartSample {
	dt := interval.Seconds()
	sm := chartSample{at: at, waiters: float64(s.waiters)}
	rate := func(name string) float64 { return float64(s.counts[name]-prev.counts[name]) / dt }
	sm.acquired = float64(s.acquired-prev.acquired) / dt
	sm.contentions, sm.handovers, sm.passes = rate("dlock.contentions"), rate("dlock.handovers"), rate("dlock.passes")
	delta := make([]uint64, len(s.buckets))
	for i := range s.buckets {
		delta[i] = s.buckets[i]
		if i < len(prev.buckets) {
			delta[i] -= prev.buckets[i]
		}
	}
	for i, q := range []float64{0.5, 0.9, 0.99} {
		sm.q[i] = quantile(q, s.bounds, delta)
	}
	return sm
}

// quantile interpolates the q-quantile linearly within its bucket, as
// PromQL's histogram_quantile does (NaN without observations).
func quantile(q float64, bounds []float64, counts []uint64) float64 {
	var total uint64
	for _, c := range counts {
		total += c
	}
	if total == 0 {
		return math.NaN()
	}
	rank := q * float64(total)
	var seen float64
	for i, c := range counts {
		if seen+float64(c) >= rank && c > 0 {
			lo := 0.0
			if i > 0 {
				lo = bounds[i-1]
			}
			if i == len(bounds) { // the +Inf bucket: its lower bound
				return lo
			}
			return lo + (bounds[i]-lo)*(rank-seen)/float64(c)
		}
		seen += float64(c)
	}
	return bounds[len(bounds)-1]
}

func median(xs []float64) float64 {
	var v []float64
	for _, x := range xs {
		if !math.IsNaN(x) {
			v = append(v, x)
		}
	}
	if len(v) == 0 {
		return math.NaN()
	}
	for i := range v { // insertion sort: a few dozen values
		for j := i; j > 0 && v[j] < v[j-1]; j-- {
			v[j], v[j-1] = v[j-1], v[j]
		}
	}
	return v[len(v)/2]
}

// chartSVG draws the samples: three panels over time.
func chartSVG(samples []chartSample, phases []int, phase time.Duration, caption [2]string) string {
	const w, left, right, panelH, gap, top = 760.0, 80.0, 150.0, 170.0, 60.0, 84.0
	plotW := w - left - right
	total := (time.Duration(len(phases)) * phase).Seconds()
	h := top + 3*panelH + 3*gap + 10
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="Helvetica, Arial, sans-serif" font-size="12">`+"\n", w, h, w, h)
	b.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")
	fmt.Fprintf(&b, `<text x="%.1f" y="26" text-anchor="middle" font-size="18" font-weight="bold">dlock metrics under contention: one hot lock</text>`+"\n", w/2)
	for i, line := range caption {
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle" font-size="11">%s</text>`+"\n", w/2, 44+14*i, escape(line))
	}
	x := func(sec float64) float64 { return left + plotW*sec/total }
	type series struct {
		name, color string
		v           func(chartSample) float64
		dash        bool
	}
	panels := []struct {
		title string
		log   bool
		unit  float64
		ser   []series
	}{
		{"dlock.acquire.duration of Lock calls that acquired (ms, log scale): quantiles per scrape", true, 1000, []series{
			{"p50", "#1f77b4", func(s chartSample) float64 { return s.q[0] }, false},
			{"p90", "#ff7f0e", func(s chartSample) float64 { return s.q[1] }, false},
			{"p99", "#d62728", func(s chartSample) float64 { return s.q[2] }, false},
		}},
		{"rates per second", false, 1, []series{
			{"acquired", "#2ca02c", func(s chartSample) float64 { return s.acquired }, true},
			{"contentions", "#d62728", func(s chartSample) float64 { return s.contentions }, false},
			{"handovers", "#9467bd", func(s chartSample) float64 { return s.handovers }, false},
			{"passes", "#17becf", func(s chartSample) float64 { return s.passes }, false},
		}},
		{"dlock.waiters (gauge, both Clients)", false, 1, []series{
			{"waiters", "#8c564b", func(s chartSample) float64 { return s.waiters }, false},
		}},
	}
	for pi, p := range panels {
		y0 := top + float64(pi)*(panelH+gap) + 20
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="13" font-weight="bold">%s</text>`+"\n", left, y0-8, escape(p.title))
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#fafafa" stroke="#999"/>`+"\n", left, y0, plotW, panelH)
		for i, n := range phases { // phase bands
			x0, x1 := x(float64(i)*phase.Seconds()), x(float64(i+1)*phase.Seconds())
			if i%2 == 1 {
				fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#eef2f7"/>`+"\n", x0, y0, x1-x0, panelH)
			}
			if pi == 0 {
				fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="10" fill="#555">%d waiters</text>`+"\n", (x0+x1)/2, y0+panelH-6, 2*n)
			}
		}
		lo, hi := math.Inf(1), 0.0
		for _, s := range samples {
			for _, se := range p.ser {
				if v := se.v(s) * p.unit; !math.IsNaN(v) && v > 0 {
					lo, hi = math.Min(lo, v), math.Max(hi, v)
				}
			}
		}
		var ticks []float64
		var yOf func(float64) float64
		if p.log {
			lo, hi = math.Pow(10, math.Floor(math.Log10(lo))), math.Pow(10, math.Ceil(math.Log10(hi)))
			for t := lo; t <= hi*1.0001; t *= 10 {
				ticks = append(ticks, t)
			}
			yOf = func(v float64) float64 { return y0 + panelH - panelH*math.Log10(v/lo)/math.Log10(hi/lo) }
		} else {
			step := niceStep(hi / 4)
			hi = step * math.Ceil(hi/step)
			for t := 0.0; t <= hi*1.0001; t += step {
				ticks = append(ticks, t)
			}
			yOf = func(v float64) float64 { return y0 + panelH - panelH*v/hi }
		}
		for _, tk := range ticks {
			y := yOf(tk)
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#ddd"/>`+"\n", left, y, left+plotW, y)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="end" font-size="11">%s</text>`+"\n", left-6, y+4, short(tk))
		}
		// The acquisitions (dashed) are drawn over the contentions: under
		// this load every acquisition first found the lock held.
		for si := len(p.ser) - 1; si >= 0; si-- {
			se := p.ser[si]
			var pts []string
			for _, s := range samples {
				if s.at.Seconds() > total { // the last scrape, as the workload stopped
					continue
				}
				v := se.v(s) * p.unit
				if math.IsNaN(v) || (p.log && v <= 0) {
					continue
				}
				pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(s.at.Seconds()), yOf(v)))
			}
			dash := ""
			if se.dash {
				dash = ` stroke-dasharray="5 3"`
			}
			fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.8"%s points="%s"/>`+"\n", se.color, dash, strings.Join(pts, " "))
			ly := y0 + 14 + float64(si)*18
			fmt.Fprintf(&b, `<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s" stroke-width="3"/>`+"\n", left+plotW+12, ly-4, left+plotW+30, ly-4, se.color)
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" font-size="11">%s</text>`+"\n", left+plotW+36, ly, se.name)
		}
		for sec := 0.0; sec <= total; sec += 2 {
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="11">%gs</text>`+"\n", x(sec), y0+panelH+15, sec)
		}
	}
	b.WriteString("</svg>\n")
	return b.String()
}

func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}

func short(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%gk", v/1000)
	case v < 1 && v > 0:
		return fmt.Sprintf("%g", v)
	}
	return fmt.Sprintf("%g", v)
}

func escape(s string) string {
	return strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;").Replace(s)
}
