package dlock_test

import (
	"context"
	"fmt"
	"log"

	"github.com/dlock-go/dlock"
	"github.com/redis/go-redis/v9"
)

// Several names as one holding: a transfer locks both accounts, in one
// global order (so two transfers between the same accounts never
// deadlock), with one Lease and a fence per name. The README's "Several
// names as one lock" is this code (TestMultiLockReadmeIsExample).
func ExampleClient_MultiLock() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	locks := dlock.New(rdb)
	defer locks.Close()

	transfer := locks.MultiLock([]string{"account:bob", "account:alice"}) // any order
	lease, err := transfer.Lock(ctx)                                      // both, or none
	if err != nil {
		log.Fatal(err)
	}
	// Work under lease.Context(), which ends if either lock is lost, and
	// give each account's storage the fence of its own name.
	fmt.Println(lease.Names(), lease.FenceOf("account:alice") > 0)

	// Another transfer touching bob waits, or with TryLock is refused.
	_, err = locks.MultiLock([]string{"account:bob", "account:carol"}).TryLock(ctx)
	fmt.Println(err)

	if err := lease.Unlock(ctx); err != nil { // releases both
		log.Fatal(err)
	}
	// Output:
	// [account:alice account:bob] true
	// dlock: lock "account:bob": not obtained
}
