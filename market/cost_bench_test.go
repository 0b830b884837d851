package market

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// dlockLocker is the Locker of cmd/dlock (a dlock Mutex per name on one
// shared Client), rebuilt here so that the cost benchmark can run the dlock
// rows' lock without the command.
type dlockLocker struct{ c *dlock.Client }

func (l dlockLocker) Lock(ctx context.Context, name string, fair bool) (func(context.Context) error, error) {
	var opts []dlock.LockOption
	if fair {
		opts = append(opts, dlock.Fair())
	}
	lease, err := l.c.Mutex(name, opts...).Lock(ctx)
	if err != nil {
		return nil, err
	}
	return lease.Unlock, nil
}

// BenchmarkCost measures what one operation of a row costs, on one worker
// with nobody to contend with: the CPU time of this process (client-µs/op)
// and of the server (redis-µs/op, INFO cpu), the requests the server read
// (round-trips/op, INFO stats total_reads_processed) and the commands it ran
// (redis-cmds/op, scripts' commands included). Contention is what the
// market itself measures; this is the price of one critical section.
//
//   - lock/VARIANT: lock and unlock a fresh item's name, nothing inside.
//   - trade/VARIANT: list a fresh item and buy it, as a lister and a buyer
//     of the market do (the buyer's ZRANGE included): two critical sections.
//
// The dlock rows use a pooled client as in dlock market (ctte: with
// ContextTimeoutEnabled, as the README advises).
func BenchmarkCost(b *testing.B) {
	srv := redistest.Start(b)
	ctx := context.Background()
	admin := srv.Client(b)
	type row struct {
		name   string
		spec   string
		locker func(b *testing.B) Locker
	}
	newDlock := func(cte bool) func(b *testing.B) Locker {
		return func(b *testing.B) Locker {
			rdb := srv.Client(b, func(o *redis.Options) { o.ContextTimeoutEnabled = cte })
			c := dlock.New(rdb)
			b.Cleanup(func() { _ = c.Close() })
			return dlockLocker{c}
		}
	}
	rows := []row{
		{"fine", VariantFine, nil},
		{"dlock-fine", VariantDlockFine, newDlock(false)},
		{"dlock-fine-ctte", VariantDlockFine, newDlock(true)},
	}
	for _, what := range []string{"lock", "trade"} {
		for _, r := range rows {
			b.Run(what+"/"+r.name, func(b *testing.B) {
				if err := admin.FlushDB(ctx).Err(); err != nil {
					b.Fatal(err)
				}
				t := trader{spec: specFor(r.spec), conn: srv.Client(b, func(o *redis.Options) { o.PoolSize = 1 }).Conn()}
				defer t.conn.Close()
				if r.locker != nil {
					t.locker = r.locker(b)
				}
				// As in the market: the wait ends at the row's deadline.
				stop, cancel := context.WithTimeout(ctx, time.Hour)
				defer cancel()
				t.stop = stop
				if what == "trade" {
					seedTrade(b, admin, 1<<20)
				}
				op := func(i int) {
					item := itemID(1, i)
					member := memberOf(item, 1)
					if what == "lock" {
						release, out, err := t.lock(stop, t.lockName(member))
						if err != nil || out != outOK {
							b.Fatalf("lock: %v %v", out, err)
						}
						if err := release(stop); err != nil {
							b.Fatal(err)
						}
						return
					}
					if out, err := t.list(stop, 1, item, member, 10); err != nil || out != outOK {
						b.Fatalf("list: %v %v", out, err)
					}
					if _, err := t.pick(stop, DefaultPick); err != nil {
						b.Fatal(err)
					}
					if out, err := t.purchase(stop, firstBuyer, item, 1, member, 10); err != nil || out != outOK {
						b.Fatalf("purchase: %v %v", out, err)
					}
				}
				op(-1) // load the scripts, connect
				st0, err := readServerStats(ctx, admin)
				if err != nil {
					b.Fatal(err)
				}
				cpu0, _ := processCPU()
				n := 0
				for b.Loop() {
					op(n)
					n++
				}
				cpu1, _ := processCPU()
				st1, err := readServerStats(ctx, admin)
				if err != nil {
					b.Fatal(err)
				}
				_, cmds := diffCounts(st0.calls, st1.calls)
				f := float64(n)
				b.ReportMetric(float64(cpu1-cpu0)/1e3/f, "client-µs/op")
				b.ReportMetric(float64(st1.cpu-st0.cpu)/1e3/f, "redis-µs/op")
				b.ReportMetric(float64(st1.reads-st0.reads-1)/f, "round-trips/op")
				b.ReportMetric(float64(cmds-1)/f, "redis-cmds/op") // less the INFO
			})
		}
	}
}

// seedTrade gives seller 1 n items and the buyer funds for all of them.
func seedTrade(b *testing.B, rdb *redis.Client, n int) {
	ctx := context.Background()
	items := make([]any, 0, setupChunk)
	for i := -1; i < n; i++ {
		items = append(items, itemID(1, i))
		if len(items) == setupChunk || i == n-1 {
			if err := rdb.SAdd(ctx, inventoryKey(1), items...).Err(); err != nil {
				b.Fatal(err)
			}
			items = items[:0]
		}
	}
	if err := rdb.HSet(ctx, userKey(firstBuyer), "name", "buyer", "funds", fmt.Sprint(1<<40)).Err(); err != nil {
		b.Fatal(err)
	}
	if err := rdb.HSet(ctx, userKey(1), "name", "seller", "funds", "0").Err(); err != nil {
		b.Fatal(err)
	}
}
