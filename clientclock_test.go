package dlock_test

// Fault 11 of docs/SAFETY.md: the client's wall clock jumps. dlock must
// measure every duration and deadline on Go's monotonic clock, so nothing
// changes. TestFault11ClientWallClockJumps moves a holder process's wall
// clock for real (internal/wallclock); TestFault11NoWallClock checks the
// source for anything that would read or compare the wall clock.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/wallclock"
	"github.com/redis/go-redis/v9"
)

func init() { familyRoles["wall-hold"] = childWallHold }

// childWallHold: "ttl". Take the lock "wall", print "locked TOKEN FENCE",
// then answer each stdin line:
//
//	now        "now UNIXNANO" (the wall clock)
//	state      "state live", or "state ended CAUSE"
//	extend     "extend ERR"
//	wait-lost  "wait-lost lost=IS_LOCK_LOST CAUSE" once the lease ends,
//	           "wait-lost kept" if it has not 10 s later (monotonic)
//	unlock     "unlock lost=IS_LOCK_LOST ERR"
func childWallHold(c *dlock.Client, _ *redis.Client, arg string) error {
	ttl, err := time.ParseDuration(arg)
	if err != nil {
		return err
	}
	ctx := context.Background()
	l, err := c.Mutex("wall", dlock.TTL(ttl)).Lock(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("locked %s %d\n", l.Token(), l.Fence())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch cmd := in.Text(); cmd {
		case "now":
			fmt.Printf("now %d\n", time.Now().UnixNano())
		case "state":
			if l.Context().Err() == nil {
				fmt.Println("state live")
			} else {
				fmt.Printf("state ended %v\n", context.Cause(l.Context()))
			}
		case "extend":
			fmt.Printf("extend %v\n", l.Extend(ctx, ttl))
		case "wait-lost":
			select {
			case <-l.Context().Done():
				cause := context.Cause(l.Context())
				fmt.Printf("wait-lost lost=%v %v\n", errors.Is(cause, dlock.ErrLockLost), cause)
			case <-time.After(10 * time.Second):
				fmt.Println("wait-lost kept")
			}
		case "unlock":
			err := l.Unlock(ctx)
			fmt.Printf("unlock lost=%v %v\n", errors.Is(err, dlock.ErrLockLost), err)
		default:
			return fmt.Errorf("unknown command %q", cmd)
		}
	}
	return nil
}

// Fault 11, for real: a holder process's wall clock jumps an hour forward,
// then two hours back, while its lock is held and renewed. Its lease does
// not end at the jump, it renews, Extend works, the lock stays exclusive;
// and when Redis is frozen and the clock jumps back at once, the lease
// still ends by its deadline (not an hour later): the deadline is on the
// monotonic clock.
func TestFault11ClientWallClockJumps(t *testing.T) {
	s := redistest.Start(t)
	c2, rdb := newClient(t, s)
	ctx := ctxT(t, 60*time.Second)
	const ttl = time.Second
	wc, err := wallclock.Command(os.Args[0], "-test.run=^$")
	if errors.Is(err, errors.ErrUnsupported) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	stdin, sc := launchChild(t, wc, wc.Cmd, "wall-hold", s.Addr(), ttl.String())
	locked := strings.Fields(expectLine(t, sc, "locked "))
	ask := func(cmd string) string {
		t.Helper()
		if _, err := fmt.Fprintln(stdin, cmd); err != nil {
			t.Fatal(err)
		}
		return expectLine(t, sc, cmd+" ")
	}
	jump := func(off time.Duration) {
		t.Helper()
		if err := wc.SetOffset(off); err != nil {
			t.Fatal(err)
		}
		// The child's clock did move (else this test proves nothing); the
		// bounds are far from both the offset and zero.
		ns, _ := strconv.ParseInt(ask("now"), 10, 64)
		if d := time.Until(time.Unix(0, ns)); d < off-time.Minute || d > off+time.Minute {
			t.Fatalf("child's wall clock %v from ours, want %v", d, off)
		}
	}

	jump(time.Hour)
	// At once: a deadline kept on the wall clock would have passed now.
	if st := ask("state"); st != "live" {
		t.Fatalf("lease after the wall clock jumped forward: %s", st)
	}
	waitRenewals(t, ctx, rdb, "dlock:{wall}", ttl, 4, func() {
		if _, err := c2.Mutex("wall").TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
			t.Fatalf("TryLock while the child holds: %v, want ErrNotObtained", err)
		}
	})
	if st := ask("state"); st != "live" {
		t.Fatalf("lease after four renewals on the moved clock: %s", st)
	}
	if e := ask("extend"); e != "<nil>" {
		t.Fatalf("Extend after the jump: %s", e)
	}

	// Redis frozen, so nothing renews the lease, and the clock two hours
	// back: a deadline on the wall clock would be two hours away.
	s.Pause()
	jump(-time.Hour)
	st := ask("wait-lost")
	s.Resume()
	if !strings.HasPrefix(st, "lost=true ") {
		t.Fatalf("lease with Redis frozen past its TTL and the wall clock moved back: %s, want lost with ErrLockLost", st)
	}
	if u := ask("unlock"); !strings.HasPrefix(u, "lost=true ") {
		t.Fatalf("Unlock of the lost lease: %s, want ErrLockLost", u)
	}
	l, err := c2.Mutex("wall").TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock after the child's lease ended: %v", err)
	}
	if fence, _ := strconv.ParseUint(locked[1], 10, 64); l.Fence() <= fence {
		t.Fatalf("fence %d not above the child's %d", l.Fence(), fence)
	}
	_ = l.Unlock(ctx)
}
