package market

import (
	_ "embed"
	"fmt"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The data model (see the package documentation).
const (
	marketKey = "market:"
	// firstBuyer is the id of buyer 0; sellers are 1..L, so ids never
	// overlap.
	firstBuyer = 1001
	// buyerFunds is each buyer's starting balance: prices are 1..100, so it
	// never binds.
	buyerFunds = int64(1_000_000_000_000)
	// maxPrice bounds the listers' prices (1..maxPrice).
	maxPrice = 100
)

func userKey(id int) string      { return "users:" + strconv.Itoa(id) }
func inventoryKey(id int) string { return "inventory:" + strconv.Itoa(id) }

// itemID names seller's n-th item; unique across sellers.
func itemID(seller, n int) string { return fmt.Sprintf("Item%d-%d", seller, n) }

// memberOf is the market member for item listed by seller.
func memberOf(item string, seller int) string { return item + "." + strconv.Itoa(seller) }

// splitMember splits a market member at its last '.' into item and seller.
func splitMember(member string) (item string, seller int, err error) {
	i := strings.LastIndexByte(member, '.')
	if i < 0 {
		return "", 0, fmt.Errorf("market: malformed market member %q", member)
	}
	seller, err = strconv.Atoi(member[i+1:])
	if err != nil {
		return "", 0, fmt.Errorf("market: malformed market member %q", member)
	}
	return member[:i], seller, nil
}

// parseItemID returns the seller and index encoded in an item id.
func parseItemID(item string) (seller, n int, ok bool) {
	rest, found := strings.CutPrefix(item, "Item")
	if !found {
		return 0, 0, false
	}
	s, i, found := strings.Cut(rest, "-")
	if !found {
		return 0, 0, false
	}
	seller, err1 := strconv.Atoi(s)
	n, err2 := strconv.Atoi(i)
	return seller, n, err1 == nil && err2 == nil
}

var (
	//go:embed lua/list.lua
	listSrc string
	//go:embed lua/purchase.lua
	purchaseSrc string

	listScript     = redis.NewScript(listSrc)
	purchaseScript = redis.NewScript(purchaseSrc)
)
