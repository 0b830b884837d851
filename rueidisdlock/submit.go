package rueidisdlock

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/dlock-go/dlock/internal/driver"
	"github.com/redis/rueidis"
)

// batcher is Submit's pipeliner: concurrent calls are sent together with
// DoMulti by a few flusher goroutines, under no cancellation, and each
// caller waits on its own channel, its ctx or its stop (the dlock Client's
// Close). A caller whose ctx ends or whose Client closes returns at once,
// leaving a goroutine of the Client's (one that Close waits for) to wait
// for the reply and hand it to late.
// This keeps what running each call aside on a goroutine of its own gave
// (the caller is bounded by ctx, a late reply is acted on) without a
// goroutine, a closure and a channel per call: rueidis's own ctx handling
// cannot replace it, for it drops the reply of a call whose ctx ended
// (pipe.Do's abort path), so a late grant could not be given back.
//
// It sends at once: a flusher that is free takes the queue as it is, so a
// lone call waits for nobody, and calls that come while every flusher
// waits for a reply go together in the next batch.
type batcher struct {
	c       rueidis.Client
	prim    *watch // on Sentinel: a batch's replies count only if the primary stayed (see watch)
	mu      sync.Mutex
	queue   []*pending
	running int        // flushers started and not yet finished
	spare   []*scratch // flushers' buffers, kept for the next flushers
	// flushFn is flush as a func value, made once (newConn): `go
	// b.flush()` would allocate its closure every time a flusher starts,
	// which a lone call does (two allocations per lock+unlock).
	flushFn func()
}

// scratch is one flusher's buffers: flushers come and go with the load,
// their buffers stay.
type scratch struct {
	batch []*pending
	cmds  []rueidis.Completed
}

// maxFlushers bounds the batches in flight at once: more than one, so that
// the server works on one batch while the replies of another are handed
// out and the next is written.
const maxFlushers = 4

// pending is one call waiting for its reply. state says who owns it once
// the reply comes: the caller (answered), or, once the caller left (gone),
// the goroutine that waits for late, or the flusher if late is nil.
type pending struct {
	cmd   rueidis.Completed
	late  func(any, error)
	state atomic.Int32
	done  chan struct{} // buffered 1: the flusher's signal that v and err are set
	v     any
	err   error
}

const (
	waiting int32 = iota
	answered
	gone
)

var pendings = sync.Pool{New: func() any { return &pending{done: make(chan struct{}, 1)} }}

// do sends cmd and waits for its reply, for ctx or for stop (then it
// returns driver.ErrStopped); see batcher.
func (b *batcher) do(ctx context.Context, cmd rueidis.Completed, late func(any, error), goBg func(func()) bool, stop <-chan struct{}) (any, error) {
	p := pendings.Get().(*pending)
	p.cmd, p.late = cmd, late
	p.state.Store(waiting)
	b.mu.Lock()
	b.queue = append(b.queue, p)
	start := b.running < maxFlushers
	if start {
		b.running++
	}
	b.mu.Unlock()
	if start {
		go b.flushFn()
	}
	var err error
	select {
	case <-p.done:
		return p.take()
	case <-ctx.Done():
		err = ctx.Err()
	case <-stop:
		err = driver.ErrStopped
	}
	if !p.state.CompareAndSwap(waiting, gone) {
		<-p.done // the reply came at the same moment: take it
		return p.take()
	}
	if late != nil {
		// The reply goes to late from a goroutine that waits for it
		// (late may send again, which must not wait behind a flusher's
		// batch); one of the Client's, so that Close waits for it.
		wait := func() {
			<-p.done
			late(p.take())
		}
		if !goBg(wait) {
			wait() // the Client is closing: the reply is acted on before the caller returns
		}
	}
	return nil, err
}

// take returns the reply and puts p back in the pool.
func (p *pending) take() (any, error) {
	v, err := p.v, p.err
	p.release()
	return v, err
}

// flush sends the queue in batches until it finds it empty.
func (b *batcher) flush() {
	b.mu.Lock()
	var sc *scratch
	if n := len(b.spare); n > 0 {
		sc, b.spare = b.spare[n-1], b.spare[:n-1]
	} else {
		sc = new(scratch)
	}
	for len(b.queue) > 0 {
		sc.batch, b.queue = b.queue, sc.batch[:0]
		b.mu.Unlock()
		b.send(sc)
		b.mu.Lock()
	}
	b.running--
	b.spare = append(b.spare, sc)
	b.mu.Unlock()
}

// send sends one batch and hands out its replies.
func (b *batcher) send(sc *scratch) {
	// No cancellation: the reply must come back even if its caller left
	// (see batcher); a connection that stops answering fails the batch
	// when rueidis gives it up (ConnWriteTimeout).
	ctx := context.Background()
	var one [1]rueidis.RedisResult
	var rs []rueidis.RedisResult
	m := b.prim.start()
	if len(sc.batch) == 1 {
		one[0] = b.c.Do(ctx, sc.batch[0].cmd) // DoMulti would allocate its results
		rs = one[:]
	} else {
		sc.cmds = sc.cmds[:0]
		for _, p := range sc.batch {
			sc.cmds = append(sc.cmds, p.cmd)
		}
		rs = b.c.DoMulti(ctx, sc.cmds...)
		clear(sc.cmds)
	}
	moved := b.prim.moved(m)
	for i, p := range sc.batch {
		sc.batch[i] = nil
		p.v, p.err = reply(rs[i])
		if moved {
			p.v, p.err = nil, errReplaced
		}
		if p.state.CompareAndSwap(waiting, answered) || p.late != nil {
			p.done <- struct{}{} // from here p is its caller's, or its late's
			continue
		}
		p.release() // its caller left, and nobody wants the reply
	}
}

func (p *pending) release() {
	p.cmd, p.late, p.v, p.err = rueidis.Completed{}, nil, nil, nil
	pendings.Put(p)
}
