package rueidisdlock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/driver"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/rueidis"
)

// TestBatcherStopThenLateReply: a batched call is written to a paused
// server (SIGSTOP) and its caller's stop closes, as at the dlock Client's
// Close. With goBg accepting (the Client still starts goroutines), the
// caller returns driver.ErrStopped at once, though its ctx never ends, and
// the reply, once the server resumes and answers, reaches late on the
// goroutine goBg started: how a grant that came after Close is given back,
// with Close waiting for it. With goBg refusing (the Client no longer
// starts goroutines), a caller that left at stop hands the reply to late
// before it returns.
func TestBatcherStopThenLateReply(t *testing.T) {
	s := redistest.Start(t)
	// rueidis must not give the connection up while the server is paused:
	// the reply comes on it once the server resumes.
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{s.Addr()}, DisableCache: true, ForceSingleClient: true, ConnWriteTimeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	b := newConn(rc).batch
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := b.do(ctx, rc.B().Ping().Build(), nil, nil, nil); err != nil {
		t.Fatal(err) // the connection is up before the pause
	}
	type result struct {
		v   any
		err error
	}
	// stopped sends a SET to the paused server and closes stop once a
	// flusher took it. early: the call must return before the server is
	// resumed, and late get the reply after. Otherwise the server is
	// resumed at once; it returns what the call returned and what late
	// had by then (nil: nothing).
	stopped := func(goBg func(func()) bool, early bool) (ret result, got *result) {
		s.Pause()
		waitStopped(t, ctx, s.PID()) // SIGSTOP is delivered asynchronously
		resumed := false
		defer func() {
			if !resumed {
				s.Resume()
			}
		}()
		late, returned := make(chan result, 1), make(chan result, 1)
		stop := make(chan struct{})
		go func() {
			v, err := b.do(context.Background(), rc.B().Set().Key("stopped").Value("late").Build(),
				func(v any, err error) { late <- result{v, err} }, goBg, stop)
			returned <- result{v, err}
		}()
		for { // until a flusher took the call (it is being written)
			b.mu.Lock()
			taken := len(b.queue) == 0 && b.running > 0
			b.mu.Unlock()
			if taken {
				break
			}
			select {
			case <-ctx.Done():
				t.Fatal("the call never left the batcher's queue")
			case <-time.After(time.Millisecond):
			}
		}
		close(stop)
		if early {
			select {
			case ret = <-returned:
			case <-ctx.Done():
				t.Fatal("the call did not return at stop, the server paused")
			}
		}
		s.Resume()
		resumed = true
		if early {
			select {
			case r := <-late:
				got = &r
			case <-ctx.Done():
				t.Fatal("the reply that came after stop never reached late")
			}
			return ret, got
		}
		select {
		case ret = <-returned:
		case <-ctx.Done():
			t.Fatal("the call never returned")
		}
		select {
		case r := <-late:
			got = &r
		default:
		}
		return ret, got
	}

	// goBg accepting: the caller returns at stop, the server still
	// paused; late gets the reply on the goroutine goBg started.
	var started sync.WaitGroup
	ret, got := stopped(func(f func()) bool { started.Go(f); return true }, true)
	if !errors.Is(ret.err, driver.ErrStopped) {
		t.Fatalf("the stopped call returned %v, %v; want driver.ErrStopped", ret.v, ret.err)
	}
	if got.err != nil || got.v != "OK" {
		t.Fatalf("late got %v, %v; want the server's OK", got.v, got.err)
	}
	started.Wait()

	// goBg refusing. The caller may take the reply itself if it reaches
	// its wait only once the reply has come (the scheduler decides): then
	// late must not have it. Tried until the caller left at stop.
	refuse := func(func()) bool { return false }
	for try := 0; ; try++ {
		ret, got := stopped(refuse, false)
		if !errors.Is(ret.err, driver.ErrStopped) {
			if ret.err != nil || ret.v != "OK" || got != nil {
				t.Fatalf("goBg refusing: the call returned %v, %v and late got %v; want the reply once", ret.v, ret.err, got)
			}
			if try == 20 {
				t.Fatal("goBg refusing: the caller never left at stop in 20 tries")
			}
			continue
		}
		if got == nil || got.err != nil || got.v != "OK" {
			t.Fatalf("goBg refusing: the caller left at stop, and late had %v before it returned; want the server's OK", got)
		}
		break
	}
}

// waitStopped waits until process pid is stopped (state T in
// /proc/PID/stat), as a SIGSTOP makes it some time after kill returns.
func waitStopped(t *testing.T, ctx context.Context, pid int) {
	t.Helper()
	for {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Skipf("cannot read the server's state: %v", err)
		}
		// The state follows the command name, which is in parentheses.
		if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) && b[i+2] == 'T' {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatal("the server did not stop")
		case <-time.After(time.Millisecond):
		}
	}
}
