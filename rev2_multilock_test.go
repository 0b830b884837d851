package dlock_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// slowSub is a dialer whose connections deliver what the server sends
// late, by delay, once they have written a (S)SUBSCRIBE: the network
// between a Client's subscription connection and Redis is slow, its
// command connections are not. Messages keep their order; nothing is
// lost.
type slowSub struct{ delay atomic.Int64 } // nanoseconds; 0: no delay

func (s *slowSub) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	sc := &slowConn{Conn: c, s: s, in: make(chan slowChunk, 1024)}
	go sc.pump()
	return sc, nil
}

type slowChunk struct {
	b   []byte
	at  time.Time
	err error
}

type slowConn struct {
	net.Conn
	s   *slowSub
	sub atomic.Bool
	in  chan slowChunk

	mu       sync.Mutex
	deadline time.Time
	cur      *slowChunk // being read
}

func (c *slowConn) pump() {
	for {
		b := make([]byte, 32<<10)
		n, err := c.Conn.Read(b)
		c.in <- slowChunk{b: b[:n], at: time.Now(), err: err}
		if err != nil {
			return
		}
	}
}

func (c *slowConn) Write(b []byte) (int, error) {
	if bytes.Contains(bytes.ToLower(b), []byte("subscribe")) {
		c.sub.Store(true)
	}
	return c.Conn.Write(b)
}

func (c *slowConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	dl, cur := c.deadline, c.cur
	c.mu.Unlock()
	var expire <-chan time.Time
	if !dl.IsZero() {
		t := time.NewTimer(time.Until(dl))
		defer t.Stop()
		expire = t.C
	}
	if cur == nil {
		select {
		case ch := <-c.in:
			cur = &ch
		case <-expire:
			return 0, os.ErrDeadlineExceeded
		}
		c.mu.Lock()
		c.cur = cur
		c.mu.Unlock()
	}
	if d := time.Duration(c.s.delay.Load()); d > 0 && c.sub.Load() {
		if wait := time.Until(cur.at.Add(d)); wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-t.C:
			case <-expire:
				t.Stop()
				return 0, os.ErrDeadlineExceeded
			}
		}
	}
	if len(cur.b) == 0 && cur.err != nil {
		return 0, cur.err
	}
	n := copy(p, cur.b)
	cur.b = cur.b[n:]
	if len(cur.b) == 0 && cur.err == nil {
		c.mu.Lock()
		c.cur = nil
		c.mu.Unlock()
	}
	return n, nil
}

func (c *slowConn) SetDeadline(t time.Time) error {
	_ = c.SetReadDeadline(t)
	return c.Conn.SetWriteDeadline(t)
}

func (c *slowConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	c.deadline = t
	c.mu.Unlock()
	return nil
}

// TestMultiLockLateHandOverOfAnotherPart: the parts of a MultiLock
// share one token, and a hand-over message names only the token. The
// MultiLock waits in a's line; a's holder releases, handing a to the
// token, but the message is slow (the subscription's link is); the
// waiter's refresh finds a already its own and goes on to wait for b,
// held by Y, with the same token. When a's message arrives it is taken as
// a hand-over of b: the MultiLock returns holding b while Y still holds it.
func TestMultiLockLateHandOverOfAnotherPart(t *testing.T) {
	s := redistest.Start(t)
	cs, rdb := newClients(t, s, 2)
	x, y := cs[0], cs[1]
	slow := &slowSub{}
	srdb := s.Client(t, func(o *redis.Options) { o.Dialer = slow.dial })
	m := newDlock(t, srdb)
	t.Cleanup(func() { _ = m.Close() })
	ctx := ctxT(t, 20*time.Second)
	la, err := x.Mutex("stale/a").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lb, err := y.Mutex("stale/b").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	slow.delay.Store(int64(700 * time.Millisecond))
	got := async(t, ctx, m.MultiLock([]string{"stale/a", "stale/b"}).Lock)
	waitLine(t, ctx, rdb, "dlock:{stale/a}", 1)
	if err := la.Unlock(ctx); err != nil { // hands a to the MultiLock's token
		t.Fatal(err)
	}
	// The MultiLock now waits for b (its refresh found a its own); b is
	// Y's until Y unlocks, which it does not do before the MultiLock
	// returns, if it does.
	done := make(chan struct{})
	var l *dlock.Lease
	go func() { l, err = got(); close(done) }()
	select {
	case <-done:
	case <-time.After(4 * time.Second):
		// It still waits for b, as it should.
		if err := lb.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
		<-done
		if err != nil {
			t.Fatal(err)
		}
		_ = l.Unlock(ctx)
		return
	}
	if err != nil {
		t.Fatalf("MultiLock: %v", err)
	}
	if o := owner(ctx, rdb, "stale/b"); o != l.Token() && lb.Context().Err() == nil {
		t.Fatalf("MultiLock returned holding stale/b (fence %d) while Y's live lease (fence %d) owns it at Redis (owner %q)", l.FenceOf("stale/b"), lb.Fence(), o)
	}
	_ = l.Unlock(ctx)
	_ = lb.Unlock(ctx)
}

// TestMultiLockMutexLockUnderItsLease: a Mutex.Lock of one of a MultiLock
// lease's names, with a ctx derived from that lease (same Client), waits
// for the lease it runs under: without a deadline it never returns. It is
// refused at once, as a MultiLock under it is.
func TestMultiLockMutexLockUnderItsLease(t *testing.T) {
	s := redistest.Start(t)
	c, _ := newClient(t, s)
	ctx := ctxT(t, 10*time.Second)
	l, err := c.MultiLock([]string{"under/a", "under/b"}).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Unlock(ctx) }()
	wctx, cancel := context.WithTimeout(l.Context(), 2*time.Second)
	defer cancel()
	start := time.Now()
	_, err = c.Mutex("under/b").Lock(wctx)
	if !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Fatalf("Mutex.Lock of a part under the MultiLock's lease: %v after %v, want ErrInvalidArgument at once (it waits for itself)", err, time.Since(start).Round(time.Millisecond))
	}
	// Another name is locked as ever.
	o, err := c.Mutex("under/c").Lock(l.Context())
	if err != nil {
		t.Fatal(err)
	}
	_ = o.Unlock(ctx)
}
