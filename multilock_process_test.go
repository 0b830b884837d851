package dlock_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/redis/go-redis/v9"
)

func init() { siteRoles["multi"] = childMulti }

// multiNames are the names the processes of the MultiLock tests lock sets
// of: on a Cluster two pairs share a slot (a hash tag), the rest spread.
var multiNames = []string{"{mp1}a", "{mp1}b", "{mp2}a", "{mp2}b", "mp-x", "mp-y", "mp-z"}

// multiEvent is one name's read-modify-write inside a MultiLock lease.
type multiEvent struct {
	Name    string `json:"name"`
	Counter int    `json:"counter"` // the value read
	Fence   uint64 `json:"fence"`
}

// childMulti: "seed,goroutines,iterations". Each goroutine locks random
// sets of two to four of multiNames (Lock, and now and then TryLock), and
// inside adds one to each name's counter, read-modify-write; it prints a
// multiEvent per name. A Lock that takes longer than 10s (a deadlock)
// fails the child.
func childMulti(c *dlock.Client, rdb redis.UniversalClient, arg string) error {
	var seed uint64
	var gs, iters int
	if _, err := fmt.Sscanf(arg, "%d,%d,%d", &seed, &gs, &iters); err != nil {
		return err
	}
	var mu sync.Mutex
	enc := json.NewEncoder(os.Stdout)
	return inGoroutines(gs, func(g int) error {
		r := rand.New(rand.NewPCG(seed, uint64(g)))
		for i := 0; i < iters; i++ {
			set := slices.Clone(multiNames)
			r.Shuffle(len(set), func(i, j int) { set[i], set[j] = set[j], set[i] })
			set = set[:2+r.IntN(3)]
			ml := c.MultiLock(set, dlock.TTL(5*time.Second))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			var l *dlock.Lease
			var err error
			if r.IntN(4) == 0 {
				if l, err = ml.TryLock(ctx); err != nil {
					cancel()
					i-- // refused: not an iteration
					continue
				}
			} else if l, err = ml.Lock(ctx); err != nil {
				cancel()
				return fmt.Errorf("Lock of %v: %w", set, err)
			}
			var evs []multiEvent
			for _, n := range set {
				v, _ := rdb.Get(ctx, "mcount:"+n).Int()
				if err := rdb.Set(ctx, "mcount:"+n, v+1, 0).Err(); err != nil {
					cancel()
					return err
				}
				evs = append(evs, multiEvent{n, v, l.FenceOf(n)})
			}
			err = l.Unlock(ctx)
			cancel()
			if err != nil {
				return err
			}
			mu.Lock()
			for _, e := range evs {
				_ = enc.Encode(e)
			}
			mu.Unlock()
		}
		return nil
	})
}

// multiProcesses runs procs child processes of 4 goroutines each, every
// goroutine locking iters random overlapping sets of multiNames, and
// checks each name's history: its counter was read 0, 1, 2, ... once
// each (no two holders inside at once, no lost update), fences increase
// in that order, and every Lock finished (no deadlock) within the bound.
func multiProcesses(t *testing.T, site *site, procs, iters int) {
	start := time.Now()
	type out struct {
		lines []string
		err   error
	}
	outs := make(chan out, procs)
	for p := range procs {
		cmd, _, sc := startChild(t, "multi", site.child, fmt.Sprintf("%d,4,%d", rand.Uint64N(1<<40)+uint64(p), iters))
		go func() {
			var o out
			for sc.Scan() {
				o.lines = append(o.lines, sc.Text())
			}
			o.err = cmd.Wait()
			outs <- o
		}()
	}
	byName := map[string][]multiEvent{}
	timeout := time.After(60 * time.Second)
	for range procs {
		select {
		case o := <-outs:
			if o.err != nil {
				t.Fatalf("child: %v (a Lock that did not finish in 10s is a deadlock)", o.err)
			}
			for _, line := range o.lines {
				var e multiEvent
				if err := json.Unmarshal([]byte(line), &e); err != nil {
					t.Fatalf("child line %q: %v", line, err)
				}
				byName[e.Name] = append(byName[e.Name], e)
			}
		case <-timeout:
			t.Fatal("children still running after 60s: no progress")
		}
	}
	total := 0
	for name, evs := range byName {
		sort.Slice(evs, func(i, j int) bool { return evs[i].Counter < evs[j].Counter })
		for i, e := range evs {
			if e.Counter != i {
				t.Fatalf("%s: counter values %v...: a lost update or two holders inside at once", name, counters(evs[:min(len(evs), i+2)]))
			}
			if i > 0 && e.Fence <= evs[i-1].Fence {
				t.Fatalf("%s: fence %d after %d in grant order", name, e.Fence, evs[i-1].Fence)
			}
		}
		total += len(evs)
	}
	if want := procs * 4 * iters * 2; total < want {
		t.Fatalf("%d name updates, want at least %d", total, want)
	}
	t.Logf("%d processes × 4 goroutines × %d MultiLocks (%d name updates) in %v", procs, iters, total, time.Since(start).Round(time.Millisecond))
}

func counters(evs []multiEvent) string {
	var s []string
	for _, e := range evs {
		s = append(s, fmt.Sprint(e.Counter))
	}
	return strings.Join(s, " ")
}

// TestMultiLockAcrossProcesses: 3 processes lock random overlapping sets
// of names on one server (one slot group: the atomic script, and waits on
// the name that blocked) and on a Cluster (several groups, taken in slot
// order): no deadlock, no overlap on a name, progress.
func TestMultiLockAcrossProcesses(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start func(*testing.T) *site
	}{{"S", startS}, {"C", startC}} {
		t.Run(tc.name, func(t *testing.T) { multiProcesses(t, tc.start(t), 3, 25) })
	}
}
