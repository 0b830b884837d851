package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/redis/go-redis/v9"
)

// A service moving to dlock shares its locks with services still on
// redsync, redis-py or node-redlock: StringMutex keeps the lock as they do,
// a string key holding a random value, under the very key they lock. Here
// another library's process holds the key, so TryLock is refused; Lock
// would wait for its release.
func ExampleClient_StringMutex() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	locks := dlock.New(rdb)
	defer locks.Close()

	// What redsync.NewMutex("reports:daily").Lock() does at Redis:
	rdb.SetNX(ctx, "reports:daily", "redsync-random-value", 8*time.Second)

	m := locks.StringMutex("reports:daily") // the key as the others name it: no prefix, no braces
	if _, err := m.TryLock(ctx); errors.Is(err, dlock.ErrNotObtained) {
		fmt.Println("held by the other library")
	}
	rdb.Del(ctx, "reports:daily") // its release

	lease, err := m.Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("locked; the key holds our token:", rdb.Get(ctx, "reports:daily").Val() == lease.Token())
	_ = lease.Unlock(ctx)
	// Output:
	// held by the other library
	// locked; the key holds our token: true
}
