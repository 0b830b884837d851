package market

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/redis/go-redis/v9"
)

// checkFailure lists the conservation checks that did not balance (as
// opposed to a Redis error while checking).
type checkFailure struct{ problems []string }

func (c checkFailure) Error() string { return strings.Join(c.problems, "; ") }

func (c *checkFailure) addf(format string, args ...any) {
	c.problems = append(c.problems, fmt.Sprintf(format, args...))
}

// some returns up to 3 examples and the total count, for messages like
// "2 bought items still in the market (e.g. Item1-3, Item1-7)".
func some(items []string) string {
	items = slices.Clone(items)
	slices.Sort(items)
	if len(items) > 3 {
		return strings.Join(items[:3], ", ") + ", …"
	}
	return strings.Join(items, ", ")
}

// check compares the server's final state with what the workers recorded:
//
//   - listed = bought + still listed + in flight (net: in-flight purchases
//     that succeeded − in-flight listings that succeeded);
//   - total funds unchanged; each buyer paid exactly what it recorded and
//     each seller received exactly the prices of its sold items;
//   - every item is in exactly one place: an unlisted item only in its
//     seller's inventory, a listed item either in the market or in the
//     inventory of the one buyer who recorded buying it;
//   - each seller's inventory shrank by exactly what it listed.
//
// It returns the final ZCARD of the market and, if anything did not
// balance, a checkFailure naming the figures.
func check(ctx context.Context, admin redis.UniversalClient, load Load, inventory int, logs []workerLog) (int64, error) {
	var p checkFailure

	zcard, err := admin.ZCard(ctx, marketKey).Result()
	if err != nil {
		return 0, err
	}
	var listed, lateListed, purchased, lateBought int64
	for i := range logs {
		listed += logs[i].listed
		lateListed += logs[i].lateListed
		purchased += logs[i].purchased
		lateBought += logs[i].lateBought
	}
	if listed != purchased+zcard+lateBought-lateListed {
		p.addf("listed %d ≠ bought %d + still listed %d + in flight %d (bought %d − listed %d after the deadline)",
			listed, purchased, zcard, lateBought-lateListed, lateBought, lateListed)
	}

	// What the buyers recorded.
	owner := map[string]int{} // item → buyer
	var dupBought []string
	sellerIncome := map[int]int64{}
	for i := range logs {
		for _, b := range logs[i].items {
			if _, dup := owner[b.item]; dup {
				dupBought = append(dupBought, b.item)
			}
			owner[b.item] = b.buyer
			sellerIncome[b.seller] += b.price
		}
	}
	if len(dupBought) > 0 {
		p.addf("%d items bought twice (e.g. %s)", len(dupBought), some(dupBought))
	}

	// Funds.
	users := make([]int, 0, load.Listers+load.Buyers)
	for s := 1; s <= load.Listers; s++ {
		users = append(users, s)
	}
	for b := range load.Buyers {
		users = append(users, firstBuyer+b)
	}
	funds := make([]*redis.StringCmd, len(users))
	if _, err := admin.Pipelined(ctx, func(pipe redis.Pipeliner) error {
		for i, u := range users {
			funds[i] = pipe.HGet(ctx, userKey(u), "funds")
		}
		return nil
	}); err != nil {
		return zcard, err
	}
	spent := map[int]int64{}
	for i := range logs {
		if logs[i].buyer > 0 {
			spent[logs[i].buyer] = logs[i].spent
		}
	}
	var sum int64
	var wrongFunds []string
	for i, u := range users {
		f, err := funds[i].Int64()
		if err != nil {
			return zcard, fmt.Errorf("reading users:%d funds: %w", u, err)
		}
		sum += f
		want := sellerIncome[u]
		if u >= firstBuyer {
			want = buyerFunds - spent[u]
		}
		if f != want {
			wrongFunds = append(wrongFunds, fmt.Sprintf("users:%d has %d, expected %d", u, f, want))
		}
	}
	if wantSum := int64(load.Buyers) * buyerFunds; sum != wantSum {
		p.addf("total funds %d ≠ %d at the start", sum, wantSum)
	}
	if len(wrongFunds) > 0 {
		p.addf("%d users' funds do not match their purchases and sales (%s)", len(wrongFunds), some(wrongFunds))
	}

	// The market.
	inMarket := make(map[string]bool, zcard)
	var soldListed, unlistedInMarket, wrongMember []string
	const page = 10000
	for start := int64(0); start < zcard; start += page {
		members, err := admin.ZRange(ctx, marketKey, start, start+page-1).Result()
		if err != nil {
			return zcard, err
		}
		for _, m := range members {
			item, seller, err := splitMember(m)
			s, _, ok := parseItemID(item)
			if err != nil || !ok || s != seller {
				wrongMember = append(wrongMember, m)
				continue
			}
			inMarket[item] = true
			if _, sold := owner[item]; sold {
				soldListed = append(soldListed, item)
			}
		}
	}
	if len(wrongMember) > 0 {
		p.addf("%d malformed market members (e.g. %s)", len(wrongMember), some(wrongMember))
	}
	if len(soldListed) > 0 {
		p.addf("%d bought items still in the market (e.g. %s)", len(soldListed), some(soldListed))
	}

	// The buyers' inventories hold exactly what each recorded buying.
	var extra, missing []string
	for i := range logs {
		b := logs[i].buyer
		if b == 0 {
			continue
		}
		have, err := admin.SMembers(ctx, inventoryKey(b)).Result()
		if err != nil {
			return zcard, err
		}
		haveSet := make(map[string]bool, len(have))
		for _, item := range have {
			haveSet[item] = true
			if owner[item] != b {
				extra = append(extra, fmt.Sprintf("%s in inventory:%d", item, b))
			}
		}
		for _, it := range logs[i].items {
			if !haveSet[it.item] {
				missing = append(missing, fmt.Sprintf("%s not in inventory:%d", it.item, b))
			}
		}
	}
	if len(extra) > 0 {
		p.addf("%d items in a buyer's inventory that buyer did not buy (e.g. %s)", len(extra), some(extra))
	}
	if len(missing) > 0 {
		p.addf("%d bought items missing from the buyer's inventory (e.g. %s)", len(missing), some(missing))
	}

	// The sellers' inventories, and every listed item in exactly one place.
	for i := range logs {
		w := &logs[i]
		if w.seller == 0 {
			continue
		}
		if err := checkSeller(ctx, admin, &p, w, inventory, inMarket, owner); err != nil {
			return zcard, err
		}
	}
	for item := range inMarket {
		if s, n, ok := parseItemID(item); ok && !listedBy(logs, s, n) {
			unlistedInMarket = append(unlistedInMarket, item)
		}
	}
	if len(unlistedInMarket) > 0 {
		p.addf("%d items in the market that no lister listed (e.g. %s)", len(unlistedInMarket), some(unlistedInMarket))
	}
	var unlistedBought []string
	for item := range owner {
		if s, n, ok := parseItemID(item); !ok || !listedBy(logs, s, n) {
			unlistedBought = append(unlistedBought, item)
		}
	}
	if len(unlistedBought) > 0 {
		p.addf("%d items bought that no lister listed (e.g. %s)", len(unlistedBought), some(unlistedBought))
	}

	if len(p.problems) > 0 {
		return zcard, p
	}
	return zcard, nil
}

// listedBy reports whether seller's lister listed its item n.
func listedBy(logs []workerLog, seller, n int) bool {
	for i := range logs {
		w := &logs[i]
		if w.seller == seller {
			if n >= w.next {
				return false
			}
			for _, x := range w.notListed {
				if x == n {
					return false
				}
			}
			return true
		}
	}
	return false
}

// checkSeller checks one seller: its inventory lost exactly the items it
// listed, and each listed item is in the market or in one buyer's
// inventory, not both.
func checkSeller(ctx context.Context, admin redis.UniversalClient, p *checkFailure, w *workerLog, inventory int, inMarket map[string]bool, owner map[string]int) error {
	inv := inventoryKey(w.seller)
	listedCount := w.listed + w.lateListed
	if got := int64(w.next - len(w.notListed)); got != listedCount {
		p.addf("seller %d: tried %d items, %d not listed, but counted %d listed", w.seller, w.next, len(w.notListed), listedCount)
	}
	card, err := admin.SCard(ctx, inv).Result()
	if err != nil {
		return err
	}
	if want := int64(inventory) - listedCount; card != want {
		p.addf("%s holds %d items, expected %d − %d listed = %d", inv, card, inventory, listedCount, want)
	}

	notListed := make(map[int]bool, len(w.notListed))
	for _, n := range w.notListed {
		notListed[n] = true
	}
	var stillHeld, lost, twice, kept []string
	const chunk = 5000
	for lo := 0; lo < w.next; lo += chunk {
		hi := min(lo+chunk, w.next)
		items := make([]any, 0, hi-lo)
		for n := lo; n < hi; n++ {
			items = append(items, itemID(w.seller, n))
		}
		held, err := admin.SMIsMember(ctx, inv, items...).Result()
		if err != nil {
			return err
		}
		for k, n := 0, lo; n < hi; k, n = k+1, n+1 {
			item := items[k].(string)
			_, sold := owner[item]
			if notListed[n] {
				if !held[k] {
					lost = append(lost, item)
				}
				if sold || inMarket[item] {
					kept = append(kept, item)
				}
				continue
			}
			if held[k] {
				stillHeld = append(stillHeld, item)
			}
			switch {
			case sold && inMarket[item]:
				twice = append(twice, item)
			case !sold && !inMarket[item]:
				lost = append(lost, item)
			}
		}
	}
	if len(stillHeld) > 0 {
		p.addf("seller %d: %d listed items still in its inventory (e.g. %s)", w.seller, len(stillHeld), some(stillHeld))
	}
	if len(kept) > 0 {
		p.addf("seller %d: %d unlisted items in the market or bought (e.g. %s)", w.seller, len(kept), some(kept))
	}
	if len(twice) > 0 {
		p.addf("seller %d: %d items both bought and still in the market (e.g. %s)", w.seller, len(twice), some(twice))
	}
	if len(lost) > 0 {
		p.addf("seller %d: %d items vanished (not in the inventory, the market or any buyer's) (e.g. %s)", w.seller, len(lost), some(lost))
	}
	return nil
}
