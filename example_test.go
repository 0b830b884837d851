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

// The 30-second tour: one lock around a critical section, with the fence
// passed to storage so that a holder that lost its lease cannot overwrite a
// newer one.
func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	locks := dlock.New(rdb)
	defer locks.Close()

	ctx := context.Background()
	lease, err := locks.Mutex("invoice:42").Lock(ctx) // waits, notified, until ctx ends
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Unlock(ctx)

	// lease.Context() ends if the lease is lost (renewal failed, key deleted,
	// expired): pass it to the work, and pass the fence to storage.
	if err := saveInvoice(lease.Context(), lease.Fence()); err != nil {
		log.Fatal(err)
	}
}

func ExampleMutex_Lock() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	locks := dlock.New(rdb)
	defer locks.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	lease, err := locks.Mutex("report:daily", dlock.TTL(15*time.Second)).Lock(ctx)
	if err != nil {
		log.Fatal(err) // errors.Is(err, context.DeadlineExceeded) after 30s of waiting
	}
	defer lease.Unlock(context.Background())

	// Storage that remembers the highest fence it has seen rejects stale writers.
	fmt.Println("writing with fence", lease.Fence())
	select {
	case <-lease.Context().Done():
		log.Println("lost the lock:", context.Cause(lease.Context()))
	default:
	}
}

func ExampleMutex_TryLock() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	locks := dlock.New(rdb)
	defer locks.Close()

	ctx := context.Background()
	lease, err := locks.Mutex("cron:cleanup").TryLock(ctx)
	if errors.Is(err, dlock.ErrNotObtained) {
		return // another instance runs it
	}
	if err != nil {
		log.Fatal(err)
	}
	defer lease.Unlock(ctx)
	// ... the job ...
}

// Reentrancy follows the context: a Lock whose ctx comes from a lease of
// the same lock re-enters it instead of waiting for itself.
func ExampleLease_Context() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
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
}

func saveInvoice(ctx context.Context, fence uint64) error { return ctx.Err() }

// A weighted semaphore: at most 8 GPUs in use across every process; a job
// that needs 4 is not starved by a stream of jobs that need 1.
func ExampleSemaphore_Acquire() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
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
	train(lease.Context())
}

// Readers share, a writer is alone; once a writer waits, new readers wait
// behind it.
func ExampleRWMutex() {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	locks := dlock.New(rdb)
	defer locks.Close()

	ctx := context.Background()
	catalog := locks.RWMutex("catalog")
	r, err := catalog.RLock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	readCatalog(r.Context())
	_ = r.Unlock(ctx)

	w, err := catalog.Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	defer w.Unlock(ctx)
	writeCatalog(w.Context(), w.Fence())
}

func train(context.Context)                {}
func readCatalog(context.Context)          {}
func writeCatalog(context.Context, uint64) {}
