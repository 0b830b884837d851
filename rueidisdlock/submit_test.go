package rueidisdlock

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/driver"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/rueidis"
)

// TestBatcherStopThenLateReply: a batched call is written to a paused
// server (SIGSTOP) and its caller's stop closes, as at the dlock Client's
// Close: the caller returns driver.ErrStopped at once, though its ctx never
// ends. The server then resumes and answers; the reply, whose caller left
// after its Client closed (goBg refuses, as after Close), still reaches
// late, which is how a grant that came after Close is given back.
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
	refuse := func(func()) bool { return false }
	if _, err := b.do(ctx, rc.B().Ping().Build(), nil, refuse, nil); err != nil {
		t.Fatal(err) // the connection is up before the pause
	}

	s.Pause()
	resumed := false
	defer func() {
		if !resumed {
			s.Resume()
		}
	}()
	type result struct {
		v   any
		err error
	}
	late, returned := make(chan result, 1), make(chan result, 1)
	stop := make(chan struct{})
	go func() {
		v, err := b.do(context.Background(), rc.B().Set().Key("stopped").Value("late").Build(),
			func(v any, err error) { late <- result{v, err} }, refuse, stop)
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
			t.Fatal("the call never left the batcher's queue")
		case <-time.After(time.Millisecond):
		}
	}
	close(stop)
	select {
	case r := <-returned:
		if !errors.Is(r.err, driver.ErrStopped) {
			t.Fatalf("the stopped call returned %v, %v; want driver.ErrStopped", r.v, r.err)
		}
	case <-ctx.Done():
		t.Fatal("the call did not return at stop, the server paused")
	}
	s.Resume()
	resumed = true
	select {
	case r := <-late:
		if r.err != nil || r.v != "OK" {
			t.Fatalf("late got %v, %v; want the server's OK", r.v, r.err)
		}
	case <-ctx.Done():
		t.Fatal("the reply that came after stop never reached late (goBg refused)")
	}
}
