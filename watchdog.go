package dlock

import (
	"container/heap"
	"context"
	"sync"
	"time"

	"github.com/dlock-go/dlock/internal/driver"
)

// watchdog keeps every live holding of a Client on one timer heap: renewing
// leases come due at a third of their TTL, others at their deadline. One
// goroutine pops what is due and renews it in pipelined batches, so ten
// thousand held locks cost a few round trips per renewal period, not ten
// thousand timers and goroutines.
type watchdog struct {
	mu      sync.Mutex
	h       dueHeap
	kick    chan struct{}
	quit    chan struct{} // closed by stop
	done    chan struct{} // closed when the loop has ended
	started bool
	wakeAt  time.Time // when the loop's timer fires; a due before it needs a kick
}

// farFuture stands for "the watchdog loop is awake".
var farFuture = time.Unix(1<<62, 0)

// renewBatchMax bounds one renewal pipeline.
const renewBatchMax = 1000

func (d *watchdog) init() {
	d.kick = make(chan struct{}, 1)
	d.quit = make(chan struct{})
	d.done = make(chan struct{})
}

// stop ends the loop and waits for it: from then on every live holding is
// on the heap (the loop puts back each one it took off before it ends).
func (d *watchdog) stop() {
	d.mu.Lock()
	started := d.started
	d.started = true // no loop starts after this
	d.mu.Unlock()
	close(d.quit)
	if started {
		<-d.done
	}
}

// schedule puts a live holding on the heap at its next due time, or takes
// one that is not live off it. Every change of a holding's state or
// deadline is followed by a call, so the heap follows the latest.
func (d *watchdog) schedule(h *holding) {
	d.mu.Lock()
	h.mu.Lock()
	live := h.st.live()
	due, slack := h.nextDue()
	h.mu.Unlock()
	if !live {
		if h.idx >= 0 {
			heap.Remove(&d.h, h.idx)
		}
		d.mu.Unlock()
		return
	}
	h.due, h.slack = due, slack
	if h.idx >= 0 {
		heap.Fix(&d.h, h.idx)
	} else {
		heap.Push(&d.h, h)
	}
	// Wake the loop only if it would sleep past this due time: a kick per
	// lock would cost every acquisition a goroutine wake-up.
	kick := h.idx == 0 && due.Before(d.wakeAt)
	start := !d.started
	d.started = true
	d.mu.Unlock()
	if start && !h.c.goBg(h.c.watch) {
		close(d.done) // closing: the loop never runs
	}
	if kick {
		poke(d.kick)
	}
}

func (d *watchdog) remove(h *holding) {
	d.mu.Lock()
	if h.idx >= 0 {
		heap.Remove(&d.h, h.idx)
	}
	d.mu.Unlock()
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

// nextDue is when the watchdog must next look at h, and how much earlier it
// may: for a renewing held lease, a third of its validity after the last
// proof (a tenth of it after a renewal that failed), else its deadline. Its
// validity is the proved TTL, or less when a request of unknown outcome
// (an Extend to a shorter TTL) may have moved the deadline closer. Called
// with h.mu held.
func (h *holding) nextDue() (due time.Time, slack time.Duration) {
	if h.st == held && h.lk.renew && !h.busy {
		valid := min(h.proofTTL, h.deadline.Sub(h.proofAt))
		r := h.proofAt.Add(valid / 3)
		if t := h.tried.Add(valid / 10); t.After(r) {
			r = t
		}
		if r.Before(h.deadline) {
			// Renewals come due a little early so that leases taken at
			// nearly the same time share one pipeline.
			return r, valid / 12
		}
	}
	return h.deadline, 0
}

func (c *Client) watch() {
	d := &c.dog
	defer close(d.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		var due []*holding
		wait := time.Hour
		d.mu.Lock()
		d.wakeAt = farFuture // awake: every schedule kicks, so none is missed before we sleep
		for len(d.h) > 0 && len(due) < renewBatchMax {
			h := d.h[0]
			if left := h.due.Sub(now); left > h.slack {
				wait = left
				break
			}
			heap.Pop(&d.h)
			due = append(due, h)
		}
		d.mu.Unlock()
		var batch []*holding
		var ttls []time.Duration
		for _, h := range due {
			if gone, n := h.expiredNoted(now); gone {
				c.recordAside(n) // a slow instrument must not hold up the renewals of other leases
				continue
			}
			if ttl, ok := h.startRenewal(); ok {
				if c.renewalHook != nil {
					c.renewalHook(h)
				}
				batch, ttls = append(batch, h), append(ttls, ttl)
			}
			d.schedule(h) // while a renewal is in flight: at its deadline
		}
		if len(batch) > 0 {
			if !c.goBg(func() { c.renew(batch, ttls) }) {
				for _, h := range batch {
					h.endOp() // closing: no renewal
				}
				return
			}
			if len(due) == renewBatchMax {
				wait = 0
			}
		}
		d.mu.Lock()
		d.wakeAt = now.Add(wait)
		d.mu.Unlock()
		timer.Reset(wait)
		select {
		case <-d.quit:
			return
		case <-d.kick:
		case <-timer.C:
		}
	}
}

// renew extends a batch of holdings in one pipeline, each to the TTL in
// ttls; each holding's request slot is held.
func (c *Client) renew(batch []*holding, ttls []time.Duration) {
	sent := c.sendTime()
	earliest := sent.Add(time.Hour)
	for _, h := range batch {
		h.mu.Lock()
		h.tried = sent
		if h.deadline.Before(earliest) {
			earliest = h.deadline
		}
		h.mu.Unlock()
	}
	ctx, cancel := context.WithDeadline(c.bg, earliest)
	defer cancel()
	calls := make([]call, len(batch))
	for i, h := range batch {
		calls[i] = h.lk.proto.extend(h, formatMillis(ttls[i]))
	}
	var cmds []driver.Reply
	short := make([]error, len(calls))
	if c.q != nil {
		cmds = c.q.extends(ctx, calls)
	} else {
		cmds, short = c.runExtends(ctx, calls)
	}
	// Every reply is applied before anything is recorded: a slow
	// instrument holds up this goroutine only once no lease of the batch
	// waits for it.
	var seen []renewSeen
	if c.obs != nil {
		seen = make([]renewSeen, len(batch))
	}
	for i, h := range batch {
		v, err := replyInt(cmds[i])
		if err == nil && v == 1 && short[i] != nil {
			// It ran, but a failover now could lose it: as if unknown.
			err = short[i]
		}
		r := renewOK
		var n obsNote
		switch {
		case err == nil && v == 1:
			h.proved(sent, ttls[i])
		case err == nil || isForeign(err):
			r = renewLost
			_, n = h.endNoted(lost, lostErr("renewal found the lock gone"))
		default:
			// Unknown: it may have run (its TTL counts), or not (the
			// deadline stands). Try again soon.
			r = renewError
			c.cfg.logger.Debug("dlock: renewal failed", "lock", h.lk.name, "err", err)
			c.clusterHint(err)
			h.doubted(sent, ttls[i])
		}
		h.endOp()
		if seen != nil {
			seen[i] = renewSeen{r, n}
		}
	}
	for i, s := range seen {
		c.obs.renewed(batch[i], s.r)
		c.obs.record(s.n)
	}
}

// renewSeen is what a renewal observed: its outcome, and a loss it found.
type renewSeen struct {
	r int
	n obsNote
}

// recordAside records n on a goroutine of its own (one that may wait for
// a slow instrument), or here if none may start (the Client is closing).
func (c *Client) recordAside(n obsNote) {
	if n.h == nil {
		return
	}
	if !c.goBg(func() { c.obs.record(n) }) {
		c.obs.record(n)
	}
}

// runExtends sends the extends of a renewal in pipelines (see
// extendGroups), loading the scripts the server had lost and resending.
// With replica acknowledgement a WAIT follows each pipeline's extends, and
// short[i] is nil or the ErrNotReplicated error of cmds[i]'s pipeline.
func (c *Client) runExtends(ctx context.Context, calls []call) (cmds []driver.Reply, short []error) {
	cmds, short = make([]driver.Reply, len(calls)), make([]error, len(calls))
	for _, g := range c.extendGroups(ctx, calls, cmds) {
		lines := make([][]any, 0, len(g)+1)
		for _, i := range g {
			k := calls[i]
			lines = append(lines, k.s.line(k.keys, k.args))
		}
		send := func() {
			var r []driver.Reply
			if c.cfg.ack.on() {
				n, err := c.drv.Node(ctx, calls[g[0]].keys[0])
				if err != nil {
					for _, i := range g {
						cmds[i] = driver.Reply{Err: err}
					}
					return
				}
				r = n.Pipe(ctx, append(lines, c.cfg.ack.wait()), false)
				s := c.cfg.ack.shortOf(r[len(g)], "renewal")
				for _, i := range g {
					short[i] = s
				}
			} else {
				r = c.drv.Pipe(ctx, lines, false)
			}
			for j, i := range g {
				cmds[i] = r[j]
			}
		}
		send()
		loaded := map[*script]bool{}
		for _, i := range g {
			if s := calls[i].s; isNoScript(cmds[i].Err) && !loaded[s] {
				if err := c.drv.LoadScript(ctx, s.src); err != nil {
					return cmds, short
				}
				loaded[s] = true
			}
		}
		if len(loaded) > 0 {
			send()
		}
	}
	return cmds, short
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
