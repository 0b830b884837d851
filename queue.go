package dlock

import (
	"strings"
	"time"

	"github.com/dlock-go/dlock/internal/wire"
)

// local is this Client's books about one lock it waits for: its waiters,
// and the two channels they need subscribed while one of them waits in the
// line at Redis (the lock's own, on which a release that frees it is
// published, and this Client's hand-over channel for it). A default-mode
// waiter beside a holder of this Client needs neither (see lock.beside).
// All fields are guarded by Client.mu.
type local struct {
	lk         *lock
	subscribed bool               // the channels are wanted from the hub
	ready      [2]<-chan struct{} // once subscribed: closed once each channel is
	queue      []*waiter          // default mode, in arrival order: only the head waits at Redis
	line       []*waiter          // waiters that releases wake: in the line at Redis, or beside
	users      int                // waiters registered
	heldBy     *holding           // the last of its waiters that obtained the lock
}

// A waiter is one Lock call that waits. Its fields are guarded by Client.mu,
// except the channels, which it receives from alone.
type waiter struct {
	h      *holding
	seq    uint64        // default mode: its arrival number in the Client, from 1
	turn   chan struct{} // default mode: closed once it heads the queue
	box    chan mail     // capacity 1: the lock was handed over or passed to it
	look   chan struct{} // capacity 1: look at the lock again
	seen   uint64        // the fence of the holder its last look found
	asleep bool          // a default-mode head asleep in line: a holder of ours may pass to it
	held   bool          // a look of its holding found the lock held (and answered in time)
	beside bool          // waiting beside a holder of ours, unsubscribed and not in line at Redis
}

// mail is what a waiter's box holds: a hand-over from Redis (fence), or a
// pass from a holder of this Client. Every send into a box holds Client.mu
// and wakes the waiter for good (asleep becomes false), so a box receives
// one of them at most and a pass never lands on a waiter that is taking a
// hand-over.
type mail struct {
	fence uint64
	pass  *pass
}

// queued reports whether default-mode waiters of this Client wait for key.
func (c *Client) queued(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	lc := c.locals[key]
	return lc != nil && len(lc.queue) > 0
}

// join registers h's Lock as a waiter for its lock: in default mode at the
// end of the Client's queue for it.
func (c *Client) join(lk *lock, h *holding) (*local, *waiter) {
	w := &waiter{h: h, box: make(chan mail, 1), look: make(chan struct{}, 1)}
	c.mu.Lock()
	defer c.mu.Unlock()
	lc := c.locals[lk.hash]
	if lc == nil {
		lc = &local{lk: lk}
		c.locals[lk.hash] = lc
	}
	lc.users++
	if !lk.fair {
		c.seq++ // one count for the Client: a holder's turn outlives the books it came from
		w.seq = c.seq
		w.turn = make(chan struct{})
		lc.queue = append(lc.queue, w)
		if len(lc.queue) == 1 {
			close(w.turn)
		}
	}
	return lc, w
}

// subscribe wants lc's channels from the hub, once for all its waiters.
func (c *Client) subscribe(lc *local) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !lc.subscribed {
		lc.subscribed = true
		lc.ready[0] = c.hub.Want(lc.lk.hash)
		lc.ready[1] = c.secondWant(lc.lk)
	}
}

// enterLine records that w waits in the line at Redis (or beside a holder
// of ours): hand-overs to its token reach it, and so do releases.
func (c *Client) enterLine(lc *local, w *waiter) {
	c.mu.Lock()
	lc.line = append(lc.line, w)
	c.byToken[w.h.token] = w
	c.mu.Unlock()
}

// rejoin makes w wait on with the fresh holding h, in its place in the
// queue, after its holding's grant came too late and was given back (see
// lock.wait): its old token leaves the Client's books, and w is out of the
// line until it enters it again with h. A hand-over to the old token that
// came meanwhile is dropped (the old token's give-back, already on its
// way, releases it at Redis): it must not be taken as one to h. No pass
// can have come: w has not been asleep since its grant reached it.
// It reports whether a look of the old holding found the lock held: the
// wait went as it should until its grant came late, and the start-over's
// backoff begins again (see lock.wait).
func (c *Client) rejoin(lc *local, w *waiter, h *holding) (held bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	held, w.held = w.held, false
	if c.byToken[w.h.token] == w {
		delete(c.byToken, w.h.token)
	}
	lc.line = remove(lc.line, w)
	w.h, w.seen, w.asleep, w.beside = h, 0, false, false
	select {
	case <-w.box:
	default:
	}
	drain(w.look)
	return held
}

// leave forgets w; the next waiter of the queue gets its turn, and the
// subscriptions go once nobody waits.
func (c *Client) leave(lc *local, w *waiter) {
	c.mu.Lock()
	defer c.mu.Unlock()
	w.asleep = false
	if w.h.live() {
		lc.heldBy = w.h // it obtained the lock: the next head may sleep behind it
	}
	if c.byToken[w.h.token] == w {
		delete(c.byToken, w.h.token)
	}
	lc.line = remove(lc.line, w)
	if len(lc.queue) > 0 && lc.queue[0] == w {
		lc.queue = lc.queue[1:]
		if len(lc.queue) > 0 {
			close(lc.queue[0].turn)
		}
	} else {
		lc.queue = remove(lc.queue, w)
	}
	lc.users--
	if lc.users == 0 {
		delete(c.locals, lc.lk.hash)
		if lc.subscribed {
			c.hub.Unwant(lc.lk.hash)
			c.secondUnwant(lc.lk)
		}
	}
}

func remove(ws []*waiter, w *waiter) []*waiter {
	for i, x := range ws {
		if x == w {
			copy(ws[i:], ws[i+1:])
			ws[len(ws)-1] = nil
			return ws[:len(ws)-1]
		}
	}
	return ws
}

// goBeside makes w wait beside a holder of ours (see lock.beside), unless
// lc's channels are subscribed already: then waiting in line costs nothing
// more. While w is beside, a release of ours that hands the lock to a
// waiter in line wakes it (handedAway).
func (c *Client) goBeside(lc *local, w *waiter) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	w.beside = !lc.subscribed || c.behindLocked(lc, w)
	return w.beside
}

// behindLocked reports whether the waiter before w obtained the lock and
// still holds it (pending or held) in a turn that includes w: it will pass
// the lock to w, or release it and wake w. Called with c.mu held.
func (c *Client) behindLocked(lc *local, w *waiter) bool {
	hb := lc.heldBy
	if hb == nil {
		return false
	}
	hb.mu.Lock()
	defer hb.mu.Unlock()
	return hb.st.live() && hb.turnEnd >= w.seq
}

// asleepBehind puts w, a new head, to sleep at once, without a look, if the
// waiter before it obtained the lock and still holds it (pending or held)
// in a turn that includes w: that holding passes the lock to w when it
// unlocks, or releases it and wakes w. It returns how long w may sleep
// before it looks anyway: the holding's remaining validity, at most a third
// of the liveness (a holding lost unnoticed tells w nothing).
func (c *Client) asleepBehind(lc *local, w *waiter) (time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	hb := lc.heldBy
	if hb == nil || !w.beside || len(lc.queue) == 0 || lc.queue[0] != w || len(w.box) != 0 {
		return 0, false
	}
	hb.mu.Lock()
	ok := hb.st.live() && hb.turnEnd >= w.seq
	left, fence := time.Until(hb.deadline), hb.fence
	hb.mu.Unlock()
	if !ok || left <= 0 {
		return 0, false
	}
	w.seen, w.asleep = fence, true
	return min(left, fairLiveness/3), true
}

// leaveBeside ends w's wait beside a holder of ours.
func (c *Client) leaveBeside(w *waiter) {
	c.mu.Lock()
	w.beside = false
	c.mu.Unlock()
}

// asleep records that w's last look found the holder with fence seen, and
// that w now sleeps: a default-mode head may be passed the lock meanwhile.
func (c *Client) asleep(lc *local, w *waiter, seen uint64) {
	c.mu.Lock()
	w.seen, w.held = seen, true
	// Not with mail already in its box: a hand-over came during its look.
	w.asleep = !lc.lk.fair && len(lc.queue) > 0 && lc.queue[0] == w && len(w.box) == 0
	c.mu.Unlock()
}

// awake ends w's sleep: no pass is made to it from now on. It returns what
// came into its box meanwhile, if anything.
func (c *Client) awake(w *waiter) mail {
	c.mu.Lock()
	defer c.mu.Unlock()
	w.asleep = false
	select {
	case m := <-w.box:
		return m
	default:
		return mail{}
	}
}

// extendTurn makes h's turn cover every waiter its Client has queued by
// now: the record of the pass that made h found nobody in the line at
// Redis, so no other Client waits for a turn. One that joins the line
// later waits for the turn as it stands when the next record finds it
// there (each record looks), not for one that grows without end.
//
// It reaches h whether h still holds the lock, is unlocking it, or has
// passed it on already: a record slower than a hold lands after h's
// Unlock, and then the holders h passed the lock to (each made before this
// record landed, as their records wait for it) are the ones whose turn it
// is. A pass made at the same moment copies h's turn after it is made
// (startPass), so one of the two sees the other.
func (c *Client) extendTurn(h *holding) {
	c.mu.Lock()
	seq := c.seq
	c.mu.Unlock()
	for h != nil {
		h = h.raiseTurn(seq)
	}
}

// turnFrom returns the last waiter of the turn that a holding of lc's lock
// obtained through Redis begins: the lock may be passed to the waiters
// queued by now, and then goes back to the line at Redis, to the next Client.
func (c *Client) turnFrom(lc *local) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.seq
}

// passOn gives h's lock (being unlocked) to this Client's head waiter for
// it, if that waiter is asleep in line and was queued before h's turn
// ended. It returns nil if there is no such waiter; otherwise the waiter's
// holding is pending, its Lock returns at once, and the pass is recorded at
// Redis in the background (see pass.go). ahead: h is itself pending, its
// record in flight, and its request slot not ours: the new record waits for
// that record to settle, so records still land one at a time and in order.
func (c *Client) passOn(h *holding, ahead bool) *pass {
	if h.lk.fair {
		return nil // Fair, semaphore and RWMutex holders keep the line's order
	}
	if h.lk.isString() {
		return nil // other libraries must see every release (see StringMutex)
	}
	if c.cfg.ack.on() {
		return nil // every grant goes through Redis, to be acknowledged
	}
	h.mu.Lock()
	deadline, turnEnd, records := h.deadline, h.turnEnd, 1
	if ahead {
		// Our record, and those ahead of it, land before this one: the
		// new lease lives on our deadline until then, inherited along
		// the chain from the last holder whose record had landed. Once
		// it is short, the chain ends: our own record first, then a pass
		// with the deadline it proves. (Turns that go on while nobody
		// waits at Redis no longer end it.)
		records += h.records
	}
	h.mu.Unlock()
	if turnEnd == 0 {
		return nil // not taken through Redis in default mode: no turn
	}
	now := time.Now()
	if deadline.Sub(now) < time.Duration(records)*passMargin {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	lc := c.locals[h.lk.hash]
	if lc == nil || len(lc.queue) == 0 || c.closed.Load() {
		return nil
	}
	if ahead && !h.recordInFlight() {
		return nil // passed on by a concurrent Unlock, or the record landed: finish decides
	}
	w := lc.queue[0]
	if !w.asleep || w.seq > turnEnd || len(w.box) != 0 {
		return nil
	}
	p := &pass{from: h, to: w.h, fence: h.fence + 1, deadline: deadline, turnEnd: turnEnd, records: records, ahead: ahead, done: make(chan struct{})}
	w.h.passedIn(p, now)
	if c.passHook != nil {
		c.passHook(h, w.h)
	}
	h.startPass(p)
	// Start the record before waking the waiter: the goroutine made
	// runnable last runs next on this P, and the waiter's Lock should
	// return first. (Close cannot have stopped goroutines: it takes c.mu
	// after setting closed, before it waits for them.)
	c.goBg(func() { c.record(p) })
	w.asleep = false
	w.box <- mail{pass: p} // empty: it is filled only under c.mu, and w was asleep
	return p
}

// handOver delivers a hand-over from Redis, heard on channel, to the
// waiter whose token it names, if it still waits for that channel's lock.
// A token is not one lock's: a MultiLock's parts share one, and a message
// of a part it has obtained already may come while it waits for the next.
func (c *Client) handOver(channel, token string, fence uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.late, lateKey(channel, token)) // it came (see expectHandOver)
	w := c.byToken[token]
	if w == nil || w.h.lk.handover != channel {
		return
	}
	w.asleep = false
	select {
	case w.box <- mail{fence: fence}:
		c.heard++
	default: // a pass came first: its record finds the lock not the passer's
	}
}

// expectHandOver runs when waiter w's own look found the lock already
// handed to it after an earlier look had put it in line: the hand-over's
// message should follow. If it does not come soon, the subscription of the
// hand-over channel is not hearing it (e.g. still on a server that a
// failover demoted), and the hub is told to check that channel.
func (c *Client) expectHandOver(lk *lock, w *waiter) {
	c.mu.Lock()
	if len(w.box) > 0 {
		c.mu.Unlock()
		return
	}
	key := lateKey(lk.handover, w.h.token)
	c.late[key] = true
	c.mu.Unlock()
	c.goBg(func() {
		t := time.NewTimer(lateHandOver)
		defer t.Stop()
		select {
		case <-c.bg.Done():
			return
		case <-t.C:
		}
		c.mu.Lock()
		missed := c.late[key]
		delete(c.late, key)
		c.mu.Unlock()
		if missed {
			c.hub.Suspect(lk.handover)
		}
	})
}

// lateKey is the key of c.late for a hand-over to token on channel.
func lateKey(channel, token string) string { return channel + " " + token }

// lateHandOver is how long after its waiter found it a hand-over message may
// still come before it counts as missed.
const lateHandOver = 200 * time.Millisecond

// released wakes the waiters in line for the lock key whose holder (or a
// later one) released it: fence f, or unknown (then every one looks).
func (c *Client) released(key string, f uint64, known bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	lc := c.locals[key]
	if lc == nil {
		return
	}
	for _, w := range lc.line {
		if !known || f >= w.seen {
			poke(w.look)
		}
	}
}

// wakeLocal tells this Client's waiters in line that a holding of ours
// with fence f freed the lock, without waiting for the published message.
func (c *Client) wakeLocal(key string, f uint64) { c.released(key, f, true) }

// handedAway tells this Client's waiters beside a holder of ours that the
// holder's release handed the lock to a waiter in the line at Redis (maybe
// another Client's): they look again, and wait in line if it is not theirs.
// Waiters in line need no telling: a hand-over to them is published on
// their channel.
func (c *Client) handedAway(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if lc := c.locals[key]; lc != nil {
		for _, w := range lc.line {
			if w.beside {
				poke(w.look)
			}
		}
	}
}

func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// clientHandler routes what the subscription hub hears to the Client's
// waiters: a hand-over to its waiter, a release to the waiters in line, and
// a gap in a subscription (messages may have been missed) to every waiter
// in line for that lock, which then looks again.
type clientHandler struct{ c *Client }

func (ch clientHandler) Message(channel, payload string) {
	// An election's observers (election.go) hear it too.
	ch.c.observers.heard(channel, payload, false)
	if p := ch.c.parent; p != nil { // a quorum master's: wake the quorum's waiters
		f, ok := wire.ParseWake(payload)
		p.released(channel, f, ok)
		return
	}
	if f, token, ok := wire.ParseHandOver(payload); ok {
		ch.c.handOver(channel, token, f)
		return
	}
	f, ok := wire.ParseWake(payload)
	ch.c.released(channel, f, ok)
}

func (ch clientHandler) Gap(channel string) {
	ch.c.gaps.Add(1)
	ch.c.observers.heard(channel, "", true)
	if p := ch.c.parent; p != nil {
		p.released(channel, 0, false)
		return
	}
	key, _ := strings.CutSuffix(channel, wire.InfixHandOver+ch.c.id)
	ch.c.released(key, 0, false)
}
