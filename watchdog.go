package dlock

import (
	"container/heap"
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// watchdog keeps every held lease of a Client on one timer heap: renewing
// leases come due at a third of their TTL, others at their deadline. One
// goroutine pops what is due and renews it in pipelined batches, so ten
// thousand held locks cost a few round trips per renewal period, not ten
// thousand timers and goroutines.
type watchdog struct {
	mu      sync.Mutex
	h       dueHeap
	kick    chan struct{}
	started bool
	wakeAt  time.Time // when the loop's timer fires; a due before it needs a kick
}

// farFuture stands for "the watchdog loop is awake".
var farFuture = time.Unix(1<<62, 0)

// renewBatchMax bounds one renewal pipeline.
const renewBatchMax = 1000

func (d *watchdog) init() { d.kick = make(chan struct{}, 1) }

func (c *Client) startDog() { c.goBg(c.watch) }

func (d *watchdog) add(h *holding, due time.Time) {
	c := h.c
	d.mu.Lock()
	h.due = due
	heap.Push(&d.h, h)
	// Wake the loop only if it would sleep past this lease's due time: a
	// kick per lock would cost every acquisition a goroutine wake-up.
	first := h.idx == 0 && due.Before(d.wakeAt)
	start := !d.started
	d.started = true
	d.mu.Unlock()
	if start {
		c.startDog()
	}
	if first {
		poke(d.kick)
	}
}

// addPending adds a holding passed to a waiter (see pass.go): it is not
// renewed until the pass is recorded (reschedule), and is lost at its
// inherited deadline if that does not happen first.
func (d *watchdog) addPending(h *holding) {
	d.mu.Lock()
	h.busy = true
	d.mu.Unlock()
	d.add(h, h.deadline)
}

func (d *watchdog) remove(h *holding) {
	d.mu.Lock()
	if h.idx >= 0 {
		heap.Remove(&d.h, h.idx)
	}
	d.mu.Unlock()
}

// reschedule sets when h is next looked at (after Extend or a renewal).
func (d *watchdog) reschedule(h *holding, due time.Time) {
	d.mu.Lock()
	h.busy = false
	if h.idx >= 0 {
		h.due = due
		heap.Fix(&d.h, h.idx)
	}
	first := h.idx == 0 && due.Before(d.wakeAt)
	d.mu.Unlock()
	if first {
		poke(d.kick)
	}
}

// drain empties the heap and returns what it held (at Close).
func (d *watchdog) drain() []*holding {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]*holding, len(d.h))
	copy(out, d.h)
	for _, h := range d.h {
		h.idx = -1
	}
	d.h = nil
	return out
}

func (c *Client) watch() {
	d := &c.dog
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		var renew, expired []*holding
		wait := time.Hour
		d.mu.Lock()
		d.wakeAt = farFuture // awake: every add kicks, so none is missed before we sleep
		for len(d.h) > 0 && len(renew) < renewBatchMax {
			h := d.h[0]
			h.mu.Lock()
			ttl, deadline := h.ttl, h.deadline
			h.mu.Unlock()
			// Renewals come due a little early so that leases taken at
			// nearly the same time share one pipeline.
			slack := time.Duration(0)
			if h.renew && !h.busy {
				slack = ttl / 12
			}
			if h.due.Sub(now) > slack {
				wait = h.due.Sub(now)
				break
			}
			if h.busy || !h.renew || !now.Before(deadline) {
				heap.Pop(&d.h)
				expired = append(expired, h)
				continue
			}
			// While its renewal is in flight the holding waits on the heap
			// at its deadline, so a renewal that hangs still ends the lease
			// on time.
			h.busy = true
			h.due = deadline
			heap.Fix(&d.h, 0)
			renew = append(renew, h)
		}
		d.mu.Unlock()
		for _, h := range expired {
			h.lose("lease deadline passed before renewal")
		}
		if len(renew) > 0 {
			batch := renew
			if !c.goBg(func() { c.renew(batch) }) {
				return // closing
			}
			if len(renew) == renewBatchMax {
				wait = 0
			}
		}
		d.mu.Lock()
		d.wakeAt = now.Add(wait)
		d.mu.Unlock()
		timer.Reset(wait)
		select {
		case <-c.bg.Done():
			return
		case <-d.kick:
		case <-timer.C:
		}
	}
}

// renew extends a batch of leases in one pipeline.
func (c *Client) renew(batch []*holding) {
	var earliest time.Time
	for i, h := range batch {
		h.mu.Lock()
		if i == 0 || h.deadline.Before(earliest) {
			earliest = h.deadline
		}
		h.mu.Unlock()
	}
	ctx, cancel := context.WithDeadline(c.bg, earliest)
	defer cancel()
	sent := time.Now()
	cmds := c.runExtends(ctx, batch)
	for i, h := range batch {
		v, err := cmds[i].Int64()
		switch {
		case err == nil && v == 1:
			h.mu.Lock()
			if h.state == stateHeld {
				h.deadline = sent.Add(validity(h.ttl))
			}
			due := h.nextDue(sent)
			h.mu.Unlock()
			c.dog.reschedule(h, due)
		case err == nil || isForeign(h.key, err):
			h.lose("renewal found the lock gone")
		default:
			// Unknown: try again soon; the deadline still stands.
			c.cfg.logger.Debug("dlock: renewal failed", "lock", h.name, "err", err)
			h.mu.Lock()
			retry := time.Now().Add(h.ttl / 10)
			if h.deadline.Before(retry) {
				retry = h.deadline
			}
			h.mu.Unlock()
			c.dog.reschedule(h, retry)
		}
	}
}

func isForeign(key string, err error) bool {
	e := scriptErr(key, err)
	return e != err
}

// runExtends sends one extend per holding in a pipeline, loading the
// scripts the server had lost and resending.
func (c *Client) runExtends(ctx context.Context, batch []*holding) []*redis.Cmd {
	scripts := make([]*script, len(batch))
	send := func() []*redis.Cmd {
		cmds := make([]*redis.Cmd, len(batch))
		_, _ = c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			for i, h := range batch {
				h.mu.Lock()
				ttl := strconv.FormatInt(h.ttl.Milliseconds(), 10)
				h.mu.Unlock()
				s, keys, args := h.extendCall(ttl)
				scripts[i] = s
				cmds[i] = p.EvalSha(ctx, s.sha, keys, args...)
			}
			return nil
		})
		return cmds
	}
	cmds := send()
	loaded := map[*script]bool{}
	for i, cmd := range cmds {
		if s := scripts[i]; isNoScript(cmd.Err()) && !loaded[s] {
			if err := c.rdb.ScriptLoad(ctx, s.src).Err(); err != nil {
				return cmds
			}
			loaded[s] = true
		}
	}
	if len(loaded) > 0 {
		cmds = send()
	}
	return cmds
}

// dueHeap orders holdings by when the watchdog must next look at them.
type dueHeap []*holding

func (q dueHeap) Len() int           { return len(q) }
func (q dueHeap) Less(i, j int) bool { return q[i].due.Before(q[j].due) }
func (q dueHeap) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].idx, q[j].idx = i, j
}
func (q *dueHeap) Push(x any) {
	h := x.(*holding)
	h.idx = len(*q)
	*q = append(*q, h)
}
func (q *dueHeap) Pop() any {
	old := *q
	h := old[len(old)-1]
	old[len(old)-1] = nil
	h.idx = -1
	*q = old[:len(old)-1]
	return h
}
