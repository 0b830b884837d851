package faultproxy_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/faultproxy"
	"github.com/dlock-go/dlock/internal/redistest"
)

// quiet is how long a test waits to see that nothing arrives: long enough
// for a reply on loopback to have come many times over.
const quiet = 300 * time.Millisecond

func ctxT(t *testing.T, d time.Duration) context.Context {
	c, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return c
}

// The tests do not run in parallel: closeAndCheck looks at every goroutine
// of the package.

// setup starts a redis-server and a proxy in front of it. The proxy is
// closed when the test ends, and the test fails if a goroutine of the proxy
// is left after Close.
func setup(t *testing.T) (*redistest.Server, *faultproxy.Proxy) {
	t.Helper()
	s := redistest.Start(t)
	p, err := faultproxy.Start(s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeAndCheck(t, p) })
	return s, p
}

// closeAndCheck closes p and fails t if any goroutine running the proxy's
// code is left soon after: Close waits for every one of them.
func closeAndCheck(t *testing.T, p *faultproxy.Proxy) {
	t.Helper()
	if err := p.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
	// A goroutine that has signalled its end may still be returning:
	// allow it a moment, bounded.
	deadline := time.Now().Add(5 * time.Second)
	for {
		g := proxyGoroutines()
		if g == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("goroutines of the proxy left 5s after Close:\n%s", g)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// proxyGoroutines returns the stacks of the goroutines that run code of
// package faultproxy (not its tests).
func proxyGoroutines() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, "/internal/faultproxy.") {
			out = append(out, g)
		}
	}
	return strings.Join(out, "\n\n")
}

// client returns a go-redis client of one connection through p that never
// retries, so that every fault shows.
func client(t *testing.T, p *faultproxy.Proxy, readTimeout time.Duration) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:            p.Addr(),
		PoolSize:        1,
		MaxRetries:      -1,
		DisableIdentity: true,
		DialTimeout:     2 * time.Second,
		ReadTimeout:     readTimeout,
		WriteTimeout:    2 * time.Second,
	})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// async runs cmd in a goroutine and returns a channel that receives its
// result.
func async[T any](f func() (T, error)) <-chan result[T] {
	ch := make(chan result[T], 1)
	go func() {
		v, err := f()
		ch <- result[T]{v, err}
	}()
	return ch
}

type result[T any] struct {
	v   T
	err error
}

// none fails t if ch delivers within quiet.
func none[T any](t *testing.T, ch <-chan result[T], what string) {
	t.Helper()
	select {
	case r := <-ch:
		t.Fatalf("%s: got %v, %v; want nothing yet", what, r.v, r.err)
	case <-time.After(quiet):
	}
}

// within returns what ch delivers, failing t if nothing comes within 10s.
func within[T any](t *testing.T, ch <-chan result[T], what string) result[T] {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: nothing after 10s", what)
		panic("unreachable")
	}
}

func TestForwardsBothWays(t *testing.T) {
	s, p := setup(t)
	ctx := ctxT(t, 20*time.Second)
	c := client(t, p, 5*time.Second)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("0123456789abcdef", 1<<16) // 1 MiB: many chunks
	if err := c.Set(ctx, "big", big, 0).Err(); err != nil {
		t.Fatal(err)
	}
	if v, err := c.Get(ctx, "big").Result(); err != nil || v != big {
		t.Fatalf("GET big through the proxy: %d bytes, %v", len(v), err)
	}
	if v := s.Do(t, "STRLEN", "big"); v != int64(len(big)) {
		t.Fatalf("STRLEN big at the server = %v", v)
	}
	if a, o := p.Accepted(), p.Open(); a != 1 || o != 1 {
		t.Fatalf("Accepted, Open = %d, %d; want 1, 1", a, o)
	}
	if p.Target() != s.Addr() {
		t.Fatalf("Target() = %q, want %q", p.Target(), s.Addr())
	}
	_ = c.Close()
	waitOpen(t, p, 0)
}

// waitOpen waits (at most 10s) until p has n connections open.
func waitOpen(t *testing.T, p *faultproxy.Proxy, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for p.Open() != n {
		if time.Now().After(deadline) {
			t.Fatalf("Open() = %d after 10s, want %d", p.Open(), n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Held upstream, a command does not reach the server until Release; then
// it runs once and its reply comes back.
func TestHoldUpstream(t *testing.T) {
	s, p := setup(t)
	ctx := ctxT(t, 20*time.Second)
	c := client(t, p, 15*time.Second)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	p.Hold(faultproxy.Upstream)
	ch := async(func() (int64, error) { return c.Incr(ctx, "n").Result() })
	none(t, ch, "INCR held upstream")
	if v := s.Do(t, "GET", "n"); v != nil {
		t.Fatalf("the server ran the held INCR: n = %v", v)
	}
	p.Release(faultproxy.Upstream)
	if r := within(t, ch, "INCR after Release"); r.err != nil || r.v != 1 {
		t.Fatalf("INCR after Release = %d, %v; want 1", r.v, r.err)
	}
}

// Held downstream, the server runs the command but the reply waits for
// Release.
func TestHoldDownstream(t *testing.T) {
	s, p := setup(t)
	ctx := ctxT(t, 20*time.Second)
	c := client(t, p, 15*time.Second)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	p.Hold(faultproxy.Downstream)
	ch := async(func() (int64, error) { return c.Incr(ctx, "n").Result() })
	none(t, ch, "INCR held downstream")
	if v := s.Do(t, "GET", "n"); v != "1" {
		t.Fatalf("n at the server = %v, want 1 (the command went through)", v)
	}
	p.Release(faultproxy.Downstream)
	if r := within(t, ch, "INCR after Release"); r.err != nil || r.v != 1 {
		t.Fatalf("INCR after Release = %d, %v; want 1", r.v, r.err)
	}
}

// Hold keeps the end of the stream too: a server that replies and closes
// (QUIT) looks open to the client until Release, then the reply and the
// close arrive in order.
func TestHoldKeepsTheEnd(t *testing.T) {
	_, p := setup(t)
	conn, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	p.Hold(faultproxy.Downstream)
	if _, err := conn.Write([]byte("QUIT\r\n")); err != nil {
		t.Fatal(err)
	}
	ch := async(func() ([]byte, error) { return io.ReadAll(conn) })
	none(t, ch, "read held downstream after QUIT")
	p.Release(faultproxy.Downstream)
	if r := within(t, ch, "read after Release"); r.err != nil || string(r.v) != "+OK\r\n" {
		t.Fatalf("read after Release = %q, %v; want +OK then the end", r.v, r.err)
	}
}

// Dropped upstream, a command is lost (the server never runs it) and the
// connection stays open; Undrop lets later bytes through.
func TestDropUpstream(t *testing.T) {
	s, p := setup(t)
	ctx := ctxT(t, 20*time.Second)
	c := client(t, p, quiet)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	p.Drop(faultproxy.Upstream)
	if err := c.Incr(ctx, "n").Err(); !isTimeout(err) {
		t.Fatalf("INCR dropped upstream: %v, want a timeout", err)
	}
	if p.Open() != 1 {
		t.Fatalf("Open() = %d while dropping, want 1 (the connection stays)", p.Open())
	}
	if v := s.Do(t, "GET", "n"); v != nil {
		t.Fatalf("the server ran the dropped INCR: n = %v", v)
	}
	p.Undrop(faultproxy.Upstream)
	// go-redis dropped its connection after the timeout; a new one works.
	if v, err := c.Incr(ctx, "n").Result(); err != nil || v != 1 {
		t.Fatalf("INCR after Undrop = %d, %v; want 1", v, err)
	}
}

// Dropped downstream, the server runs the command and the reply is lost,
// even when Undrop comes later.
func TestDropDownstream(t *testing.T) {
	s, p := setup(t)
	conn, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	p.Drop(faultproxy.Downstream)
	if _, err := conn.Write([]byte("INCR n\r\n")); err != nil {
		t.Fatal(err)
	}
	waitValue(t, s, "n", "1")
	ch := async(func() (string, error) { return r.ReadString('\n') })
	none(t, ch, "reply dropped downstream")
	p.Undrop(faultproxy.Downstream)
	if _, err := conn.Write([]byte("INCR n\r\n")); err != nil {
		t.Fatal(err)
	}
	if got := within(t, ch, "reply after Undrop"); got.err != nil || got.v != ":2\r\n" {
		t.Fatalf("first reply after Undrop = %q, %v; want :2 (the reply :1 was lost)", got.v, got.err)
	}
}

// waitValue waits (at most 10s) until key holds want at s.
func waitValue(t *testing.T, s *redistest.Server, key, want string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.Do(t, "GET", key) != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s at the server = %v after 10s, want %s", key, s.Do(t, "GET", key), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// ResetAll resets every connection on both sides: a raw client's read
// fails with "connection reset by peer", go-redis's pending call fails
// (it reports EOF: its pool's health check, a peek at the socket, may take
// the reset first), and the server drops both connections.
func TestResetAll(t *testing.T) {
	s, p := setup(t)
	ctx := ctxT(t, 20*time.Second)
	c := client(t, p, 15*time.Second)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	raw, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	_ = raw.SetDeadline(time.Now().Add(15 * time.Second))
	clients := func() int { return strings.Count(s.Do(t, "CLIENT", "LIST").(string), "\n") }
	waitOpen(t, p, 2)
	before := clients() // the proxy's two connections and Do's own
	p.Hold(faultproxy.Downstream)
	ch := async(func() (string, error) { return c.Ping(ctx).Result() })
	if _, err := raw.Write([]byte("PING\r\n")); err != nil {
		t.Fatal(err)
	}
	rawCh := async(func() (int, error) { return raw.Read(make([]byte, 16)) })
	none(t, ch, "PING held downstream")
	p.ResetAll()
	if r := within(t, rawCh, "raw read after ResetAll"); !errors.Is(r.err, syscall.ECONNRESET) {
		t.Fatalf("raw read after ResetAll = %d bytes, %v; want connection reset by peer", r.v, r.err)
	}
	if r := within(t, ch, "go-redis PING after ResetAll"); r.err == nil {
		t.Fatalf("go-redis PING after ResetAll = %q, want an error", r.v)
	}
	deadline := time.Now().Add(10 * time.Second)
	for clients() != before-2 {
		if time.Now().After(deadline) {
			t.Fatalf("the server still lists the proxy's connections 10s after ResetAll:\n%s", s.Do(t, "CLIENT", "LIST"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	waitOpen(t, p, 0)
	p.Release(faultproxy.Downstream)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING on a new connection after ResetAll: %v", err)
	}
}

// Latency delays each direction by at least d, and chunks read at
// different times are each delayed d, not d per chunk queued before them.
func TestLatency(t *testing.T) {
	_, p := setup(t)
	conn, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
	r := bufio.NewReader(conn)
	ping := func() {
		t.Helper()
		if _, err := conn.Write([]byte("PING\r\n")); err != nil {
			t.Fatal(err)
		}
	}
	pong := func() {
		t.Helper()
		if l, err := r.ReadString('\n'); err != nil || l != "+PONG\r\n" {
			t.Fatalf("reply %q, %v; want +PONG", l, err)
		}
	}
	const d = 200 * time.Millisecond
	p.SetLatency(faultproxy.Both, d)
	start := time.Now()
	ping()
	pong()
	if el := time.Since(start); el < 2*d {
		t.Fatalf("PING with %v each way answered in %v, want at least %v", d, el, 2*d)
	}
	// Ten commands 20ms apart: each chunk waits d from its own read, so
	// the last reply comes about 2d after the last send. Waiting d per
	// chunk in turn would take over 10d.
	const n = 10
	start = time.Now()
	for range n {
		ping()
		time.Sleep(20 * time.Millisecond)
	}
	for range n {
		pong()
	}
	if el := time.Since(start); el < 2*d || el > n*d/2 {
		t.Fatalf("%d PINGs 20ms apart with %v each way answered in %v, want between %v and %v", n, d, el, 2*d, n*d/2)
	}
	p.SetLatency(faultproxy.Both, 0)
	ping()
	pong()
}

// SetBandwidth slows a direction to the given rate, and what goes through
// is intact.
func TestBandwidth(t *testing.T) {
	s, p := setup(t)
	ctx := ctxT(t, 20*time.Second)
	const size, rate = 64 << 10, 128 << 10 // half a second's worth
	val := strings.Repeat("x", size)
	s.Do(t, "SET", "v", val)
	c := client(t, p, 15*time.Second)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	p.SetBandwidth(faultproxy.Downstream, rate)
	start := time.Now()
	v, err := c.Get(ctx, "v").Result()
	el := time.Since(start)
	if err != nil || v != val {
		t.Fatalf("GET v at %d B/s: %d bytes, %v", rate, len(v), err)
	}
	// A tenth of a second's worth may go at once; the rest waits its turn.
	if least := time.Duration(size-rate/10) * time.Second / rate; el < least {
		t.Fatalf("%d bytes at %d B/s took %v, want at least %v", size, rate, el, least)
	}
	p.SetBandwidth(faultproxy.Downstream, 0)
	if v, err := c.Get(ctx, "v").Result(); err != nil || v != val {
		t.Fatalf("GET v unlimited: %d bytes, %v", len(v), err)
	}
}

// Refuse resets new connections at once and leaves the open ones working.
func TestRefuse(t *testing.T) {
	_, p := setup(t)
	ctx := ctxT(t, 20*time.Second)
	open := client(t, p, 5*time.Second)
	if err := open.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	p.Refuse(true)
	fresh := client(t, p, 5*time.Second)
	if err := fresh.Ping(ctx).Err(); err == nil {
		t.Fatal("PING on a new connection while refusing succeeded")
	}
	if err := open.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING on the open connection while refusing: %v", err)
	}
	// go-redis may dial more than once; a raw connection is counted once,
	// and reset.
	before := p.Accepted()
	raw, err := net.Dial("tcp", p.Addr())
	if err == nil {
		defer raw.Close()
		_ = raw.SetDeadline(time.Now().Add(10 * time.Second))
		_, err = raw.Read(make([]byte, 1))
	}
	// The reset may come before the dial returns, or after.
	if !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("a refused connection: %v, want connection reset by peer", err)
	}
	if a := p.Accepted(); a != before+1 {
		t.Fatalf("Accepted() = %d after one more connection, want %d", a, before+1)
	}
	p.Refuse(false)
	if err := fresh.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING on a new connection after Refuse(false): %v", err)
	}
}

// Close ends every connection, held ones included, and leaves no
// goroutine behind (setup's cleanup checks; here it is checked at once).
func TestCloseEndsConnections(t *testing.T) {
	s := redistest.Start(t)
	p, err := faultproxy.Start(s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t, 20*time.Second)
	var cs []*redis.Client
	for range 3 {
		c := client(t, p, 15*time.Second)
		if err := c.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		cs = append(cs, c)
	}
	p.Hold(faultproxy.Both)
	var pending []<-chan result[string]
	for _, c := range cs {
		ch := async(func() (string, error) { return c.Ping(ctx).Result() })
		none(t, ch, "PING held")
		pending = append(pending, ch)
	}
	p.SetLatency(faultproxy.Both, time.Hour)
	closeAndCheck(t, p)
	for _, ch := range pending {
		if r := within(t, ch, "PING across Close"); r.err == nil {
			t.Fatalf("PING held across Close = %q, want an error", r.v)
		}
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Fatal("the proxy still accepts connections after Close")
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// The controls may change at any time while traffic flows: every reply
// that arrives is the right one, and once the faults are gone every client
// works again.
func TestControlsWhileTrafficFlows(t *testing.T) {
	_, p := setup(t)
	ctx := ctxT(t, 30*time.Second)
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	var wrong []string
	for g := range 4 {
		c := client(t, p, 200*time.Millisecond)
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				v := fmt.Sprintf("g%d-%d", g, i)
				got, err := c.Echo(ctx, v).Result()
				if err == nil && got != v {
					mu.Lock()
					wrong = append(wrong, fmt.Sprintf("ECHO %s = %s", v, got))
					mu.Unlock()
				}
			}
		})
	}
	dirs := []faultproxy.Direction{faultproxy.Upstream, faultproxy.Downstream, faultproxy.Both}
	for range 200 { // bounded: about 2s of changes
		d := dirs[rng.IntN(len(dirs))]
		switch rng.IntN(9) {
		case 0:
			p.SetLatency(d, time.Duration(rng.IntN(20))*time.Millisecond)
		case 1:
			p.Hold(d)
		case 2:
			p.Release(d)
		case 3:
			p.Drop(d)
		case 4:
			p.Undrop(d)
		case 5:
			p.SetBandwidth(d, int64(rng.IntN(3))*64<<10)
		case 6:
			p.Refuse(rng.IntN(2) == 0)
		case 7:
			if rng.IntN(5) == 0 {
				p.ResetAll()
			}
		case 8:
			_ = p.Open()
		}
		time.Sleep(10 * time.Millisecond)
	}
	p.SetLatency(faultproxy.Both, 0)
	p.Release(faultproxy.Both)
	p.Undrop(faultproxy.Both)
	p.SetBandwidth(faultproxy.Both, 0)
	p.Refuse(false)
	close(stop)
	wg.Wait()
	if len(wrong) > 0 {
		t.Fatalf("wrong replies: %v", wrong)
	}
	c := client(t, p, 5*time.Second)
	if got, err := c.Echo(ctx, "after").Result(); err != nil || got != "after" {
		t.Fatalf("ECHO after the faults = %q, %v", got, err)
	}
}

func TestStartBadTarget(t *testing.T) {
	if _, err := faultproxy.Start("no-port"); err == nil || !strings.Contains(err.Error(), "no-port") {
		t.Fatalf("Start(\"no-port\") = %v, want an error naming the target", err)
	}
}
