package dlock

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/internal/wire"
)

// An Election elects one leader among the candidates that campaign for a
// name, in the shape of etcd's concurrency.Election. It is a Fair mutex of
// that name (the same line, hand-over and fences) with the leader's value
// kept in the lock's own hash, so it works wherever a Fair mutex does (one
// server, Sentinel, Cluster; not in quorum mode):
//
//   - Candidates wait in arrival order; the leader's Lease is the lock's,
//     so its Context ends when leadership is lost and its Fence is the
//     term: strictly greater than every earlier leader's, so storage can
//     reject a deposed leader's writes.
//   - A leader that resigns hands leadership at once to the first live
//     candidate in line; one that dies or pauses past its TTL is succeeded
//     within about the TTL.
//   - A value is published only while its leader still holds the lock,
//     checked at Redis: a deposed leader never overwrites its successor's.
//
// An Election is one candidate: it holds at most one leadership at a time.
// Its methods are safe for concurrent use. An Election and a Mutex of the
// same name exclude each other, also when the Mutex is locked with a ctx
// from the leader's lease (it does not re-enter the leadership: it waits
// for it like any other); a Mutex holder is not a leader (it publishes no
// value).
type Election struct {
	m   *Mutex // Fair: the line and the lock
	ch  string // the election's channel (wire.ElectionChannel)
	err error  // quorum mode: elections need one line

	mu        sync.Mutex
	lease     *Lease // the leadership won and not resigned, if any
	campaigns bool   // a Campaign runs
}

// Leader is a leader as Election.Observe reports it: its value and its
// term (its lease's fence). The zero Leader means nobody leads.
type Leader struct {
	Value string
	Fence uint64
}

// MaxValueLen is the longest election value accepted, in bytes.
const MaxValueLen = wire.MaxValueLen

// Election returns the election called name. opts are the leader's lease
// options (TTL: how soon a leader that died is succeeded; NoRenew); Fair
// is implied. The name follows the rules of Mutex names; invalid names and
// options are reported by the Election's methods as ErrInvalidArgument, as
// is a Client made by NewQuorum.
func (c *Client) Election(name string, opts ...LockOption) *Election {
	e := &Election{
		m:  c.Mutex(name, append(opts[:len(opts):len(opts)], Fair())...),
		ch: wire.ElectionChannel(c.cfg.prefix, name),
	}
	e.m.lk.election = true
	if c.q != nil {
		e.err = invalidf("an Election in quorum mode: there is no one line across masters")
	}
	return e
}

// Name returns the election's name.
func (e *Election) Name() string { return e.m.lk.name }

// Campaign waits until this candidate leads the election, in arrival order
// among the candidates of every Client, then publishes value (see Proclaim)
// and returns the leader's Lease: its Fence is the term, its Context ends
// when leadership is lost (context.Cause ErrLockLost) or resigned. It waits
// until ctx ends, and then returns an error that errors.Is ctx.Err(),
// leaving no trace in the line. It returns ErrLockLost if the leadership
// was lost before Campaign could return it (for example when the reply of
// its publish came after the lease ran out). value is 1 to MaxValueLen
// bytes.
//
// A Campaign of an Election that already leads, or campaigns, returns
// ErrInvalidArgument: an Election is one candidate. The leadership is the
// Election's until Resign (or until it is lost); Lease.Unlock ends it as
// Resign does.
func (e *Election) Campaign(ctx context.Context, value string) (*Lease, error) {
	if err := e.check(value); err != nil {
		return nil, err
	}
	if err := e.enter(); err != nil {
		return nil, err
	}
	defer e.leave()
	// Not a reentrant Lock: a ctx from a lease of the same name must not
	// make this candidate share that holding.
	l, err := e.m.Lock(noReentry{ctx})
	if err != nil {
		return nil, err
	}
	err = e.publish(ctx, l, value)
	if err == nil {
		// The lease may have run out while the publish was on its way
		// (as Lock refuses a grant whose reply came too late): another
		// candidate may lead already.
		err = l.live()
	}
	if err != nil {
		// Give the lock on to the next candidate rather than leave it to
		// its TTL: it cannot be ours with our value.
		l.h.unlockNow(ctx, context.Canceled)
		return nil, err
	}
	e.mu.Lock()
	e.lease = l
	e.mu.Unlock()
	return l, nil
}

// enter makes e campaign, unless it leads or campaigns already.
func (e *Election) enter() error {
	e.mu.Lock()
	l := e.lease
	e.mu.Unlock()
	// Not under e.mu: live may end a lease past its deadline, and the
	// end is measured (no instrument is called under a lock: see obsNote).
	leads := l != nil && l.live() == nil
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.campaigns:
		return nameErr(e.Name(), invalidf("Campaign while another Campaign of this Election runs: an Election is one candidate"))
	case leads && e.lease == l:
		return nameErr(e.Name(), invalidf("Campaign while this Election leads (fence %d): Proclaim changes the value", l.Fence()))
	}
	e.campaigns, e.lease = true, nil
	return nil
}

func (e *Election) leave() {
	e.mu.Lock()
	e.campaigns = false
	e.mu.Unlock()
}

// Proclaim publishes value as the leader's, if this Election still leads:
// Redis checks that the leader's lease still owns the lock, with the fence
// it was granted, in the script that writes the value, so a deposed leader
// changes nothing. It returns ErrLockLost if this Election does not lead
// (it never won, resigned, or was deposed; then its lease ends too).
// Observers are notified. value is 1 to MaxValueLen bytes.
func (e *Election) Proclaim(ctx context.Context, value string) error {
	if err := e.check(value); err != nil {
		return err
	}
	e.mu.Lock()
	l := e.lease
	e.mu.Unlock()
	if l == nil {
		return nameErr(e.Name(), fmt.Errorf("%w: not the leader: this Election holds no leadership (Campaign first)", ErrLockLost))
	}
	return e.publish(ctx, l, value)
}

// Resign ends this Election's leadership: the lock goes at once to the
// first live candidate in line (see Fair), or is freed. It returns nil if
// the Election does not lead, and ErrLockLost if its leadership had been
// lost before; otherwise as Lease.Unlock (a Resign whose ctx ends is
// finished in the background).
func (e *Election) Resign(ctx context.Context) error {
	e.mu.Lock()
	l := e.lease
	e.lease = nil
	e.mu.Unlock()
	if l == nil {
		return nil
	}
	return l.Unlock(ctx)
}

// Leader returns the current leader's value and term (fence), read with
// one call. It returns ErrNoLeader if nobody leads: no candidate holds the
// election, or the candidate just handed it has not published its value
// yet (about one round trip after the hand-over).
func (e *Election) Leader(ctx context.Context) (value string, fence uint64, err error) {
	if err := e.usable(ctx); err != nil {
		return "", 0, err
	}
	st, _, err := e.read(ctx)
	if err != nil {
		return "", 0, err
	}
	if !st.Elected {
		return "", 0, nameErr(e.Name(), ErrNoLeader)
	}
	return st.Value, st.Fence, nil
}

// check reports what is wrong with the Election or value.
func (e *Election) check(value string) error {
	switch {
	case e.err != nil:
		return nameErr(e.Name(), e.err)
	case e.m.lk.err != nil:
		return nameErr(e.Name(), e.m.lk.err)
	}
	if err := wire.CheckValue(value); err != nil {
		return nameErr(e.Name(), fmt.Errorf("%w: %w", ErrInvalidArgument, err))
	}
	return nil
}

// usable reports why a call cannot be made now, as Lock's first checks.
func (e *Election) usable(ctx context.Context) error {
	lk := &e.m.lk
	switch {
	case e.err != nil:
		return nameErr(lk.name, e.err)
	case lk.err != nil:
		return nameErr(lk.name, lk.err)
	case lk.c.closed.Load():
		return nameErr(lk.name, ErrClosed)
	case ctx.Err() != nil:
		return lk.fail(ctx, ctx.Err())
	}
	return nil
}

// publish runs proclaim.lua for the leadership l.
func (e *Election) publish(ctx context.Context, l *Lease, value string) error {
	if err := l.live(); err != nil {
		return err
	}
	lk := &e.m.lk
	c := lk.c
	if err := c.pubsubReady(ctx); err != nil {
		return lk.fail(ctx, err)
	}
	v, err := c.eval(ctx, call{proclaimScript, lk.keyArr[:1], []any{l.Token(), formatUint(l.Fence()), value, e.ch, c.ps.arg}})
	if err != nil {
		c.clusterHint(err)
		return lk.fail(ctx, err)
	}
	if r, _ := v.([]any); len(r) > 0 && r[0] == int64(wire.ProclaimDone) {
		return nil
	}
	if l.live() == nil { // not while Unlock (Resign) is under way: it settles the lease
		l.h.lose("proclaim found the lock no longer this leader's")
	}
	return nameErr(lk.name, l.h.causeOr(fmt.Errorf("%w: proclaim: no longer the leader", ErrLockLost)))
}

// read reads the election at Redis (leader.lua): its state and the
// lock's remaining lease (negative: no key, or no expiry).
func (e *Election) read(ctx context.Context) (wire.LeaderState, time.Duration, error) {
	lk := &e.m.lk
	v, err := lk.c.eval(ctx, call{leaderScript, lk.keyArr[:1], nil})
	if err != nil {
		lk.c.clusterHint(err)
		err = scriptErr(lk.hash, "election", err)
		if isForeign(err) {
			return wire.LeaderState{}, 0, nameErr(lk.name, err)
		}
		return wire.LeaderState{}, 0, lk.fail(ctx, err)
	}
	r, _ := v.([]any)
	st, ok := wire.ReadLeader(r)
	if !ok || len(r) != len(wire.LeaderFields)+1 {
		return st, 0, nameErr(lk.name, fmt.Errorf("unexpected leader.lua reply %v", v))
	}
	pttl, _ := r[len(r)-1].(int64)
	switch {
	case st.Kind != "":
		return st, 0, nameErr(lk.name, &foreignError{fmt.Sprintf("Redis key %q is a dlock %s, not an election", lk.hash, st.Kind)})
	case !st.Exists && pttl != -2:
		return st, 0, nameErr(lk.name, &foreignError{fmt.Sprintf("Redis key %q is a hash that dlock did not write, not an election", lk.hash)})
	}
	return st, time.Duration(pttl) * time.Millisecond, nil
}

// noReentry is a ctx that hides the lease it may descend from (see
// Client.heldIn), so that a Lock made with it never re-enters a holding.
type noReentry struct{ context.Context }

func (n noReentry) Value(key any) any {
	if key == (leaseKey{}) {
		return nil
	}
	return n.Context.Value(key)
}

// Observe returns a channel that reports the election's leader: first the
// current one, then every change of leader or value, in order (the zero
// Leader when nobody leads). The channel holds one report: a reader that
// falls behind finds the latest, never an older one after a newer. Changes
// are notified by the publishing script and by releases (pub/sub on the
// election's and the lock's channels, one subscription per Client); a
// leader that died is noticed when its lock expires, and after a gap in
// the subscription the election is read again. The channel is closed when
// ctx ends, when the Client closes, and at once for an invalid name, a
// quorum Client, or a key that is not an election.
func (e *Election) Observe(ctx context.Context) <-chan Leader {
	out := make(chan Leader, 1)
	c := e.m.lk.c
	if e.usable(ctx) != nil {
		close(out)
		return out
	}
	w := &watcher{election: e.ch, wake: make(chan struct{}, 1)}
	keys := []string{e.m.lk.hash, e.ch}
	c.observers.add(w, keys)
	if !c.goBg(func() {
		defer close(out)
		defer c.observers.remove(w, keys)
		e.follow(ctx, w, out)
	}) {
		c.observers.remove(w, keys)
		close(out)
	}
	return out
}

// follow is Observe's goroutine: it reads the election once its channels
// are subscribed (or after subscribeWait, and again once they are), then
// applies what it hears, reading again after a release, a gap or the
// lock's expiry, until ctx or the Client ends.
func (e *Election) follow(ctx context.Context, w *watcher, out chan Leader) {
	lk := &e.m.lk
	c := lk.c
	ready := [2]<-chan struct{}{c.hub.Want(lk.hash), c.hub.Want(e.ch)}
	defer c.hub.Unwant(lk.hash)
	defer c.hub.Unwant(e.ch)
	bound := time.NewTimer(subscribeWait)
subscribing:
	for _, r := range ready {
		select {
		case <-r:
		case <-bound.C: // read anyway, and again once it is up (below)
			break subscribing
		case <-ctx.Done():
			return
		case <-c.bg.Done():
			return
		}
	}
	bound.Stop()
	// A subscription not up yet at the first read: what is published
	// before it is up is heard by nobody, and its first confirmation comes
	// with no Gap, so the election is read again once it is up.
	var late []<-chan struct{}
	for _, r := range ready {
		select {
		case <-r:
		default:
			late = append(late, r)
		}
	}
	var lateUp <-chan struct{} // the first of late, or nil
	if len(late) > 0 {
		lateUp = late[0]
	}
	var v view
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	reread, backoff := true, 10*time.Millisecond
	for {
		if reread {
			st, left, err := e.read(ctx)
			switch {
			case ctx.Err() != nil || c.closed.Load() || (err != nil && permanent(err)):
				return
			case err != nil:
				timer.Reset(backoff) // the server did not answer: read again soon
				backoff = min(2*backoff, time.Second)
			default:
				backoff = 10 * time.Millisecond
				v.read(st, out)
				timer.Reset(expiryWait(st, left))
			}
		}
		select {
		case <-w.wake:
		case <-lateUp:
			late, lateUp = late[1:], nil
			if len(late) > 0 {
				lateUp = late[0]
			}
			reread = true
			continue
		case <-timer.C:
			reread = true
			continue
		case <-ctx.Done():
			return
		case <-c.bg.Done():
			return
		}
		msgs, again := w.take()
		for _, m := range msgs {
			f, n, value, ok := wire.ParseProclaimed(m)
			again = again || !ok || v.proclaimed(position{f, n}, Leader{Value: value, Fence: f}, out)
		}
		c.observers.applied.Add(uint64(len(msgs)))
		reread = again
	}
}

// expiryWait is how long an observer waits before it reads the election
// again without being told anything: until the holder's lock would expire
// unrenewed (a leader that died says nothing); with no holder, a message
// comes first.
func expiryWait(st wire.LeaderState, left time.Duration) time.Duration {
	if !st.Owned || left < 0 {
		return time.Hour
	}
	return left + time.Millisecond
}

// position orders what an observer learns: the term, then the number of
// the value within the key (proclaim.lua's vn). Every message and every
// read carries one, so a message that comes after a newer read is known
// for older.
type position struct{ fence, seq uint64 }

func (p position) after(q position) bool {
	return p.fence > q.fence || p.fence == q.fence && p.seq > q.seq
}

// view is what an observer reported last, and the newest position it saw.
type view struct {
	at   position
	last Leader
	sent bool
	// gone: the last read found no key, which has no position. A message
	// taken after it may have been published before it (it waited in the
	// mailbox during the read), so it is not reported but read again.
	gone bool
}

// proclaimed applies a published value at p; it reports whether the
// election must be read again: p begins a term that v had not seen (a
// leader that dies says nothing: its lock's expiry is read), or p cannot
// be ordered against the last read.
func (v *view) proclaimed(p position, l Leader, out chan Leader) (again bool) {
	if !p.after(v.at) {
		return false // a read already showed this, or later
	}
	if v.gone {
		return true
	}
	again = p.fence != v.at.fence
	v.at = p
	v.report(l, out)
	return again
}

// read applies a read of the election.
func (v *view) read(st wire.LeaderState, out chan Leader) {
	v.gone = !st.Exists
	if !st.Exists { // expired or reclaimed: nobody leads; no position to learn
		v.report(Leader{}, out)
		return
	}
	p := position{st.Fence, st.Seq}
	if v.at.after(p) {
		return // older than a message already applied (a failover lost it): keep the newer
	}
	v.at = p
	if st.Elected {
		v.report(Leader{Value: st.Value, Fence: st.Fence}, out)
	} else {
		v.report(Leader{}, out)
	}
}

// report sends l unless it was the last sent; an unread older report in
// out is replaced (only this goroutine sends).
func (v *view) report(l Leader, out chan Leader) {
	if v.sent && v.last == l {
		return
	}
	v.last, v.sent = l, true
	select {
	case <-out:
	default:
	}
	out <- l
}

// watchers routes what the hub hears on the channels of observed
// elections to the observers' goroutines.
type watchers struct {
	n       atomic.Int64  // observers registered: heard costs a Client that has none one load
	applied atomic.Uint64 // election messages the observers' goroutines applied (for tests)
	mu      sync.Mutex
	by      map[string][]*watcher // by channel
}

// A watcher is one Observe's mailbox.
type watcher struct {
	election string // the election's channel; the other is the lock's

	mu     sync.Mutex
	msgs   []string      // election messages heard, oldest first
	reread bool          // read the election again: a release, a gap, an overflow
	wake   chan struct{} // capacity 1
}

// maxQueued bounds the messages a watcher keeps for its goroutine; beyond
// it they are dropped for one read, which finds the latest.
const maxQueued = 64

func (ws *watchers) add(w *watcher, channels []string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.by == nil {
		ws.by = map[string][]*watcher{}
	}
	for _, ch := range channels {
		ws.by[ch] = append(ws.by[ch], w)
	}
	ws.n.Add(1)
}

func (ws *watchers) remove(w *watcher, channels []string) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for _, ch := range channels {
		list := ws.by[ch]
		for i, x := range list {
			if x == w {
				list = append(list[:i:i], list[i+1:]...)
				break
			}
		}
		if len(list) == 0 {
			delete(ws.by, ch)
		} else {
			ws.by[ch] = list
		}
	}
	ws.n.Add(-1)
}

// heard hands a message (or a gap) on channel to its watchers: a message
// on an election's channel is queued; anything else (a release on the
// lock's channel, a gap) makes them read the election again.
func (ws *watchers) heard(channel, payload string, gap bool) {
	if ws.n.Load() == 0 {
		return
	}
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for _, w := range ws.by[channel] {
		w.mu.Lock()
		switch {
		case gap || channel != w.election:
			w.reread = true
		case len(w.msgs) == maxQueued:
			w.msgs, w.reread = w.msgs[:0], true
		default:
			w.msgs = append(w.msgs, payload)
		}
		w.mu.Unlock()
		poke(w.wake)
	}
}

// take returns the queued messages and whether to read again.
func (w *watcher) take() ([]string, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	m, r := w.msgs, w.reread
	w.msgs, w.reread = nil, false
	return m, r
}

var (
	proclaimScript = loadScript(wire.Proclaim)
	leaderScript   = loadScript(wire.Leader)
)
