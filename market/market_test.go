package market

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/redistest"
)

// clientsFor returns a NewClient for addr: one connection per client.
func clientsFor(addr string) func() redis.UniversalClient {
	return func() redis.UniversalClient {
		return redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1, DisableIdentity: true})
	}
}

// testLocker is a minimal Locker (SET NX PX, polling, compare-and-delete)
// that exercises the dlock-* rows' plumbing without the dlock package.
type testLocker struct {
	rdb *redis.Client
}

var testUnlock = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

func (l testLocker) Lock(ctx context.Context, name string, fair bool) (func(context.Context) error, error) {
	key, token := "testlock:"+name, rand.Text()
	for {
		ok, err := l.rdb.SetNX(ctx, key, token, 10*time.Second).Result()
		if err != nil {
			return nil, err
		}
		if ok {
			return func(ctx context.Context) error {
				n, err := testUnlock.Run(ctx, l.rdb, []string{key}, token).Int()
				if err == nil && n == 0 {
					err = errors.New("lock lost")
				}
				return err
			}, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Microsecond):
		}
	}
}

// LockAll takes names one by one in sorted order (so that two callers
// cannot deadlock) and unlocks them in reverse; a failure unlocks what it
// took.
func (l testLocker) LockAll(ctx context.Context, names []string) (func(context.Context) error, error) {
	names = slices.Sorted(slices.Values(names))
	var unlocks []func(context.Context) error
	unlock := func(ctx context.Context) error {
		var errs []error
		for i := len(unlocks) - 1; i >= 0; i-- {
			errs = append(errs, unlocks[i](ctx))
		}
		return errors.Join(errs...)
	}
	for _, n := range names {
		u, err := l.Lock(ctx, n, false)
		if err != nil {
			_ = unlock(context.WithoutCancel(ctx))
			return nil, err
		}
		unlocks = append(unlocks, u)
	}
	return unlock, nil
}

func TestConservationEveryVariant(t *testing.T) {
	srv := redistest.Start(t)
	lockClient := srv.Client(t)
	var progress bytes.Buffer
	cfg := Config{
		Duration: 700 * time.Millisecond,
		Loads:    []Load{{1, 1}, {5, 5}},
		Seed:     1,
		Progress: &progress,
		// Every variant: the dlock rows run on testLocker.
		NewClient: clientsFor(srv.Addr()),
		Locker:    testLocker{rdb: lockClient},
	}
	rs, err := Run(context.Background(), cfg)
	t.Logf("progress:\n%s", progress.String())
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if want := 2 * len(Variants()); len(rs) != want {
		t.Fatalf("got %d results, want %d", len(rs), want)
	}
	var table bytes.Buffer
	WriteTable(&table, rs)
	t.Logf("table:\n%s", table.String())
	for _, r := range rs {
		if r.Check != nil || !r.Valid || r.Skipped != "" {
			t.Errorf("%s %s: check %v, valid %v (%s), skipped %q", r.Load, r.Variant, r.Check, r.Valid, r.Invalid, r.Skipped)
		}
		if r.Listed == 0 || r.Bought == 0 {
			t.Errorf("%s %s: listed %d, bought %d: nothing happened", r.Load, r.Variant, r.Listed, r.Bought)
		}
		if r.Commands <= 0 || r.CommandCalls["zrange"] == 0 {
			t.Errorf("%s %s: commands %d, zrange calls %d", r.Load, r.Variant, r.Commands, r.CommandCalls["zrange"])
		}
		// What the server and this process spent on the row.
		if r.RoundTrips < r.Calls || r.RedisCPU <= 0 || r.ClientCPU <= 0 || r.CommandUsec["zrange"] <= 0 {
			t.Errorf("%s %s: %d round trips for %d purchase calls, Redis CPU %v, client CPU %v, zrange µs %d",
				r.Load, r.Variant, r.RoundTrips, r.Calls, r.RedisCPU, r.ClientCPU, r.CommandUsec["zrange"])
		}
		if r.ListCalls < r.Listed {
			t.Errorf("%s %s: %d listing calls for %d listed", r.Load, r.Variant, r.ListCalls, r.Listed)
		}
		if r.Variant != VariantWatch && r.Retries != 0 {
			t.Errorf("%s %s: %d retries without WATCH", r.Load, r.Variant, r.Retries)
		}
		if r.Variant == VariantWatch && r.Load == (Load{5, 5}) && r.Retries == 0 {
			t.Errorf("5/5 watch: no retries; five listers should abort purchases constantly")
		}
		if r.Variant == VariantLua && r.CommandCalls["evalsha"] == 0 {
			t.Errorf("lua row ran no EVALSHA: %v", r.CommandCalls)
		}
		// One lock is held by one worker at a time: a coarse row's locks
		// are held at most the row's duration in all.
		spec := specFor(r.Variant)
		switch {
		case spec.lock == lockNone && r.LockHeld != 0:
			t.Errorf("%s %s: held a lock for %v without locking", r.Load, r.Variant, r.LockHeld)
		case spec.lock != lockNone && r.LockHeld <= 0:
			t.Errorf("%s %s: no time under the lock measured", r.Load, r.Variant)
		case spec.lock != lockNone && r.LockSections < r.Listed+r.Bought:
			t.Errorf("%s %s: %d critical sections for %d listings and %d purchases", r.Load, r.Variant, r.LockSections, r.Listed, r.Bought)
		case spec.lock != lockNone && (r.AcquireMean <= 0 || r.ReleaseMean <= 0):
			t.Errorf("%s %s: acquisitions took %v, releases %v", r.Load, r.Variant, r.AcquireMean, r.ReleaseMean)
		case spec.lock == lockNone && r.AcquireMean+r.ReleaseMean != 0:
			t.Errorf("%s %s: lock acquisitions measured without locking", r.Load, r.Variant)
		case spec.lock == lockNone && r.LockSections != 0:
			t.Errorf("%s %s: %d critical sections without locking", r.Load, r.Variant, r.LockSections)
		case spec.lock != lockNone && !spec.fine && (r.CeilingShare <= 0 || r.CeilingShare > 1.0001):
			// One lock: its sections back to back fill at most the row.
			t.Errorf("%s %s: %.3f of the one lock's ceiling", r.Load, r.Variant, r.CeilingShare)
		case spec.fine && r.CeilingShare != 0:
			t.Errorf("%s %s: a ceiling share %.3f for locks that run side by side", r.Load, r.Variant, r.CeilingShare)
		case spec.lock != lockNone && !spec.fine && r.LockHeld > r.Duration:
			t.Errorf("%s %s: the one lock was held %v in a %v row", r.Load, r.Variant, r.LockHeld, r.Duration)
		}
		if r.Variant == VariantCoarse && r.CommandCalls["setnx"] == 0 {
			t.Errorf("coarse row ran no SETNX: %v", r.CommandCalls)
		}
	}
	checkWriters(t, rs)
}

func TestCheckCatchesLostZRem(t *testing.T) {
	srv := redistest.Start(t)
	for _, v := range []string{VariantWatch, VariantFine} {
		t.Run(v, func(t *testing.T) {
			cfg := Config{
				Duration:  300 * time.Millisecond,
				Loads:     []Load{{1, 1}},
				Variants:  []string{v},
				NewClient: clientsFor(srv.Addr()),
				fault:     faultSkipZRem,
			}
			rs, err := Run(context.Background(), cfg)
			var ce *CheckError
			if !errors.As(err, &ce) {
				t.Fatalf("Run with purchases that skip ZREM returned %v, want a *CheckError", err)
			}
			if len(rs) != 1 || rs[0].Check == nil {
				t.Fatalf("results %+v: want one cell with a failed check", rs)
			}
			msg := err.Error()
			for _, want := range []string{"bought items still in the market", "still listed"} {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q does not mention %q", msg, want)
				}
			}
		})
	}
}

func TestListerRunningOutIsInvalid(t *testing.T) {
	srv := redistest.Start(t)
	rs, err := Run(context.Background(), Config{
		Duration:  300 * time.Millisecond,
		Loads:     []Load{{2, 1}},
		Variants:  []string{VariantLua},
		NewClient: clientsFor(srv.Addr()),
		inventory: 10, // the rerun gets 40: still far too few
	})
	if err != nil {
		t.Fatalf("Run: %v (running out is invalid, not a failed check)", err)
	}
	r := rs[0]
	if r.Valid || !strings.Contains(r.Invalid, "ran out of its 40 items") || len(r.Notes) == 0 {
		t.Fatalf("valid %v, invalid %q, notes %q: want an invalid rerun", r.Valid, r.Invalid, r.Notes)
	}
	if r.Listed != 80 {
		t.Errorf("listed %d, want all 80 items of both sellers", r.Listed)
	}
	var table bytes.Buffer
	WriteTable(&table, rs)
	if !strings.Contains(table.String(), "INVALID") {
		t.Errorf("table does not flag the invalid cell:\n%s", table.String())
	}
}

func TestCancelStopsPromptly(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(500*time.Millisecond, cancel)
	start := time.Now()
	_, err := Run(ctx, Config{
		Duration:  time.Minute,
		Loads:     []Load{{2, 2}},
		Variants:  []string{VariantFine},
		NewClient: clientsFor(srv.Addr()),
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run after cancel returned %v, want context.Canceled", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("Run took %v to notice the cancel", took)
	}
}

func TestSkipsDlockRowsWithoutLocker(t *testing.T) {
	srv := redistest.Start(t)
	var progress bytes.Buffer
	rs, err := Run(context.Background(), Config{
		Duration:  200 * time.Millisecond,
		Loads:     []Load{{1, 1}},
		Variants:  []string{VariantDlockFine, VariantLua},
		Pick:      PickRandom,
		NewClient: clientsFor(srv.Addr()),
		Progress:  &progress,
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 || rs[0].Skipped == "" || rs[1].Skipped != "" || rs[1].Bought == 0 {
		t.Fatalf("results %+v: want dlock-fine skipped and lua run", rs)
	}
	if !strings.Contains(progress.String(), "skipped") {
		t.Errorf("progress does not say the row was skipped:\n%s", progress.String())
	}
	var table bytes.Buffer
	WriteTable(&table, rs)
	if !strings.Contains(table.String(), "skipped: dlock-fine (no Locker configured)") {
		t.Errorf("table does not show the skipped row:\n%s", table.String())
	}
}

// TestMiniredis runs the embedded fallback server of cmd/dlock: the
// in-process miniredis must support everything the non-dlock rows do.
func TestMiniredis(t *testing.T) {
	m := miniredis.RunT(t)
	rs, err := Run(context.Background(), Config{
		Duration:  300 * time.Millisecond,
		Loads:     []Load{{1, 1}, {2, 2}},
		Variants:  []string{VariantCoarse, VariantFine, VariantLua},
		NewClient: clientsFor(m.Addr()),
	})
	if err != nil {
		t.Fatalf("Run on miniredis: %v", err)
	}
	for _, r := range rs {
		if r.Bought == 0 || r.Check != nil || r.Commands <= 0 {
			t.Errorf("%s %s: bought %d, check %v, commands %d", r.Load, r.Variant, r.Bought, r.Check, r.Commands)
		}
	}
	// ZRANDMEMBER too.
	if _, err := Run(context.Background(), Config{
		Duration: 200 * time.Millisecond, Loads: []Load{{1, 1}}, Variants: []string{VariantLua},
		Pick: PickRandom, NewClient: clientsFor(m.Addr()),
	}); err != nil {
		t.Fatalf("pick random on miniredis: %v", err)
	}
}

func TestInvalidConfig(t *testing.T) {
	nc := clientsFor("127.0.0.1:1")
	for name, cfg := range map[string]Config{
		"variant":   {Variants: []string{"optimistic"}, NewClient: nc},
		"twice":     {Variants: []string{"lua", "lua"}, NewClient: nc},
		"pick":      {Pick: "dearest", NewClient: nc},
		"load":      {Loads: []Load{{0, 1}}, NewClient: nc},
		"client":    {},
		"negative":  {Duration: -time.Second, NewClient: nc},
		"not-redis": {NewClient: func() redis.UniversalClient { return redis.NewClusterClient(&redis.ClusterOptions{}) }},
	} {
		_, err := Run(context.Background(), cfg)
		if !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: Run returned %v, want ErrInvalidConfig", name, err)
		}
	}
}

func TestParseLoads(t *testing.T) {
	got, err := ParseLoads("1/1, 5/1,5/5")
	if err != nil || len(got) != 3 || got[1] != (Load{5, 1}) {
		t.Fatalf("ParseLoads = %v, %v", got, err)
	}
	for _, bad := range []string{"", "5", "5/x", "0/1", "1/2000", "a/b,1/1"} {
		if _, err := ParseLoads(bad); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("ParseLoads(%q) = %v, want ErrInvalidConfig", bad, err)
		}
	}
}

func TestNames(t *testing.T) {
	item := itemID(3, 17)
	if item != "Item3-17" {
		t.Fatalf("itemID = %q", item)
	}
	it, s, err := splitMember(memberOf(item, 3))
	if err != nil || it != item || s != 3 {
		t.Fatalf("splitMember = %q %d %v", it, s, err)
	}
	if s, n, ok := parseItemID(item); !ok || s != 3 || n != 17 {
		t.Fatalf("parseItemID = %d %d %v", s, n, ok)
	}
	if _, _, err := splitMember("Item3-17"); err == nil {
		t.Fatal("splitMember accepted a member without a seller")
	}
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -1234: "-1,234"} {
		if got := count(n); got != want {
			t.Errorf("count(%d) = %q, want %q", n, got, want)
		}
	}
	for d, want := range map[time.Duration]string{0: "-", 999950 * time.Nanosecond: "1000µs", 1500 * time.Microsecond: "1.50ms", 12 * time.Second: "12.0s"} {
		if got := dur(d); got != want {
			t.Errorf("dur(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestWritersOnSyntheticResults(t *testing.T) {
	var rs []Result
	for i, v := range Variants() {
		r := baseResult(Config{Duration: time.Minute, Pick: PickCheapest10}, Load{5, 5}, specFor(v))
		r.Listed, r.Bought, r.Retries = int64(1000*(i+1)), int64(900*(i+1)), int64(10*i)
		r.All = Latency{Mean: time.Duration(i+1) * time.Millisecond, P50: time.Millisecond, P99: time.Duration(i+2) * 3 * time.Millisecond}
		r.CommandCalls = map[string]int64{"zrange": 5}
		rs = append(rs, r)
	}
	rs[1].Check = errors.New("total funds 1 ≠ 2 at the start")
	rs[1].CheckError = rs[1].Check.Error()
	rs[2].Bought = 0 // a zero bar and a missing latency must not break the chart
	rs[2].All = Latency{}
	rs = append(rs, Result{Load: Load{1, 1}, Variant: VariantDlockFine, Skipped: "no Locker configured"})
	checkWriters(t, rs)

	var table bytes.Buffer
	WriteTable(&table, rs)
	for _, want := range []string{"load", "book wait", "FAILED", "check failed: total funds", "a row the book does not have", "fine lock bought", "book wait  "} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	if err := WriteSVG(io.Discard, []Result{{Skipped: "x"}}); err == nil {
		t.Error("WriteSVG with nothing to draw returned nil")
	}
}

// checkWriters checks that the JSON round-trips and the SVG parses.
func checkWriters(t *testing.T, rs []Result) {
	t.Helper()
	var js bytes.Buffer
	if err := WriteJSON(&js, rs); err != nil {
		t.Fatal(err)
	}
	var back []Result
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatalf("JSON does not parse: %v\n%s", err, js.String())
	}
	if len(back) != len(rs) {
		t.Fatalf("JSON has %d results, want %d", len(back), len(rs))
	}
	for i := range rs {
		a, b := rs[i], back[i]
		if a.Load != b.Load || a.Variant != b.Variant || a.Bought != b.Bought || a.Listed != b.Listed ||
			a.All != b.All || a.BookWait != b.BookWait || a.Commands != b.Commands || (a.Check != nil) != (b.CheckError != "") {
			t.Errorf("JSON round trip changed result %d:\n%+v\n%+v", i, a, b)
		}
	}

	var svg bytes.Buffer
	if err := WriteSVG(&svg, rs); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(&svg)
	elements := 0
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("SVG is not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok {
			if elements == 0 && se.Name.Local != "svg" {
				t.Fatalf("SVG root is <%s>", se.Name.Local)
			}
			elements++
		}
	}
	if elements < 10 {
		t.Errorf("SVG has only %d elements", elements)
	}
}
