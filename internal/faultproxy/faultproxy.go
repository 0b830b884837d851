// Package faultproxy is an in-process TCP proxy that injects network
// faults between a client and a server on loopback, for tests that run
// against real redis-server processes: latency, a bandwidth limit, a
// one-way cut that loses nothing (Hold), a one-way blackhole (Drop),
// resets of every open connection, and a down link that refuses new ones.
//
// Start listens on 127.0.0.1 and forwards each accepted connection to the
// target. Every control applies per direction, to the connections open now
// and to those accepted later, and may be called while traffic flows. Each
// connection is two pipes, one per direction; a pipe's reader keeps reading
// into a queue whatever the faults, and its writer delivers the queue in
// order once the faults allow, so that a control changes what happens to
// bytes already read (a Release delivers what was held) and a slow
// direction never stalls the other. Server processes are not touched: a
// paused server (SIGSTOP) delivers its data late, a held link does not
// deliver it at all, which is how a replication link is cut.
package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// Direction names one or both directions of the proxied connections.
type Direction int

const (
	// Upstream is client to server: what the proxy's accepted connections
	// send.
	Upstream Direction = 1 << iota
	// Downstream is server to client: what the target sends back.
	Downstream
	// Both is Upstream and Downstream.
	Both = Upstream | Downstream
)

func (d Direction) String() string {
	switch d {
	case Upstream:
		return "upstream"
	case Downstream:
		return "downstream"
	case Both:
		return "both"
	}
	return fmt.Sprintf("Direction(%d)", int(d))
}

// dialTimeout bounds the connection to the target made for each accepted
// connection: loopback answers at once or not at all.
const dialTimeout = 5 * time.Second

// readSize is the most one read of a pipe takes from its source.
const readSize = 32 << 10

// faults is what one direction suffers; a zero value passes bytes through.
type faults struct {
	latency time.Duration
	hold    bool
	drop    bool
	bps     int64 // bytes per second; 0 = unlimited
}

// A Proxy forwards TCP connections from its address to a target, with
// faults. Its methods are safe for concurrent use.
type Proxy struct {
	target string
	ln     net.Listener
	ctx    context.Context // ends at Close: stops dials to the target
	cancel context.CancelFunc
	wg     sync.WaitGroup // every goroutine the proxy started

	accepted atomic.Int64

	mu      sync.Mutex
	dirs    [2]faults     // [0] upstream, [1] downstream
	changed chan struct{} // closed (and replaced) when a control changes dirs
	refuse  bool
	closed  bool
	links   map[*link]struct{}
}

// Start listens on 127.0.0.1 on a free port and forwards each connection it
// accepts to target (host:port), until Close.
func Start(target string) (*Proxy, error) {
	if _, _, err := net.SplitHostPort(target); err != nil {
		return nil, fmt.Errorf("faultproxy: target %q: %w", target, err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: %w", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &Proxy{
		target:  target,
		ln:      ln,
		ctx:     ctx,
		cancel:  cancel,
		changed: make(chan struct{}),
		links:   map[*link]struct{}{},
	}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr returns the address clients connect to ("127.0.0.1:PORT").
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Port returns the port of Addr.
func (p *Proxy) Port() int { return p.ln.Addr().(*net.TCPAddr).Port }

// Target returns the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// Accepted returns how many connections the proxy has accepted, refused
// ones included.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

// Open returns how many proxied connections are open now.
func (p *Proxy) Open() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.links)
}

// SetLatency delays every chunk of bytes in dir until d after the proxy
// read it; chunks keep their order. It applies to the bytes already read
// and not yet delivered too. 0 removes the delay.
func (p *Proxy) SetLatency(dir Direction, d time.Duration) {
	p.update(dir, func(f *faults) { f.latency = max(d, 0) })
}

// Hold keeps the bytes of dir, and the end of the stream if the sender
// closes, undelivered until Release: a one-way cut that loses nothing and
// leaves the connections open.
func (p *Proxy) Hold(dir Direction) { p.update(dir, func(f *faults) { f.hold = true }) }

// Release delivers what Hold kept, in order, and lets bytes through again.
func (p *Proxy) Release(dir Direction) { p.update(dir, func(f *faults) { f.hold = false }) }

// Drop discards the bytes of dir, those read and not yet delivered
// included, until Undrop: a one-way blackhole. The connections stay open;
// the end of the stream, if the sender closes, is kept until Undrop. Drop
// wins over Hold.
func (p *Proxy) Drop(dir Direction) { p.update(dir, func(f *faults) { f.drop = true }) }

// Undrop lets the bytes of dir through again.
func (p *Proxy) Undrop(dir Direction) { p.update(dir, func(f *faults) { f.drop = false }) }

// SetBandwidth limits each connection's dir to bytesPerSecond; 0 (or
// less) removes the limit.
func (p *Proxy) SetBandwidth(dir Direction, bytesPerSecond int64) {
	p.update(dir, func(f *faults) { f.bps = max(bytesPerSecond, 0) })
}

// Refuse makes the proxy reset every connection it accepts from now on, at
// once (a link that is down), while on; connections already open are not
// touched.
func (p *Proxy) Refuse(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.refuse = on
}

// ResetAll closes every open connection with a reset (RST), on the client's
// side and the target's: both see "connection reset by peer". Bytes not yet
// delivered are lost.
func (p *Proxy) ResetAll() {
	p.mu.Lock()
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	for _, l := range links {
		l.abort(true)
	}
}

// Close stops listening, closes every connection, and returns once every
// goroutine the proxy started has returned. Later calls do nothing.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	links := make([]*link, 0, len(p.links))
	for l := range p.links {
		links = append(links, l)
	}
	p.mu.Unlock()
	p.cancel()
	err := p.ln.Close()
	for _, l := range links {
		l.abort(false)
	}
	p.wg.Wait()
	return err
}

// update applies f to the faults of each direction in dir and wakes every
// pipe to look again.
func (p *Proxy) update(dir Direction, f func(*faults)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if dir&Upstream != 0 {
		f(&p.dirs[0])
	}
	if dir&Downstream != 0 {
		f(&p.dirs[1])
	}
	close(p.changed)
	p.changed = make(chan struct{})
}

// faultsOf returns the faults of one direction (0 up, 1 down) and a channel
// closed at their next change.
func (p *Proxy) faultsOf(i int) (faults, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dirs[i], p.changed
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// A transient failure (too many files, an aborted handshake):
			// go on, a little later.
			select {
			case <-p.ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		p.accepted.Add(1)
		p.mu.Lock()
		refuse := p.refuse || p.closed
		if !refuse {
			p.wg.Add(1)
		}
		p.mu.Unlock()
		if refuse {
			reset(c)
			continue
		}
		go p.serve(c)
	}
}

// serve dials the target for client c and runs the two pipes until the
// connection ends.
func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	// Registered before the dial, so that ResetAll and Close reach a
	// connection whose target is still being dialled.
	l := &link{done: make(chan struct{})}
	l.conns[0] = client
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		reset(client)
		return
	}
	p.links[l] = struct{}{}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.links, l)
		p.mu.Unlock()
	}()
	d := net.Dialer{Timeout: dialTimeout}
	server, err := d.DialContext(p.ctx, "tcp", p.target)
	if err != nil {
		l.abort(true)
		return
	}
	if !l.attach(server) {
		reset(server) // aborted during the dial
		return
	}

	up := &pipe{p: p, l: l, dir: 0, src: client, dst: server, notify: make(chan struct{}, 1)}
	down := &pipe{p: p, l: l, dir: 1, src: server, dst: client, notify: make(chan struct{}, 1)}
	var wg sync.WaitGroup
	for _, pp := range []*pipe{up, down} {
		wg.Add(2)
		go func() { defer wg.Done(); pp.read() }()
		go func() { defer wg.Done(); pp.write() }()
	}
	wg.Wait()
	l.abort(false) // both ends delivered, or already aborted: close what is left
}

// reset closes c with a reset (RST) rather than a FIN.
func reset(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = c.Close()
}

// link is one proxied connection: the accepted client conn and the conn to
// the target.
type link struct {
	mu      sync.Mutex
	conns   [2]net.Conn // client, server (nil while it is dialled)
	aborted bool
	done    chan struct{} // closed by abort
}

// attach sets the server conn, unless the link was aborted meanwhile.
func (l *link) attach(server net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.aborted {
		return false
	}
	l.conns[1] = server
	return true
}

// abort closes the conns (with a reset if rst), which ends the readers,
// and tells the writers to stop. Only the first call does anything.
func (l *link) abort(rst bool) {
	l.mu.Lock()
	if l.aborted {
		l.mu.Unlock()
		return
	}
	l.aborted = true
	conns := l.conns
	l.mu.Unlock()
	close(l.done)
	for _, c := range conns {
		switch {
		case c == nil:
		case rst:
			reset(c)
		default:
			_ = c.Close()
		}
	}
}

// chunk is what one read returned, or the end of the stream (eof, with
// rst if the source was reset rather than closed).
type chunk struct {
	data []byte
	at   time.Time // when it was read
	eof  bool
	rst  bool
}

// pipe is one direction of a link: read delivers chunks to the queue,
// write takes them off it once the direction's faults allow.
type pipe struct {
	p        *Proxy
	l        *link
	dir      int // 0 upstream, 1 downstream
	src, dst net.Conn

	mu     sync.Mutex
	queue  []chunk
	notify chan struct{} // a chunk was queued (capacity 1)
}

func (pp *pipe) push(c chunk) {
	pp.mu.Lock()
	pp.queue = append(pp.queue, c)
	pp.mu.Unlock()
	select {
	case pp.notify <- struct{}{}:
	default:
	}
}

// read reads the source until it ends, queueing what it reads and then the
// end.
func (pp *pipe) read() {
	for {
		buf := make([]byte, readSize)
		n, err := pp.src.Read(buf)
		if n > 0 {
			pp.push(chunk{data: buf[:n], at: time.Now()})
		}
		if err != nil {
			select {
			case <-pp.l.done: // our own abort closed it: nothing to tell
				return
			default:
			}
			pp.push(chunk{eof: true, rst: !errors.Is(err, io.EOF), at: time.Now()})
			return
		}
	}
}

// next waits for the first queued chunk; false once the link is aborted.
func (pp *pipe) next() (chunk, bool) {
	for {
		pp.mu.Lock()
		if len(pp.queue) > 0 {
			c := pp.queue[0]
			pp.mu.Unlock()
			return c, true
		}
		pp.mu.Unlock()
		select {
		case <-pp.notify:
		case <-pp.l.done:
			return chunk{}, false
		}
	}
}

func (pp *pipe) pop() {
	pp.mu.Lock()
	pp.queue[0] = chunk{}
	pp.queue = pp.queue[1:]
	pp.mu.Unlock()
}

// write delivers the queue in order, each chunk once the faults of its
// direction allow, until it has delivered the end or the link is aborted.
func (pp *pipe) write() {
	var free time.Time // when the bandwidth limit lets the next byte go
	for {
		c, ok := pp.next()
		if !ok {
			return
		}
		sent := 0
		for {
			f, changed := pp.p.faultsOf(pp.dir)
			var wait <-chan time.Time
			switch {
			case f.drop && !c.eof:
				sent = len(c.data) // discarded
			case f.hold || f.drop:
				// kept: wait for a change
			case time.Until(c.at.Add(f.latency)) > 0:
				wait = time.After(time.Until(c.at.Add(f.latency)))
			case c.eof:
				pp.end(c.rst)
				return
			case f.bps > 0 && time.Until(free) > 0:
				wait = time.After(time.Until(free))
			default:
				n := len(c.data) - sent
				if f.bps > 0 {
					// At most a tenth of a second's worth at once, so
					// that a lower limit set meanwhile takes hold soon.
					n = min(n, int(max(f.bps/10, 1)))
					free = time.Now().Add(time.Duration(int64(n) * int64(time.Second) / f.bps))
				}
				if _, err := pp.dst.Write(c.data[sent : sent+n]); err != nil {
					pp.l.abort(true)
					return
				}
				sent += n
			}
			if sent == len(c.data) && !c.eof {
				pp.pop()
				break
			}
			if wait == nil && !f.hold && !f.drop {
				continue // more of a chunk to send under a bandwidth limit
			}
			select {
			case <-changed:
			case <-wait:
			case <-pp.l.done:
				return
			}
		}
	}
}

// end delivers the end of the stream: a half-close (the other direction
// goes on), or a reset of the whole connection if the source was reset.
func (pp *pipe) end(rst bool) {
	if rst {
		pp.l.abort(true)
		return
	}
	if tc, ok := pp.dst.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
	}
}
