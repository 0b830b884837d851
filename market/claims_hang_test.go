package market

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/redistest"
)

// stuckLocker grants its first few locks, then never again: every later
// Lock waits until its context ends, as a lock whose waiters are never
// woken would.
type stuckLocker struct {
	Locker
	grants atomic.Int64
}

func (l *stuckLocker) Lock(ctx context.Context, name string, fair bool) (func(context.Context) error, error) {
	if l.grants.Add(1) > 3 {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return l.Locker.Lock(ctx, name, fair)
}

// A row whose purchases hang until the deadline has few or no purchases
// that completed: their latencies say nothing of the slow ones, which are
// the ones still waiting. The claim about dlock-coarse's slowest purchases
// must not hold on such a row.
func TestClaimsSeeHungPurchases(t *testing.T) {
	srv := redistest.Start(t)
	cfg := Config{
		Duration:  time.Second,
		Loads:     []Load{{5, 5}},
		Variants:  []string{VariantCoarse, VariantDlockCoarse},
		Seed:      1,
		NewClient: clientsFor(srv.Addr()),
		Locker:    &stuckLocker{Locker: testLocker{rdb: srv.Client(t)}},
	}
	rs, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	for _, r := range rs {
		t.Logf("%s: bought %d, calls %d, in flight %d, p99 %v", r.Variant, r.Bought, r.Calls, r.InFlight, r.All.P99)
	}
	for _, c := range claims(rs) {
		if strings.Contains(c.text, "keeps the slowest purchases short") && c.holds {
			t.Errorf("holds on a row whose purchases hung: %s", c.text)
		}
	}
}
