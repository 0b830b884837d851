package dlock_test

import (
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// TestSentinelFailover runs dlock through a go-redis failover client on
// topology R (primary, replica, three sentinels): waiters are woken by
// message before and after a failover, and fences keep increasing across it.
// (A lock granted just before a failover can be lost with the writes the
// replica had not received: docs/SAFETY.md; not what this test checks.)
func TestSentinelFailover(t *testing.T) {
	r := redistest.StartReplicated(t)
	ctx := ctxT(t, 90*time.Second)
	var clients []*dlock.Client
	for i := 0; i < 2; i++ {
		c := dlock.New(r.Client(t))
		t.Cleanup(func() { _ = c.Close() })
		clients = append(clients, c)
	}
	var last uint64
	handOffs := func(phase string) {
		t.Helper()
		start := time.Now()
		var mu sync.Mutex
		var inside, most int
		var wg sync.WaitGroup
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 20; i++ {
					l, err := clients[g%2].Mutex("ha").Lock(ctx)
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					inside++
					most = max(most, inside)
					if l.Fence() <= last {
						t.Errorf("%s: fence %d after %d", phase, l.Fence(), last)
					}
					last = l.Fence()
					mu.Unlock()
					time.Sleep(2 * time.Millisecond)
					mu.Lock()
					inside--
					mu.Unlock()
					if err := l.Unlock(ctx); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		if most != 1 {
			t.Fatalf("%s: %d holders at once", phase, most)
		}
		if el := time.Since(start); el > 3*time.Second {
			t.Fatalf("%s: 80 hand-offs took %v: waiters are not woken", phase, el)
		} else {
			t.Logf("%s: 80 hand-offs in %v", phase, el)
		}
	}
	handOffs("before the failover")
	r.Failover(t)
	// The failover client finds the new primary; a lock call during the
	// switch may fail (READONLY, reconnects) but must never report success
	// wrongly, and calls succeed again within a bound.
	deadline := time.Now().Add(20 * time.Second)
	for {
		l, err := clients[0].Mutex("ha").TryLock(ctx)
		if err == nil {
			if l.Fence() <= last {
				t.Fatalf("fence %d after the failover, %d before", l.Fence(), last)
			}
			last = l.Fence()
			_ = l.Unlock(ctx)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no lock 20s after the failover: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	handOffs("after the failover")
}
