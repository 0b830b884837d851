package rueidisdlock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/internal/driver"
	"github.com/redis/rueidis"
)

// pubsub is a driver.PubSub over one dedicated rueidis connection in RESP3,
// with pub/sub hooks: the hooks hear messages, subscribe confirmations and
// the unsubscribes a server sends on its own, on rueidis's reader; a
// command's own reply (a refusal, a PONG) is queued by the caller after its
// Do returns. Commands are sent one at a time and rueidis runs the hooks of
// a reply before it completes the Do that awaits it, so the events come out
// in the order the server sent them, as the hub needs.
type pubsub struct {
	src rueidis.Client

	// On a Sentinel client: the primary when the connection was made. An
	// event or reply that comes once rueidis has moved to another primary
	// may come from the replaced one (a hand-over published there would
	// hand the lock to us there alone: see watch), so it is dropped and
	// the connection given up (stale), as go-redis closes its
	// subscription to the old primary when it learns of the switch; the
	// hub then subscribes again, on the promoted replica.
	prim  *watch
	at    mark
	stale atomic.Bool

	mu     sync.Mutex
	dc     rueidis.DedicatedClient // nil until the first command (guarded by mu)
	dead   chan struct{}
	err    error // why dead was closed
	closed sync.Once
	timer  *time.Timer // Receive's, reused (one reader)

	// What Receive is to return, in order. Unbounded: the hooks run on
	// rueidis's reader, and the hub reads only after its first batch of
	// commands is sent, each of which waits for its reply here: a bounded
	// queue filled before the hub reads would stop the reader, and with
	// it every reply the writer waits for.
	qmu   sync.Mutex
	queue []item
	ready chan struct{} // buffered 1: queue has items
}

// item is one thing for Receive: an event, or a refusal (err).
type item struct {
	ev  driver.Event
	err error
}

var errDropped = errors.New("rueidisdlock: subscription connection closed")

func newPubSub(src rueidis.Client, prim *watch) *pubsub {
	return &pubsub{src: src, prim: prim, ready: make(chan struct{}, 1), dead: make(chan struct{})}
}

// replaced reports whether the primary moved since the connection was
// made, and then gives the connection up. It may run on rueidis's reader
// (in a hook), where closing the connection would wait for that reader:
// the close runs aside.
func (p *pubsub) replaced() bool {
	if p.stale.Load() {
		return true
	}
	if !p.prim.moved(p.at) {
		return false
	}
	if p.stale.CompareAndSwap(false, true) {
		go p.kill(errReplaced)
	}
	return true
}

// conn returns the dedicated connection, made on first use, or nil once
// the pubsub is dead.
func (p *pubsub) conn() rueidis.DedicatedClient {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.dead:
		return nil
	default:
	}
	if p.dc == nil {
		// Looked at before Dedicate picks the primary: a switch between
		// the two shows as a move at the first event (see replaced).
		p.at = p.prim.start()
		dc, cancel := p.src.Dedicate()
		p.dc = dc
		lost := dc.SetPubSubHooks(rueidis.PubSubHooks{
			OnMessage: func(m rueidis.PubSubMessage) {
				if p.replaced() {
					return
				}
				p.put(driver.Event{Type: driver.Message, Channel: m.Channel, Payload: m.Message})
			},
			OnSubscription: func(s rueidis.PubSubSubscription) {
				if p.replaced() {
					return
				}
				p.put(driver.Event{Type: driver.Subscription, Kind: s.Kind, Channel: s.Channel})
			},
		})
		go func() {
			select {
			case err := <-lost:
				p.kill(cmpErr(err, errDropped))
			case <-p.dead:
			}
			cancel()
		}()
	}
	return p.dc
}

// put queues an event for Receive, in the order of the calls; it never
// blocks (it runs on rueidis's reader).
func (p *pubsub) put(e driver.Event) { p.push(item{ev: e}) }

// refuse queues an error reply in order with the events.
func (p *pubsub) refuse(err error) { p.push(item{err: err}) }

func (p *pubsub) push(it item) {
	p.qmu.Lock()
	p.queue = append(p.queue, it)
	p.qmu.Unlock()
	select {
	case p.ready <- struct{}{}:
	default:
	}
}

// next takes the oldest queued item, if any.
func (p *pubsub) next() (item, bool) {
	p.qmu.Lock()
	defer p.qmu.Unlock()
	if len(p.queue) == 0 {
		return item{}, false
	}
	it := p.queue[0]
	p.queue[0] = item{}
	p.queue = p.queue[1:]
	return it, true
}

func (p *pubsub) kill(err error) {
	p.closed.Do(func() {
		p.err = err
		p.mu.Lock()
		close(p.dead)
		dc := p.dc
		p.mu.Unlock()
		if dc != nil {
			dc.Close()
		}
	})
}

// send runs one command on the connection. An error reply is queued for
// Receive (the hub's refusal); any other error fails the connection.
func (p *pubsub) send(ctx context.Context, cmd func(rueidis.Builder) rueidis.Completed, pong bool) error {
	dc := p.conn()
	if dc == nil {
		<-p.dead
		return p.err
	}
	err := dc.Do(ctx, cmd(dc.B())).Error()
	if p.replaced() {
		<-p.dead
		return p.err
	}
	if err == nil {
		if pong {
			p.put(driver.Event{Type: driver.Pong})
		}
		return nil
	}
	if _, ok := rueidis.IsRedisErr(err); ok {
		p.refuse(wrap(err))
		return nil
	}
	p.kill(err)
	return err
}

func (p *pubsub) Subscribe(ctx context.Context, sharded bool, channel string) error {
	return p.send(ctx, func(b rueidis.Builder) rueidis.Completed {
		if sharded {
			return b.Ssubscribe().Channel(channel).Build()
		}
		return b.Subscribe().Channel(channel).Build()
	}, false)
}

func (p *pubsub) Unsubscribe(ctx context.Context, sharded bool, channel string) error {
	return p.send(ctx, func(b rueidis.Builder) rueidis.Completed {
		if sharded {
			return b.Sunsubscribe().Channel(channel).Build()
		}
		return b.Unsubscribe().Channel(channel).Build()
	}, false)
}

func (p *pubsub) Ping(ctx context.Context) error {
	return p.send(ctx, func(b rueidis.Builder) rueidis.Completed { return b.Ping().Build() }, true)
}

func (p *pubsub) Receive(ctx context.Context, timeout time.Duration) (driver.Event, error) {
	if it, ok := p.next(); ok {
		return it.ev, it.err
	}
	if p.timer == nil {
		p.timer = time.NewTimer(timeout)
	} else {
		p.timer.Reset(timeout)
	}
	defer p.timer.Stop()
	for {
		select {
		case <-p.ready:
			if it, ok := p.next(); ok {
				return it.ev, it.err
			}
		case <-p.dead:
			return driver.Event{}, p.err
		case <-ctx.Done():
			return driver.Event{}, ctx.Err()
		case <-p.timer.C:
			return driver.Event{}, fmt.Errorf("rueidisdlock: nothing received within %v", timeout)
		}
	}
}

func (p *pubsub) Close() error {
	p.kill(errDropped)
	return nil
}
