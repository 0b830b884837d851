package dlock_test

import (
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"go.uber.org/goleak"
)

// TestStringWaitSubscribesAfterClose: a string lock's waiter that Close
// overtakes just before it subscribes (its turn came before Close) returns
// ErrClosed and leaves nothing running: the keyspace hub, made at the
// first wait, is not made after Close has closed it.
func TestStringWaitSubscribesAfterClose(t *testing.T) {
	s := redistest.Start(t)
	rdb := s.Client(t)
	ctx := ctxT(t, 10*time.Second)
	foreignTake(t, ctx, rdb, "closing", time.Minute)
	c := newDlock(t, rdb)
	before := goleak.IgnoreCurrent() // rdb's, and no hub runs before a wait
	dlock.SetSubscribeHook(c, func() { _ = c.Close() })
	if _, err := c.StringMutex("closing").Lock(ctx); !errors.Is(err, dlock.ErrClosed) {
		t.Fatalf("Lock across Close: %v, want ErrClosed", err)
	}
	// Find retries a while: goroutines Close ended may be on their way out.
	if err := goleak.Find(before, goleak.IgnoreAnyFunction("github.com/dlock-go/dlock/internal/redisproc.spawnLoop")); err != nil {
		t.Fatalf("left running after Close: %v", err)
	}
}
