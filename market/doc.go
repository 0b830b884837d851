// Package market reproduces the marketplace experiment of Redis in Action,
// chapter 6 ("Distributed locking"), on a real Redis server.
//
// Sellers (listers) move items from their inventories into a market sorted
// set; buyers pick one of the cheapest items and buy it, moving funds from
// buyer to seller and the item into the buyer's inventory. Every operation
// runs in one of several variants:
//
//   - "watch": optimistic WATCH/MULTI/EXEC transactions; an aborted EXEC is a
//     retry (the book's first row).
//   - "coarse": the book's lock (SETNX with a random token, 1 ms polling,
//     10 s timeout, no expiry, WATCH-checked release) on the single name
//     "market:".
//   - "fine": the same lock, one per market entry ("market:" + member).
//   - "dlock-coarse", "dlock-fine", "dlock-fair-fine": the same critical
//     sections under a modern lock supplied through [Locker] (improved rows,
//     not in the book).
//   - "dlock-multi": fine, with the users an operation touches locked
//     together with the entry as one holding (a purchase: the entry, the
//     buyer and the seller; a listing: the entry and the seller), through
//     [MultiLocker].
//   - "lua": list and purchase each as one atomic script, no lock at all: the
//     floor on round trips (improved row).
//
// [Run] runs every load (listers/buyers) with every variant for a fixed
// duration, counts what completed before the deadline, and checks
// conservation after each cell: total funds unchanged, every item in exactly
// one place, and listed = bought + still listed + in flight. A failed check
// is returned as a [*CheckError]; a variant that moves money or items
// wrongly cannot pass silently.
//
// Run flushes the database it is given before every cell: point it at a
// server (or database number) that holds nothing of value.
//
// The data model is the book's: the market is the sorted set "market:" with
// members "<item>.<seller>" scored by price; users are hashes "users:<id>"
// with an integer "funds" field; inventories are sets "inventory:<id>" of
// item ids. Seller ids are 1..L and buyer ids 1001... One fix: item ids are
// unique across sellers ("Item3-17" is seller 3's 18th item), since buyer
// inventories hold bare item ids and the book's "Item17" from two sellers
// would collapse into one member and the item check could not balance.
package market
