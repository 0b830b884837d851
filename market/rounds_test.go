package market

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/redistest"
)

// roundsOf returns the story's 5/5 fine and dlock-fine cells for each
// round, dlock-fine buying fine's purchases times the round's ratio.
func roundsOf(ratios ...float64) []Result {
	var rs []Result
	for i, q := range ratios {
		m := storyResults(Load{5, 5})
		fine, df := *m[VariantFine], *m[VariantDlockFine]
		fine.Round, df.Round = i+1, i+1
		fine.Bought = 8000 + int64(i)*500 // the load changes from round to round
		df.Bought = int64(q * float64(fine.Bought))
		rs = append(rs, fine, df)
	}
	return rs
}

// TestClaimsTakeMedianOfRounds: with rounds, the claim about dlock-fine
// compares the rows of each round and holds when the median ratio does,
// whatever the first or the last round says.
func TestClaimsTakeMedianOfRounds(t *testing.T) {
	for _, tc := range []struct {
		ratios []float64
		holds  bool
	}{
		{[]float64{0.7, 1.2, 1.1}, true},        // one bad round
		{[]float64{1.3, 0.8, 0.9}, false},       // one good round
		{[]float64{0.9, 1.05, 1.1, 0.8}, false}, // even: the mean of the middle two, 0.975
		{[]float64{0.9, 1.05, 1.1, 1.2}, true},  // 1.075
	} {
		c := claimWith(t, claims(roundsOf(tc.ratios...)), "dlock costs no purchases")
		if c.holds != tc.holds {
			t.Errorf("ratios %v: claim holds=%v, want %v: %s", tc.ratios, c.holds, tc.holds, c.text)
		}
		if want := plural(len(tc.ratios), "round"); !strings.Contains(c.text, want) {
			t.Errorf("ratios %v: claim does not say it took %s: %s", tc.ratios, want, c.text)
		}
	}
	// One round: the single-row wording, no median.
	c := claimWith(t, claims(inOrder(storyResults(Load{5, 5}))), "dlock costs no purchases")
	if strings.Contains(c.text, "median") {
		t.Errorf("one round, yet the claim speaks of medians: %s", c.text)
	}
}

// TestMedianRowsShowMedianRound: the tables show each row's median round
// by items bought, and a round whose check failed in place of the median.
func TestMedianRowsShowMedianRound(t *testing.T) {
	rs := roundsOf(0.7, 1.2, 1.1) // fine bought 8000, 8500, 9000
	rep := collect(rs)
	if rep.rounds != 3 || len(rep.ran) != 2 || len(rep.all) != 6 {
		t.Fatalf("rounds %d, %d rows, %d cells: want 3, 2, 6", rep.rounds, len(rep.ran), len(rep.all))
	}
	if r := rep.ran[0]; r.Variant != VariantFine || r.Round != 2 {
		t.Errorf("fine row is round %d (%s), want its median round 2", r.Round, r.Variant)
	}
	if r := rep.ran[1]; r.Variant != VariantDlockFine || r.Bought != int64(1.1*9000) {
		t.Errorf("dlock-fine row bought %d (round %d), want the median %d", r.Bought, r.Round, int64(1.1*9000))
	}
	rs[4].CheckError = "funds do not balance" // fine, round 3
	rep = collect(rs)
	if r := rep.ran[0]; r.Round != 3 || verdict(r) != "FAILED" {
		t.Errorf("fine row is round %d (%s), want the failed round 3", r.Round, verdict(r))
	}
	if !containsSub(rep.notes, "(round 3): check failed") {
		t.Errorf("notes %q do not name the failed round", rep.notes)
	}
	var svg bytes.Buffer
	if err := WriteSVG(&svg, roundsOf(0.7, 1.2, 1.1)); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(svg.String(), "5/5 fine: 8,500 bought") || strings.Contains(svg.String(), "8,000 bought") {
		t.Errorf("the chart does not show fine's median round (8,500 bought):\n%s", svg.String())
	}
	var out bytes.Buffer
	WriteSummary(&out, roundsOf(0.7, 1.2, 1.1))
	if !strings.Contains(out.String(), "the median of 3 rounds") {
		t.Errorf("summary does not say its rows are medians of rounds:\n%s", out.String())
	}
}

func containsSub(ss []string, sub string) bool {
	for _, s := range ss {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// TestRunRounds runs two rounds on a real server: every cell twice, round
// 1's before round 2's, and a row skipped for want of a Locker once.
func TestRunRounds(t *testing.T) {
	srv := redistest.Start(t)
	var progress bytes.Buffer
	rs, err := Run(context.Background(), Config{
		Duration:  150 * time.Millisecond,
		Loads:     []Load{{1, 1}},
		Variants:  []string{VariantFine, VariantDlockFine, VariantLua},
		Pick:      PickRandom,
		Rounds:    2,
		NewClient: clientsFor(srv.Addr()),
		Progress:  &progress,
	})
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, r := range rs {
		got = append(got, r.Variant+"@"+string(rune('0'+r.Round)))
		if r.ran() && r.Bought == 0 {
			t.Errorf("%s round %d bought nothing", r.Variant, r.Round)
		}
	}
	want := "fine@1 dlock-fine@1 lua@1 fine@2 lua@2"
	if strings.Join(got, " ") != want {
		t.Errorf("cells %q, want %q", strings.Join(got, " "), want)
	}
	if !strings.Contains(progress.String(), "[4/5] round 2") {
		t.Errorf("progress does not count rounds:\n%s", progress.String())
	}
	for _, bad := range []int{-1, MaxRounds + 1} {
		_, err := Run(context.Background(), Config{Rounds: bad, NewClient: clientsFor(srv.Addr())})
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "rounds") {
			t.Errorf("Rounds %d: %v, want ErrInvalidConfig naming rounds", bad, err)
		}
	}
}
