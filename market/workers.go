package market

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"
)

// bought is one successful purchase as the buyer recorded it.
type bought struct {
	item   string
	seller int
	price  int64
	buyer  int
}

// workerLog is what one worker recorded; the check compares it with Redis.
type workerLog struct {
	err      error
	inFlight bool

	// listers
	seller     int
	listed     int64
	listCalls  int64 // listings that completed before the deadline, whatever their outcome
	lateListed int64
	timeouts   int64
	next       int   // items 0..next-1 were tried
	notListed  []int // tried but not listed (timed out, stopped, lock failed)
	exhausted  bool

	// buyers
	buyer      int
	purchased  int64 // before the deadline
	lateBought int64
	gone       int64
	noFunds    int64
	calls      int64
	okLat      []time.Duration
	allLat     []time.Duration
	items      []bought // every success, late ones included
	spent      int64

	t trader
}

// cellClock is set before the start barrier opens and read after.
type cellClock struct {
	start, deadline time.Time
	stop            context.Context
}

// listerLoop lists the seller's items in order until the deadline.
func listerLoop(ctx context.Context, cfg Config, w *workerLog, clock *cellClock, inventory int, live *atomic.Int64) error {
	rng := rand.New(rand.NewPCG(uint64(cfg.Seed), uint64(w.seller)))
	for n := 0; time.Now().Before(clock.deadline); n++ {
		// go-redis does not fail commands on a cancelled context by itself.
		if err := ctx.Err(); err != nil {
			return err
		}
		if n >= inventory {
			w.exhausted = true
			return nil
		}
		item := itemID(w.seller, n)
		member := memberOf(item, w.seller)
		price := 1 + rng.Int64N(maxPrice)
		out, err := w.t.list(ctx, w.seller, item, member, price)
		if err != nil {
			return err
		}
		late := time.Now().After(clock.deadline)
		w.next = n + 1
		if !late {
			w.listCalls++
		}
		switch out {
		case outOK:
			if late {
				w.lateListed++
			} else {
				w.listed++
				live.Add(1)
			}
		case outMissing:
			return fmt.Errorf("seller %d: item %s missing from its inventory", w.seller, item)
		case outTimeout:
			w.notListed = append(w.notListed, n)
			if !late {
				w.timeouts++
			}
		default:
			w.notListed = append(w.notListed, n)
		}
		if late {
			w.inFlight = true
			return nil
		}
	}
	return nil
}

// buyerLoop reads the market, picks an entry and buys it, until the
// deadline.
func buyerLoop(ctx context.Context, cfg Config, w *workerLog, clock *cellClock, live *atomic.Int64) error {
	rng := rand.New(rand.NewPCG(uint64(cfg.Seed), uint64(w.buyer)))
	for time.Now().Before(clock.deadline) {
		if err := ctx.Err(); err != nil {
			return err
		}
		entries, err := w.t.pick(ctx, cfg.Pick)
		if err != nil {
			return err
		}
		if len(entries) == 0 {
			time.Sleep(emptyPause)
			continue
		}
		if !time.Now().Before(clock.deadline) {
			return nil
		}
		e := entries[rng.IntN(len(entries))]
		member, ok := e.Member.(string)
		if !ok {
			return fmt.Errorf("unexpected market member %v", e.Member)
		}
		item, seller, err := splitMember(member)
		if err != nil {
			return err
		}
		price := int64(e.Score)
		t0 := time.Now()
		out, err := w.t.purchase(ctx, w.buyer, item, seller, member, price)
		if err != nil {
			return err
		}
		t1 := time.Now()
		if out == outOK {
			w.items = append(w.items, bought{item: item, seller: seller, price: price, buyer: w.buyer})
			w.spent += price
		}
		if t1.After(clock.deadline) {
			w.inFlight = true
			if out == outOK {
				w.lateBought++
			}
			return nil
		}
		lat := t1.Sub(t0)
		w.calls++
		w.allLat = append(w.allLat, lat)
		switch out {
		case outOK:
			w.purchased++
			w.okLat = append(w.okLat, lat)
			live.Add(1)
		case outGone:
			w.gone++
		case outNoFunds:
			w.noFunds++
		case outTimeout:
			w.timeouts++
		}
	}
	return nil
}
