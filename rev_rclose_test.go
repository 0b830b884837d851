package dlock_test

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/rueidisdlock"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// TestRevRcloseCloseWithoutClientTimeout: the user's Redis client has no
// I/O timeout of its own (go-redis ReadTimeout and WriteTimeout -1;
// rueidis ConnWriteTimeout -1, which also turns off its keep-alive PING).
// A Lock whose ctx ends while the server is stopped leaves its acquire in
// flight on a goroutine of the Client's, which waits for the reply so
// that a late grant can be given back; Close waits for that goroutine.
// With the server still stopped, Close must still return (SAFETY.md:
// "Close within 20 s"); it waits for a reply that never comes. On
// failure the goroutines are dumped.
func TestRevRcloseCloseWithoutClientTimeout(t *testing.T) {
	t.Skip("a documented limit (docs/SAFETY.md, Close; Client.Close's doc): Close waits for the replies of calls still in flight so that a late grant is given back, and only the Redis client's I/O timeout bounds that wait; with none, Close on a stopped server waits until it answers (the tracked goroutines: the give-back of a Lock that left, and over rueidis the batcher's wait for its acquire's reply)")
	ctx := ctxT(t, 60*time.Second)
	s := redistest.Start(t)
	rdb := s.Client(t, func(o *redis.Options) { o.ReadTimeout, o.WriteTimeout = -1, -1 })
	var c *dlock.Client
	if onRueidis() {
		o := rueidisOptions(t, rdb)
		o.ConnWriteTimeout = -1 // no timeout: a stopped server is waited for
		rc, err := rueidis.NewClient(o)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(rc.Close)
		if c, err = rueidisdlock.New(rc); err != nil {
			t.Fatal(err)
		}
	} else {
		c = dlock.New(rdb)
	}
	warmUp(t, ctx, c, "rev-rclose-notimeout")
	s.Pause()
	t.Cleanup(s.Resume) // runs before the clients' own cleanups
	lctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	if l, err := c.Mutex("rev-rclose-notimeout").Lock(lctx); err == nil {
		t.Fatalf("obtained %v from a stopped server", l)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("Lock returned %v after its 300ms ctx", d)
	}
	closed := make(chan struct{})
	start = time.Now()
	go func() { _ = c.Close(); close(closed) }()
	select {
	case <-closed:
		t.Logf("Close returned after %v", time.Since(start))
	case <-time.After(20 * time.Second):
		buf := make([]byte, 1<<20)
		t.Logf("%s", buf[:runtime.Stack(buf, true)])
		s.Resume()
		<-closed
		t.Fatalf("Close did not return within 20s with the server stopped (it returned %v after the server resumed)", time.Since(start))
	}
}
