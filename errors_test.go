package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// TestErrorMessagesSayEachFactOnce: every error names the package once, at
// its start, then the lock, then one clause per fact, and still matches its
// sentinels with errors.Is.
func TestErrorMessagesSayEachFactOnce(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 10*time.Second)
	check := func(what string, err error, want string, is ...error) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s: no error", what)
		}
		if err.Error() != want {
			t.Errorf("%s:\n got %q\nwant %q", what, err.Error(), want)
		}
		for _, target := range is {
			if !errors.Is(err, target) {
				t.Errorf("%s: %v is not %v", what, err, target)
			}
		}
	}

	held, err := c.Mutex("busy").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Mutex("busy").TryLock(ctx)
	check("TryLock on a held lock", err, `dlock: lock "busy": not obtained`, dlock.ErrNotObtained)

	lost := fmt.Errorf("%w: the test says so", dlock.ErrLockLost)
	lctx, cancel := context.WithCancelCause(ctx)
	cancel(lost)
	_, err = c.Mutex("busy").Lock(lctx)
	check("Lock with a context ended by a cause", err, `dlock: lock "busy": context canceled (lock lost: the test says so)`, context.Canceled, dlock.ErrLockLost)

	rdb.RPush(ctx, "dlock:{xl}", "a list")
	_, err = c.Mutex("xl").TryLock(ctx)
	check("a list", err, `dlock: lock "xl": Redis key "dlock:{xl}" is not a hash, so not a dlock mutex`, dlock.ErrForeignKey)
	rdb.HSet(ctx, "dlock:{h}", "field", "x")
	_, err = c.Semaphore("h", 2).Acquire(ctx, 1)
	check("a hash", err, `dlock: lock "h": Redis key "dlock:{h}" is a hash that dlock did not write, not a dlock semaphore`, dlock.ErrForeignKey)
	_, err = c.Semaphore("busy", 2).Acquire(ctx, 1)
	check("a mutex", err, `dlock: lock "busy": Redis key "dlock:{busy}" is a dlock mutex, not a semaphore`, dlock.ErrForeignKey)

	if _, err := c.Semaphore("pool", 3).Acquire(ctx, 1); err != nil {
		t.Fatal(err)
	}
	_, err = c.Semaphore("pool", 5).Acquire(ctx, 1)
	check("another size", err, `dlock: lock "pool": invalid argument: the semaphore is in use with size 3, not 5: every client must give it the same size`, dlock.ErrInvalidArgument)

	// The key replaced under a holder: its release reports the loss and
	// what it found.
	rdb.Del(ctx, "dlock:{busy}")
	rdb.RPush(ctx, "dlock:{busy}", "a list")
	err = held.Unlock(ctx)
	check("Unlock of a key now a list", err, `dlock: lock "busy": lock lost: Redis key "dlock:{busy}" is not a hash, so not a dlock mutex`, dlock.ErrLockLost, dlock.ErrForeignKey)
	if strings.Count(err.Error(), "dlock: ") != 1 {
		t.Errorf("prefix repeated: %v", err)
	}
}
