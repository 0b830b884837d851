package faults

import (
	"bytes"
	"context"
	"net"
	"os"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// injected is the error of a LoseReply or FailSend fault: a net.Error that
// unwraps to what a real one would (an i/o timeout, a refused connection).
type injected struct {
	msg     string
	cause   error
	timeout bool
}

func (e *injected) Error() string   { return e.msg }
func (e *injected) Unwrap() error   { return e.cause }
func (e *injected) Timeout() bool   { return e.timeout }
func (e *injected) Temporary() bool { return true }

var (
	// ErrReplyLost is what a caller gets for a LoseReply fault: a read
	// timeout, after Redis ran the command.
	ErrReplyLost error = &net.OpError{Op: "read", Net: "tcp", Err: &injected{
		msg: "i/o timeout (faults: reply lost)", cause: os.ErrDeadlineExceeded, timeout: true}}
	// ErrNotSent is what a caller gets for a FailSend fault: the command
	// never reached Redis.
	ErrNotSent error = &net.OpError{Op: "write", Net: "tcp", Err: &injected{
		msg: "connection refused (faults: not sent)", cause: syscall.ECONNREFUSED}}
)

var _ redis.Hook = (*Injector)(nil)

// DialHook wraps every connection the client makes, so that Cut can close
// the one a command is written to, and DelayWrite hold its write back.
func (in *Injector) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		return in.wrapConn(next(ctx, network, addr))
	}
}

// wrapConn wraps a connection just dialed (none if err).
func (in *Injector) wrapConn(conn net.Conn, err error) (net.Conn, error) {
	if err != nil {
		return nil, err
	}
	return &faultConn{Conn: conn, in: in}, nil
}

// ProcessHook injects faults into single script calls.
func (in *Injector) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c, ok := in.scripts.classify(goLine{cmd}, Single)
		if !ok {
			return next(ctx, cmd)
		}
		cmds := []redis.Cmder{cmd}
		return in.inject([]Call{c}, 1, goLine{cmd}, func() error { return next(ctx, cmd) }, setErr(cmds),
			func() { _ = next(context.Background(), redis.NewCmd(context.Background(), cmd.Args()...)) })
	}
}

// ProcessPipelineHook injects faults into pipelines and autopipelined
// batches that hold script calls: a fault applies to the whole batch.
func (in *Injector) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		var calls []Call
		var first redis.Cmder
		for _, cmd := range cmds {
			if c, ok := in.scripts.classify(goLine{cmd}, Batch); ok {
				calls = append(calls, c)
				if first == nil {
					first = cmd
				}
			}
		}
		if len(calls) == 0 {
			return next(ctx, cmds)
		}
		return in.inject(calls, len(cmds), goLine{first}, func() error { return next(ctx, cmds) }, setErr(cmds), func() {
			again := make([]redis.Cmder, len(cmds))
			for i, cmd := range cmds {
				again[i] = redis.NewCmd(context.Background(), cmd.Args()...)
			}
			_ = next(context.Background(), again)
		})
	}
}

// goLine is a go-redis command's line.
type goLine struct{ cmd redis.Cmder }

func (l goLine) Len() int         { return len(l.cmd.Args()) }
func (l goLine) Arg(i int) string { return str(l.cmd.Args()[i]) }

// inject runs one command, or a batch of n, that holds the script calls
// calls, with the fault the rules decide, for both drivers: send sends it
// (the rest of the client's path: writing the commands and reading their
// replies), fail makes err every command's result, sig is the first
// script call's command line, which Cut and DelayWrite look for in the
// connection's writes, and again sends a copy of the command (or batch)
// for nobody (RunLate). Delays do not end early with the caller's ctx: a
// command on the wire does not know its caller gave up.
func (in *Injector) inject(calls []Call, n int, sig line, send func() error, fail func(error), again func()) error {
	id := in.enter(calls)
	defer in.leave(id, len(calls))
	kind, d := in.decide(calls, n)
	switch kind {
	case DelaySend:
		time.Sleep(d)
		return send()
	case DelayReply:
		err := send()
		time.Sleep(d)
		return err
	case LoseReply:
		_ = send()
		time.Sleep(d)
		fail(ErrReplyLost)
		return ErrReplyLost
	case FailSend:
		time.Sleep(d)
		fail(ErrNotSent)
		return ErrNotSent
	case RunLate:
		in.late.Add(1)
		time.AfterFunc(d, func() {
			defer in.late.Done()
			again()
		})
		fail(ErrReplyLost)
		return ErrReplyLost
	case Cut, DelayWrite:
		id := in.arm(resp(sig), kind == Cut, d)
		err := send()
		if !in.disarm(id) {
			in.count("cut-missed", 1)
		}
		return err
	}
	return send()
}

func setErr(cmds []redis.Cmder) func(error) {
	return func(err error) {
		for _, c := range cmds {
			c.SetErr(err)
		}
	}
}

// armedWrite is a Cut or DelayWrite waiting for its command to be written.
type armedWrite struct {
	sig   []byte // the command's RESP encoding
	cut   bool   // close the connection after the write
	hold  time.Duration
	fired bool
}

func (in *Injector) arm(sig []byte, cut bool, hold time.Duration) uint64 {
	in.mu.Lock()
	defer in.mu.Unlock()
	in.seq++
	in.armed[in.seq] = &armedWrite{sig: sig, cut: cut, hold: hold}
	in.armedN.Add(1)
	return in.seq
}

// disarm forgets an armed write and reports whether it fired.
func (in *Injector) disarm(id uint64) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	a := in.armed[id]
	delete(in.armed, id)
	in.armedN.Add(-1)
	return a != nil && a.fired
}

// armedFor reports whether a write of b carries an armed command (and marks
// it fired), and what to do: hold the write back, cut after it.
func (in *Injector) armedFor(b []byte) (hold time.Duration, cut, ok bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	for _, a := range in.armed {
		if !a.fired && bytes.Contains(b, a.sig) {
			a.fired = true
			return a.hold, a.cut, true
		}
	}
	return 0, false, false
}

// faultConn is a client connection whose writes of armed commands are held
// back (DelayWrite) or followed by closing it (Cut), and on which
// subscription faults (SubFaults) are made.
type faultConn struct {
	net.Conn
	in *Injector

	subs []string    // channels this connection subscribed (a PubSub's: written by one goroutine)
	cut  atomic.Bool // closed by a Cut or a Drop: nothing read from here on is the client's
}

func (c *faultConn) Write(b []byte) (int, error) {
	if c.in.sub.any() {
		if _, isSub := subscribedChannel(b); isSub || len(c.subs) > 0 {
			return c.writeSub(b) // a subscription connection: no script call goes there
		}
	}
	if c.in.armedN.Load() == 0 {
		return c.Conn.Write(b)
	}
	hold, cut, ok := c.in.armedFor(b)
	if !ok {
		return c.Conn.Write(b)
	}
	time.Sleep(hold)
	return c.write(b, b, cut)
}

// write writes out for b (len(b) bytes written), then, with cut, closes
// the connection.
func (c *faultConn) write(b, out []byte, cut bool) (int, error) {
	if cut {
		c.cut.Store(true)
	}
	if _, err := c.Conn.Write(out); err != nil {
		return 0, err
	}
	if cut {
		_ = c.Conn.Close()
	}
	return len(b), nil
}

// Read fails once the connection is cut, even with a reply read before it
// closed: a client that reads while it writes (rueidis) would otherwise
// hear the reply of a command written just before the close now and then.
func (c *faultConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if c.cut.Load() {
		return 0, &net.OpError{Op: "read", Net: "tcp", Err: net.ErrClosed}
	}
	return n, err
}

// writeSub writes b with the subscription faults the Injector decides.
func (c *faultConn) writeSub(b []byte) (int, error) {
	ch, isSub := subscribedChannel(b)
	if gone, ok := unsubscribedChannel(b); ok {
		c.subs = slices.DeleteFunc(c.subs, func(s string) bool { return s == gone })
	}
	f := c.in.decideSub(ch, isSub, c.subs)
	if isSub && !f.refuse && !slices.Contains(c.subs, ch) {
		c.subs = append(c.subs, ch)
	}
	time.Sleep(f.delay)
	out := b
	if f.refuse {
		out = refused(b)
	}
	if f.unsub != "" {
		out = append(slices.Clone(out), sunsubscribe(f.unsub)...)
		c.subs = slices.DeleteFunc(c.subs, func(s string) bool { return s == f.unsub })
	}
	return c.write(b, out, f.drop)
}
