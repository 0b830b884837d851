package market

// lockKind says which lock, if any, guards a variant's critical sections.
type lockKind int

const (
	lockNone     lockKind = iota // watch (optimistic) or lua (atomic script)
	lockFaithful                 // the book's SETNX lock
	lockDlock                    // Config.Locker
)

// variantSpec describes one row of the table.
type variantSpec struct {
	name  string
	label string // the book's wording for its rows
	// about says, for the table's legend, how the variant keeps a
	// purchase safe.
	about string
	book  bool // one of the book's rows (false: improved row)
	lock  lockKind
	fine  bool // lock per market entry instead of the whole market
	multi bool // fine, and the users the operation touches too, as one holding (MultiLocker)
	fair  bool // Locker asked for FIFO hand-off
	lua   bool
	// listTrips is the fewest round trips one listing can take; it sizes
	// the sellers' inventories so that no lister can run out.
	listTrips int
}

// variantSpecs is in table order.
var variantSpecs = []variantSpec{
	{name: VariantWatch, label: "WATCH", book: true,
		about:     "optimistic WATCH/MULTI/EXEC transactions: a purchase starts over when the market changed meanwhile",
		listTrips: 3},
	// SETNX, SISMEMBER, MULTI..EXEC, then WATCH, GET, MULTI DEL EXEC.
	{name: VariantCoarse, label: "coarse lock", book: true,
		about: "the book's lock (SETNX, tried again every 1 ms while taken) on the whole market",
		lock:  lockFaithful, listTrips: 6},
	{name: VariantFine, label: "fine lock", book: true,
		about: "the book's lock on each item",
		lock:  lockFaithful, fine: true, listTrips: 6},
	// At least one trip to lock and one to unlock around SISMEMBER and
	// MULTI..EXEC.
	{name: VariantDlockCoarse, label: "dlock coarse",
		about: "a dlock Mutex on the whole market: a release wakes the next waiter, nobody polls",
		lock:  lockDlock, listTrips: 4},
	{name: VariantDlockFine, label: "dlock fine",
		about: "a dlock Mutex on each item",
		lock:  lockDlock, fine: true, listTrips: 4},
	{name: VariantDlockFairFine, label: "dlock fair fine",
		about: "a dlock Mutex with Fair() on each item: waiters served in arrival order",
		lock:  lockDlock, fine: true, fair: true, listTrips: 4},
	{name: VariantDlockMulti, label: "dlock multi",
		about: "a dlock MultiLock on the entry and the users it touches (buyer and seller, as a bank transfer locks both accounts), taken as one",
		lock:  lockDlock, fine: true, multi: true, listTrips: 4},
	{name: VariantLua, label: "Lua script",
		about: "no lock: each listing and purchase is one Lua script, the fewest round trips possible",
		lua:   true, listTrips: 1},
}

// specFor returns the variant named name, or nil.
func specFor(name string) *variantSpec {
	for i := range variantSpecs {
		if variantSpecs[i].name == name {
			return &variantSpecs[i]
		}
	}
	return nil
}
