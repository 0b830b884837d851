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

// addr is the Redis server the examples use: in your code, yours (for
// example "127.0.0.1:6379"); under go test, a private redis-server that
// TestMain starts.
var addr = "127.0.0.1:6379"

// quorumAddrs are the independent masters of the quorum example: in your
// code, yours; under go test, private redis-servers that TestMain starts.
var quorumAddrs []string

// The README's first program, and the package doc's: a Client, a Mutex with
// an option, Lock, a TryLock refused with ErrNotObtained, Unlock.
// TestUsageIsExample keeps the three the same.
func Example() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	locks := dlock.New(rdb) // one Client per process: it renews every lease it hands out
	defer locks.Close()

	invoice := locks.Mutex("invoice:42", dlock.TTL(15*time.Second)) // options follow the name
	lease, err := invoice.Lock(ctx)                                 // waits, notified, until free or ctx ends
	if err != nil {
		log.Fatal(err) // errors.Is(err, ctx.Err()) when ctx ended first
	}
	// Work under lease.Context(), which ends if the lock is lost, and give
	// lease.Fence() to storage so that it can refuse a holder that lost it.
	fmt.Println("locked", lease.Name())

	if _, err := locks.Mutex("invoice:42").TryLock(ctx); errors.Is(err, dlock.ErrNotObtained) {
		fmt.Println("TryLock: held by someone else")
	}
	if err := lease.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("unlocked")
	// Output:
	// locked invoice:42
	// TryLock: held by someone else
	// unlocked
}

func ExampleMutex_Lock() {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	locks := dlock.New(rdb)
	defer locks.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	report := locks.Mutex("report:daily", dlock.TTL(15*time.Second))
	first, err := report.Lock(ctx)
	if err != nil {
		log.Fatal(err) // errors.Is(err, context.DeadlineExceeded) after 30s of waiting
	}

	// A second Lock waits until the first is unlocked, then gets a larger fence.
	next := make(chan *dlock.Lease)
	go func() {
		l, err := report.Lock(ctx)
		if err != nil {
			log.Fatal(err)
		}
		next <- l
	}()
	time.Sleep(10 * time.Millisecond)
	_ = first.Unlock(ctx)
	second := <-next
	defer second.Unlock(context.Background())
	fmt.Println("fence increased:", second.Fence() > first.Fence())
	// Output: fence increased: true
}

func ExampleMutex_TryLock() {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	locks := dlock.New(rdb)
	defer locks.Close()

	ctx := context.Background()
	cleanup := locks.Mutex("cron:cleanup")
	lease, err := cleanup.TryLock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Unlock(ctx)

	// Another instance of the job finds it taken.
	_, err = cleanup.TryLock(ctx)
	fmt.Println(errors.Is(err, dlock.ErrNotObtained))
	// Output: true
}

// Do locks, runs the function with the lease's context, and unlocks.
func ExampleMutex_Do() {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	locks := dlock.New(rdb)
	defer locks.Close()

	err := locks.Mutex("ledger").Do(context.Background(), func(ctx context.Context) error {
		fmt.Println("in the critical section")
		return nil
	})
	fmt.Println(err)
	// Output:
	// in the critical section
	// <nil>
}

// Reentrancy follows the context: a Lock whose ctx comes from a lease of
// the same lock re-enters it instead of waiting for itself.
func ExampleLease_Context() {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	locks := dlock.New(rdb)
	defer locks.Close()

	ctx := context.Background()
	account := locks.Mutex("account:7")
	outer, err := account.Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer outer.Unlock(ctx)

	inner, err := account.Lock(outer.Context()) // re-enters at once
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(inner.Fence() == outer.Fence())
	_ = inner.Unlock(ctx) // the lock stays held until outer unlocks
	// Output: true
}

// A weighted semaphore: at most 8 GPUs in use across every process; a job
// that needs 4 is not starved by a stream of jobs that need 1.
func ExampleSemaphore_Acquire() {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	locks := dlock.New(rdb)
	defer locks.Close()

	ctx := context.Background()
	gpus := locks.Semaphore("gpus", 8)
	lease, err := gpus.Acquire(ctx, 4) // waits in line, in arrival order
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Unlock(ctx)
	// If this process dies, its 4 permits come back when its lease runs out.
	_, err = gpus.TryAcquire(ctx, 5)
	fmt.Println("5 more:", err != nil)
	more, err := gpus.TryAcquire(ctx, 4)
	fmt.Println("4 more:", err == nil)
	_ = more.Unlock(ctx)
	// Output:
	// 5 more: true
	// 4 more: true
}

// Readers share, a writer is alone; once a writer waits, new readers wait
// behind it.
func ExampleRWMutex() {
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	locks := dlock.New(rdb)
	defer locks.Close()

	ctx := context.Background()
	catalog := locks.RWMutex("catalog")
	r1, err := catalog.RLock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	r2, err := catalog.TryRLock(ctx)
	fmt.Println("two readers:", err == nil)
	_, err = catalog.TryLock(ctx)
	fmt.Println("writer while reading:", errors.Is(err, dlock.ErrNotObtained))
	_ = r1.Unlock(ctx)
	_ = r2.Unlock(ctx)

	w, err := catalog.Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer w.Unlock(ctx)
	fmt.Println("writer alone, fence above the readers':", w.Fence() > r2.Fence())
	// Output:
	// two readers: true
	// writer while reading: true
	// writer alone, fence above the readers': true
}

// Quorum mode: the lock is held on a majority of independent masters, so
// one master's failure neither loses it nor lets a second holder in.
func ExampleNewQuorum() {
	ctx := context.Background()
	var masters []redis.UniversalClient
	for _, a := range quorumAddrs {
		rdb := redis.NewClient(&redis.Options{Addr: a})
		defer rdb.Close()
		masters = append(masters, rdb)
	}
	locks, err := dlock.NewQuorum(masters)
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()

	err = locks.Mutex("ledger").Do(ctx, func(ctx context.Context) error {
		fmt.Println("held on a majority of", len(masters), "masters")
		return nil
	})
	if err != nil {
		log.Fatal(err)
	}
	// Output: held on a majority of 3 masters
}
