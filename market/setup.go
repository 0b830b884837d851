package market

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

const (
	// inventoryMargin multiplies the most items a lister could list. The
	// bound is already loose (a PING is cheaper than any listing), and every
	// item costs setup time, so the margin is small; a lister that runs out
	// anyway gets its cell rerun.
	inventoryMargin = 1.25
	// minInventory is the smallest inventory a seller gets.
	minInventory = 1000
	// calibrateFor is how long pingRate measures.
	calibrateFor = 200 * time.Millisecond
	// setupChunk is how many items one SADD carries during setup.
	setupChunk = 5000
)

// pingRate measures how many round trips per second one connection can
// make while n connections (n listers) ping the server at once, and returns
// the fastest connection's rate. A lister's listing needs at least one round
// trip of a command costlier than PING, and the buyers only slow it further,
// so this bounds how many items a lister can list.
func pingRate(ctx context.Context, newClient func() redis.UniversalClient, n int) (float64, error) {
	rates := make([]float64, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		client := newClient()
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer client.Close()
			c, ok := client.(conner)
			if !ok {
				errs[i] = fmt.Errorf("NewClient returned %T, not a single-server client", client)
				return
			}
			conn := c.Conn()
			defer conn.Close()
			if errs[i] = conn.Ping(ctx).Err(); errs[i] != nil {
				return
			}
			pings := 0
			t0 := time.Now()
			for time.Since(t0) < calibrateFor {
				if errs[i] = conn.Ping(ctx).Err(); errs[i] != nil {
					return
				}
				pings++
			}
			rates[i] = float64(pings) / time.Since(t0).Seconds()
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	return slices.Max(rates), nil
}

// inventoryFor sizes each seller's inventory so that a lister cannot run
// out: a margin over the listings that fit in d at rate round trips per
// second if every listing took only trips round trips.
func inventoryFor(d time.Duration, rate float64, trips int) int {
	n := inventoryMargin * d.Seconds() * rate / float64(trips)
	return int(min(math.Ceil(n), 1e8)) + minInventory
}

// setup flushes the database and creates the sellers, their inventories and
// the buyers; the market starts empty.
func setup(ctx context.Context, admin redis.UniversalClient, load Load, inventory int) error {
	if err := admin.FlushDB(ctx).Err(); err != nil {
		return err
	}
	pipe := admin.Pipeline()
	flushAt := func(n int) error {
		if pipe.Len() < n {
			return nil
		}
		_, err := pipe.Exec(ctx)
		return err
	}
	for s := 1; s <= load.Listers; s++ {
		pipe.HSet(ctx, userKey(s), "name", fmt.Sprintf("seller %d", s), "funds", 0)
		items := make([]any, 0, setupChunk)
		for n := 0; n < inventory; n++ {
			items = append(items, itemID(s, n))
			if len(items) == setupChunk || n == inventory-1 {
				pipe.SAdd(ctx, inventoryKey(s), items...)
				items = make([]any, 0, setupChunk)
				if err := flushAt(20); err != nil {
					return err
				}
			}
		}
	}
	for b := range load.Buyers {
		id := firstBuyer + b
		pipe.HSet(ctx, userKey(id), "name", fmt.Sprintf("buyer %d", id), "funds", buyerFunds)
	}
	if err := flushAt(1); err != nil {
		return err
	}
	if err := listScript.Load(ctx, admin).Err(); err != nil {
		return fmt.Errorf("loading list.lua: %w", err)
	}
	if err := purchaseScript.Load(ctx, admin).Err(); err != nil {
		return fmt.Errorf("loading purchase.lua: %w", err)
	}
	return nil
}
