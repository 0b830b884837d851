package rueidisdlock

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
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
// starts goroutines), the caller waits for the reply and hands it to late
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
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := b.do(ctx, rc.B().Ping().Build(), nil, nil, nil); err != nil {
		t.Fatal(err) // the connection is up before the pause
	}
	type result struct {
		v   any
		err error
	}
	for _, accept := range []bool{true, false} {
		var started sync.WaitGroup // the goroutines goBg started
		goBg := func(f func()) bool {
			if accept {
				started.Go(f)
			}
			return accept
		}
		s.Pause()
		late, returned := make(chan result, 1), make(chan result, 1)
		var lateRan atomic.Bool
		stop := make(chan struct{})
		go func() {
			v, err := b.do(context.Background(), rc.B().Set().Key("stopped").Value("late").Build(),
				func(v any, err error) { lateRan.Store(true); late <- result{v, err} }, goBg, stop)
			if !lateRan.Load() && !accept {
				err = errors.New("returned before late had the reply")
			}
			returned <- result{v, err}
		}()
		// Wait until a flusher took the call (it is being written), then stop.
		for {
			b.mu.Lock()
			taken := len(b.queue) == 0 && b.running > 0
			b.mu.Unlock()
			if taken {
				break
			}
			select {
			case <-ctx.Done():
				s.Resume()
				t.Fatal("the call never left the batcher's queue")
			case <-time.After(time.Millisecond):
			}
		}
		close(stop)
		if accept {
			select {
			case r := <-returned:
				if !errors.Is(r.err, driver.ErrStopped) {
					t.Errorf("the stopped call returned %v, %v; want driver.ErrStopped", r.v, r.err)
				}
			case <-ctx.Done():
				s.Resume()
				t.Fatal("the call did not return at stop, the server paused")
			}
		}
		s.Resume()
		select {
		case r := <-late:
			if r.err != nil || r.v != "OK" {
				t.Errorf("goBg accepting %v: late got %v, %v; want the server's OK", accept, r.v, r.err)
			}
		case <-ctx.Done():
			t.Fatalf("goBg accepting %v: the reply that came after stop never reached late", accept)
		}
		if !accept {
			if r := <-returned; !errors.Is(r.err, driver.ErrStopped) {
				t.Errorf("the stopped call, goBg refusing, returned %v, %v; want driver.ErrStopped once late had the reply", r.v, r.err)
			}
		}
		started.Wait()
	}
}
