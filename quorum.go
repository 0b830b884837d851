package dlock

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/internal/wire"
	"github.com/redis/go-redis/v9"
)

// quorum is a Client's masters in quorum mode (NewQuorum): every grant,
// extension and release goes to all of them at once and counts only with a
// majority.
type quorum struct {
	members []*member
	maj     int
	node    time.Duration // per-master timeout of one request
	delay   time.Duration // restart delay (see quorum_acquire.lua)
	epoch   string        // the epoch key
}

// member is one master of a quorum: a Client of its own over it, for its
// pub/sub and its scripts, that never takes a lock itself.
type member struct {
	c    *Client
	rdb  *redis.Client
	addr string
	// certified: the epoch key is believed set (quorum_acquire.lua answers
	// {2, -1} when it is not, after which it is set again from INFO).
	certified atomic.Bool
	certMu    sync.Mutex // one certification at a time
}

var (
	quorumAcquireScript = loadScript(wire.QuorumAcquire)
	quorumFenceScript   = loadScript(wire.QuorumFence)
	quorumEpochScript   = loadScript(wire.QuorumEpoch)
)

// Quorum defaults (see WithNodeTimeout and WithRestartDelay).
const (
	DefaultNodeTimeout  = 50 * time.Millisecond
	DefaultRestartDelay = 3 * DefaultTTL
)

// quorumSlack is what a quorum lease's validity loses besides the 1% of
// its TTL for clock rates (validUntil): the masters expire keys with
// millisecond precision, and each may round against us (the Redis
// "Distributed Locks" page adds 2 ms the same way).
const quorumSlack = 2 * time.Millisecond

// NewQuorum returns a Client that takes every lock on a majority of rdbs,
// independent Redis masters (the Redlock algorithm): at least 3, each a
// go-redis Client of one master (a failover client too), no two the same.
// An odd number is the sensible choice: with N masters a lock needs N/2+1
// of them, so N = 4 tolerates one master down, as N = 3 does, at a greater
// cost. The Client does not own rdbs: Close leaves them open.
//
// Mutex works as on one server, in default mode (Fair, RWMutex and
// Semaphore report errors.ErrUnsupported): Lock, TryLock, Do, reentrancy,
// the lease context, watchdog renewal, Extend, TTL and Unlock. A request
// goes to every master at once, each bounded by WithNodeTimeout; it counts
// only with a majority of grants, and a lease is valid until TTL after its
// first send, less 1% of the TTL and 2 ms for clock drift, which comes out
// below zero (not obtained) if the masters took too long. A failed acquire
// is given back on every master, including those whose reply was lost. A
// renewal needs a majority too: a lease that cannot get one ends with
// ErrLockLost. Waiting is notified by a release on any master.
//
// Fences strictly increase in the order leases are granted while the
// masters keep their data: a grant raises its counter to its fence on a
// majority before Lock returns (see docs/PROTOCOL.md).
//
// What quorum mode assumes (the conditions of the Redlock argument): the
// clocks of the masters and of this process run at nearly the same rate
// (within 1%) and no master's clock jumps; and a master that lost its data
// (a restart without persistence) does not vote until every lease it may
// have granted has expired. dlock enforces the last itself: a master's
// data carries an epoch key, set from its uptime, and a master without it,
// or whose data is younger than WithRestartDelay, refuses to vote for the
// rest of the delay. Every Client of a quorum must use the same restart
// delay, and no lease may be longer (a TTL or Extend above it is refused).
func NewQuorum(rdbs []redis.UniversalClient, opts ...Option) (*Client, error) {
	cfg := defaultClientConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.logger == nil {
		cfg.logger = noLogger()
	}
	switch {
	case len(rdbs) < 3:
		return nil, invalidf("NewQuorum: %d masters: quorum mode needs at least 3 independent masters", len(rdbs))
	case cfg.ack.n != 0:
		return nil, invalidf("NewQuorum: WithReplicaAck does not apply to quorum mode (a majority of masters stands in for replicas)")
	case cfg.quorum.err != nil:
		return nil, cfg.quorum.err
	}
	if err := validPrefix(cfg.prefix); err != nil {
		return nil, err
	}
	q := &quorum{maj: len(rdbs)/2 + 1, node: cfg.quorum.node, delay: cfg.quorum.delay, epoch: wire.EpochKey(cfg.prefix)}
	seen := map[string]int{}
	for i, r := range rdbs {
		rc, ok := r.(*redis.Client)
		if !ok || rc == nil {
			return nil, invalidf("NewQuorum: master %d is a %T: each must be a *redis.Client of one master (or a failover client)", i, r)
		}
		addr := rc.Options().Addr
		if j, dup := seen[addr]; dup && addr != "" && rc.Options().Dialer == nil {
			return nil, invalidf("NewQuorum: masters %d and %d are both %s: the masters must be independent", j, i, addr)
		}
		seen[addr] = i
		q.members = append(q.members, &member{rdb: rc, addr: addr})
	}
	c := newClient(nil, cfg)
	c.q = q
	memberOpts := []Option{WithPrefix(cfg.prefix), WithLogger(cfg.logger), WithIdleExpiry(cfg.idle), WithAutoPipeline(false)}
	for _, m := range q.members {
		m.c = New(m.rdb, memberOpts...)
		m.c.parent = c
	}
	return c, nil
}

// WithNodeTimeout bounds each request to one master in quorum mode
// (NewQuorum): a master that has not answered by then counts as not
// granting (its outcome unknown: what it may have granted is given back).
// Keep it far below the TTL: a grant's validity is what is left of the TTL
// after the masters answered. Default DefaultNodeTimeout.
func WithNodeTimeout(d time.Duration) Option {
	return func(c *clientConfig) {
		c.quorum.node, c.quorum.set = d, "WithNodeTimeout"
		if d < time.Millisecond {
			c.quorum.err = invalidf("WithNodeTimeout: %v: must be at least 1ms", d)
		}
	}
}

// WithRestartDelay is how long a quorum master whose data began recently
// (it restarted without persistence, or is new) refuses to vote: at least
// the longest TTL of any Client of the quorum, which must all use the same
// delay. Leases longer than it are refused. 0 turns the check off, which is
// safe only with appendfsync always on every master. Default
// DefaultRestartDelay.
func WithRestartDelay(d time.Duration) Option {
	return func(c *clientConfig) {
		c.quorum.delay, c.quorum.set = d, "WithRestartDelay"
		if d < 0 {
			c.quorum.err = invalidf("WithRestartDelay: %v: must not be negative", d)
		}
	}
}

// quorumConfig holds the quorum-only options.
type quorumConfig struct {
	node, delay time.Duration
	set         string // the name of a quorum option given (refused by New)
	err         error
}

// checkLock reports what a lock of kind with cfg cannot do in quorum mode.
func (q *quorum) checkLock(kind string, cfg lockConfig) error {
	switch {
	case kind == wire.KindRWMutex:
		return fmt.Errorf("RWMutex in quorum mode: %w", errors.ErrUnsupported)
	case kind == wire.KindSemaphore:
		return fmt.Errorf("Semaphore in quorum mode: %w", errors.ErrUnsupported)
	case cfg.fair:
		return fmt.Errorf("a Fair mutex in quorum mode: %w (there is no one line across masters)", errors.ErrUnsupported)
	case q.delay > 0 && cfg.ttl > q.delay:
		return invalidf("TTL %v is above the quorum's restart delay (%v, WithRestartDelay): a restarted master could vote while such a lease is valid", cfg.ttl, q.delay)
	}
	return nil
}

// A vote is one master's answer to a request.
type vote struct {
	i   int
	v   any
	err error
}

// fanOut sends f to every master at once, each bounded by the per-master
// timeout (and ctx), and delivers the answers as they come. The channel
// gets exactly one vote per master.
func (q *quorum) fanOut(ctx context.Context, f func(ctx context.Context, m *member) (any, error), late func(m *member, v any, err error)) <-chan vote {
	out := make(chan vote, len(q.members))
	for i, m := range q.members {
		go func() {
			nctx, cancel := context.WithTimeout(ctx, q.node)
			defer cancel()
			var l func(any, error)
			if late != nil {
				l = func(v any, err error) { late(m, v, err) }
			}
			v, err := m.c.aside(nctx, func(ctx context.Context) (any, error) { return f(ctx, m) }, l)
			out <- vote{i, v, err}
		}()
	}
	return out
}

// all collects every master's vote (in master order).
func (q *quorum) all(votes <-chan vote) []vote {
	out := make([]vote, len(q.members))
	for range q.members {
		v := <-votes
		out[v.i] = v
	}
	return out
}

// acquire asks every master for h's lock. It returns as soon as a majority
// granted (then the fence is raised on them, see raise), or once no
// majority can grant; what a failed attempt took is given back. r.left is
// set when other holders answered: every lease of theirs has ended by then.
// split: no majority holds it for others (contenders split the votes, or
// masters are down), so a retry soon may win without a release to wake it.
func (q *quorum) acquire(ctx context.Context, h *holding) (r look, split bool, err error) {
	lk := h.lk
	r.sent = h.c.sendTime()
	delay := formatMillis(q.delay)
	votes := q.fanOut(ctx, func(ctx context.Context, m *member) (any, error) {
		if !m.certified.Load() {
			if err := q.certify(ctx, m); err != nil {
				return nil, err
			}
		}
		return quorumAcquireScript.run(ctx, m.c.rdb, []string{lk.hash, q.epoch}, h.token, lk.ttlArg, delay)
	}, func(m *member, v any, err error) {
		if granting(v, err) {
			q.late(h, m)
		}
	})
	n := len(q.members)
	granted := make(map[int]uint64, n)
	var doubt, held, refused int // refused: no vote (restarting) or a bad reply
	var firstErr error
	var left time.Duration
	got := 0
	for ; got < n && len(granted) < q.maj && n-held-refused-doubt >= q.maj; got++ {
		v := <-votes
		a, _ := v.v.([]any)
		switch {
		case v.err != nil:
			if isForeign(v.err) {
				q.drain(votes, n-got-1)
				q.give(ctx, h)
				return r, false, lk.kindErr(v.err)
			}
			firstErr = cmp(firstErr, v.err)
			doubt++
		case len(a) < 2:
			firstErr = cmp(firstErr, fmt.Errorf("unexpected acquire reply %v", v.v))
			refused++
		case a[0] == int64(1):
			f, _ := a[1].(int64)
			granted[v.i] = uint64(f)
		case a[0] == int64(2):
			if ms, _ := a[1].(int64); ms < 0 {
				q.members[v.i].certified.Store(false)
			}
			refused++
		default:
			ms, _ := a[1].(int64)
			if ms < 0 { // no expiry (not set by dlock): look again after a TTL
				ms = lk.ttl.Milliseconds()
			}
			left = max(left, time.Duration(ms)*time.Millisecond)
			held++
		}
	}
	if doubt > 0 {
		h.acqDoubt = true // it may yet run, with the lock's TTL
	}
	if len(granted) >= q.maj {
		// Masters that answer later keep their grant until Unlock (by
		// token), or give it back if they answer after their timeout.
		fence, ok := q.raise(ctx, h, granted)
		if ok && time.Now().Before(validUntil(r.sent, lk.ttl)) {
			r.ok, r.fence = true, fence
			return r, false, nil
		}
		why := "its validity ran out while the masters answered"
		if !ok {
			why = "its fence could not be raised on a majority"
		}
		q.drain(votes, n-got)
		q.give(ctx, h)
		return r, true, fmt.Errorf("acquire: %d of %d masters granted, but %s: %w", len(granted), n, why, ErrNotObtained)
	}
	// No majority: wait for the rest (bounded by the per-master timeout),
	// so that everything it granted is given back.
	doubt += q.drain(votes, n-got)
	if len(granted)+doubt > 0 {
		q.give(ctx, h)
	}
	if held > 0 {
		r.left = left
		return r, held < q.maj, nil
	}
	if doubt == n {
		return r, false, fmt.Errorf("acquire: no master answered: %w", firstErr)
	}
	return r, true, q.shortErr("acquire", len(granted), held, refused, doubt, firstErr)
}

// late deals with a grant (or a possible one) of h's lock by master m in
// an answer that came after m's timeout, so that no attempt counted it.
// While h's Lock still tries, or h holds the lock, it is left in place: it
// is h's own, by token; a later attempt of h counts it (a retry) or gives
// it back with the rest, Unlock releases it on every master, and if Lock
// gives up, quit gives it back. Giving it back now could take the master
// from under a later attempt that counted it, leaving the lease on a
// minority. Once h has ended, it is given back here.
func (q *quorum) late(h *holding, m *member) {
	h.mu.Lock()
	keep := h.st == waiting && !h.quit || h.st.live()
	h.kept = h.kept || keep
	h.mu.Unlock()
	if !keep {
		q.dropLater(h.lk, m, h.token)
	}
}

// quit ends h's Lock or TryLock that did not obtain the lock: late answers
// give back what they granted from now on, and what they left to h before
// is given back now.
func (q *quorum) quit(ctx context.Context, h *holding) {
	h.mu.Lock()
	h.quit = true
	kept := h.kept
	h.mu.Unlock()
	if kept {
		q.give(ctx, h)
	}
}

// granting reports whether an acquire's reply granted the lock, or might
// have (an error).
func granting(v any, err error) bool {
	a, ok := v.([]any)
	return err != nil || ok && len(a) >= 2 && a[0] == int64(1)
}

// drain waits for the last k votes and returns how many granted or may have.
func (q *quorum) drain(votes <-chan vote, k int) int {
	g := 0
	for range k {
		if v := <-votes; granting(v.v, v.err) {
			g++
		}
	}
	return g
}

// shortErr says why a request had no majority: masters that granted, held
// by others, refused (restarting) and did not answer.
func (q *quorum) shortErr(what string, ok, held, refused, unknown int, err error) error {
	msg := fmt.Sprintf("%s: %d of %d masters granted, %d needed (%d held by others, %d not voting after a restart, %d did not answer)",
		what, ok, len(q.members), q.maj, held, refused, unknown)
	if err != nil {
		return fmt.Errorf("%s: %w", msg, err)
	}
	return errors.New(msg)
}

func cmp(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// raise makes h's fence the largest that the granting masters handed out
// and raises the counter to it on each of them that handed out less. It
// reports whether a majority now has it.
func (q *quorum) raise(ctx context.Context, h *holding, granted map[int]uint64) (uint64, bool) {
	var fence uint64
	for _, f := range granted {
		fence = max(fence, f)
	}
	have, want := 0, 0
	for _, f := range granted {
		if f == fence {
			have++
		} else {
			want++
		}
	}
	if want == 0 || have >= q.maj && !raiseAll {
		return fence, have >= q.maj
	}
	fs := formatUint(fence)
	done := make(chan bool, len(granted))
	for i, f := range granted {
		if f == fence {
			continue
		}
		m := q.members[i]
		go func() {
			nctx, cancel := context.WithTimeout(ctx, q.node)
			defer cancel()
			v, err := m.c.aside(nctx, func(ctx context.Context) (any, error) {
				return quorumFenceScript.run(ctx, m.c.rdb, []string{h.lk.hash}, h.token, fs)
			}, nil)
			done <- err == nil && v == int64(1)
		}()
	}
	for range want {
		if <-done {
			have++
		}
	}
	return fence, have >= q.maj
}

// raiseAll: raise the counter on every granting master (false: only until
// a majority has it, which the proof needs).
const raiseAll = true

// give gives back what h's failed attempt took, on every master (by
// token: a master that did not grant is not touched).
func (q *quorum) give(ctx context.Context, h *holding) {
	q.dropAll(ctx, h.lk, h.token)
}

// dropAll releases token's lock on every master without waking waiters
// (the payload 0 is below every fence a waiter saw: see join). Masters
// that cannot be reached keep it until its TTL.
func (q *quorum) dropAll(ctx context.Context, lk *lock, token string) {
	_ = q.all(q.fanOut(context.WithoutCancel(ctx), func(ctx context.Context, m *member) (any, error) {
		return q.releaseOn(ctx, m, lk, token, "0")
	}, nil))
}

// dropLater releases token's lock on m in the background.
func (q *quorum) dropLater(lk *lock, m *member, token string) {
	lk.c.goBg(func() {
		ctx, cancel := context.WithTimeout(lk.c.bg, min(lk.ttl, 5*time.Second))
		defer cancel()
		_, _ = q.releaseOn(ctx, m, lk, token, "0")
	})
}

// releaseOn runs release.lua for token on m (without a line), publishing
// fence as the released fence.
func (q *quorum) releaseOn(ctx context.Context, m *member, lk *lock, token, fence string) (any, error) {
	if err := m.c.pubsubReady(ctx); err != nil {
		return nil, err
	}
	return releaseScript.run(ctx, m.c.rdb, []string{lk.hash}, token, fence, m.c.idleArg, lk.hash, m.c.ps.arg)
}

// release releases h on every master and returns what holding.release
// makes of one master's reply: freed if no majority said the lock was not
// h's (masters that failed keep it until its TTL, and do not make a
// majority that could grant it to someone else less likely than a master
// down would), not the owner if a majority said so, and an error if too
// few answered to tell.
func (q *quorum) release(ctx context.Context, h *holding) (any, error) {
	votes := q.all(q.fanOut(ctx, func(ctx context.Context, m *member) (any, error) {
		return q.releaseOn(ctx, m, h.lk, h.token, h.fenceStr)
	}, nil))
	var ok, no int
	var firstErr error
	for _, v := range votes {
		code, _ := v.v.(int64)
		switch {
		case v.err != nil:
			firstErr = cmp(firstErr, v.err)
		case code == wire.ReleaseNotOwner:
			no++
		default:
			ok++
		}
	}
	switch {
	case no >= q.maj:
		return int64(wire.ReleaseNotOwner), nil
	case ok+no >= q.maj || ok > 0 && firstErr == nil:
		return int64(wire.ReleaseFreed), nil
	}
	return nil, fmt.Errorf("release: %d of %d masters answered: %w", ok+no, len(q.members), firstErr)
}

// ask runs an extend or pttl call about h on every master and combines
// the answers as ask expects one master's: an extend is 1 with a majority
// that extended, 0 once no majority can have, else an error; a pttl is how
// long a majority still has it (-1: no majority can).
func (q *quorum) ask(ctx context.Context, k call) (any, error) {
	votes := q.all(q.fanOut(ctx, func(ctx context.Context, m *member) (any, error) {
		return k.s.run(ctx, m.c.rdb, k.keys, k.args...)
	}, nil))
	return q.combine(k, votes)
}

func (q *quorum) combine(k call, votes []vote) (any, error) {
	var ms []int64
	var no int
	var firstErr error
	for _, v := range votes {
		n, isInt := v.v.(int64)
		switch {
		case v.err != nil:
			if isForeign(v.err) {
				return nil, v.err
			}
			firstErr = cmp(firstErr, v.err)
		case !isInt:
			firstErr = cmp(firstErr, fmt.Errorf("unexpected reply %v", v.v))
		case k.s == pttlScript && n >= 0, k.s != pttlScript && n == 1:
			ms = append(ms, n)
		default:
			no++
		}
	}
	n := len(q.members)
	switch {
	case len(ms) >= q.maj:
		if k.s != pttlScript {
			return int64(1), nil
		}
		slices.Sort(ms)
		return ms[len(ms)-q.maj], nil // a majority has at least this long
	case no > n-q.maj:
		if k.s != pttlScript {
			return int64(0), nil
		}
		return int64(-1), nil
	}
	what := "extend"
	if k.s == pttlScript {
		what = "pttl"
	}
	return nil, q.shortErr(what, len(ms), no, 0, n-len(ms)-no, firstErr)
}

// extends runs a renewal's extends: one pipeline per master, all at once,
// and combines each call's answers as combine does.
func (q *quorum) extends(ctx context.Context, calls []call) []*redis.Cmd {
	votes := q.all(q.fanOut(ctx, func(ctx context.Context, m *member) (any, error) {
		send := func() []*redis.Cmd {
			p := m.rdb.Pipeline()
			cmds := make([]*redis.Cmd, len(calls))
			for j, k := range calls {
				cmds[j] = p.EvalSha(ctx, k.s.sha, k.keys, k.args...)
			}
			_, _ = p.Exec(ctx)
			return cmds
		}
		cmds := send()
		if isNoScript(cmds[0].Err()) {
			if err := m.rdb.ScriptLoad(ctx, extendScript.src).Err(); err != nil {
				return nil, err
			}
			cmds = send()
		}
		return cmds, nil
	}, nil))
	out := make([]*redis.Cmd, len(calls))
	for j, k := range calls {
		vs := make([]vote, len(votes))
		for i, v := range votes {
			vs[i].i = i
			if cmds, ok := v.v.([]*redis.Cmd); ok && v.err == nil {
				vs[i].v, vs[i].err = cmds[j].Result()
			} else {
				vs[i].err = cmp(v.err, errors.New("no reply"))
			}
		}
		out[j] = redis.NewCmd(ctx)
		if v, err := q.combine(k, vs); err != nil {
			out[j].SetErr(err)
		} else {
			out[j].SetVal(v)
		}
	}
	return out
}

// certify sets m's epoch key, if it has none, to when its data began, or
// a little later: now less its uptime, which may be up to a second more
// than the real one (quorum_epoch.lua, which reads both and writes the key
// in one step). Not through a Conn of m's client: go-redis races with
// itself when a Conn and its pool set up their first connections at once.
func (q *quorum) certify(ctx context.Context, m *member) error {
	m.certMu.Lock()
	defer m.certMu.Unlock()
	if m.certified.Load() {
		return nil
	}
	if _, err := quorumEpochScript.run(ctx, m.c.rdb, []string{q.epoch}); err != nil {
		return fmt.Errorf("setting the master's epoch: %w", err)
	}
	m.certified.Store(true)
	return nil
}

// join registers h's Lock as a quorum waiter: woken by a release published
// on any master. ready holds each master's subscription confirmation.
func (q *quorum) join(lk *lock, h *holding) (lc *local, w *waiter, ready []<-chan struct{}) {
	c := lk.c
	// seen 1: a give-back (dropAll, payload 0) wakes nobody; a release does.
	w = &waiter{h: h, box: make(chan mail, 1), look: make(chan struct{}, 1), seen: 1}
	for _, m := range q.members {
		ready = append(ready, m.c.hub.Want(lk.hash))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	lc = c.locals[lk.hash]
	if lc == nil {
		lc = &local{lk: lk}
		c.locals[lk.hash] = lc
	}
	lc.users++
	lc.line = append(lc.line, w)
	return lc, w, ready
}

func (q *quorum) leave(lc *local, w *waiter) {
	c := lc.lk.c
	c.mu.Lock()
	lc.line = remove(lc.line, w)
	lc.users--
	if lc.users == 0 && c.locals[lc.lk.hash] == lc {
		delete(c.locals, lc.lk.hash)
	}
	c.mu.Unlock()
	for _, m := range q.members {
		m.c.hub.Unwant(lc.lk.hash)
	}
}

// try is TryLock in quorum mode.
func (q *quorum) try(ctx context.Context, lk *lock) (l *Lease, err error) {
	h := lk.newHolding(ctx, 0)
	defer q.quitUnless(ctx, h, &l)
	r, _, err := q.acquire(ctx, h)
	switch {
	case err != nil:
		return nil, lk.fail(ctx, err)
	case !r.ok:
		return nil, nameErr(lk.name, ErrNotObtained)
	}
	return lk.obtained(ctx, h, r, nil)
}

// lock is Lock in quorum mode: attempts until one wins, woken by releases
// on any master, each wait bounded by the longest lease a master reported
// (or a short random one after a split vote).
func (q *quorum) lock(ctx context.Context, lk *lock) (l *Lease, err error) {
	c := lk.c
	h := lk.newHolding(ctx, 0)
	defer q.quitUnless(ctx, h, &l)
	r, split, err := q.acquire(ctx, h)
	switch {
	case err == nil && r.ok:
		return lk.obtained(ctx, h, r, nil)
	case ctx.Err() != nil || err != nil && permanent(err):
		return nil, lk.fail(ctx, err)
	}
	lc, w, ready := q.join(lk, h)
	defer q.leave(lc, w)
	bound := time.NewTimer(subscribeWait)
	for _, ch := range ready {
		select {
		case <-ch:
		case <-bound.C:
		case <-ctx.Done():
		}
	}
	bound.Stop()
	backoff := q.node
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		var sleep time.Duration
		switch {
		case err == nil && r.ok:
			return lk.obtained(ctx, h, r, nil)
		case ctx.Err() != nil || err != nil && permanent(err):
			return nil, lk.fail(ctx, cmp(ctx.Err(), err))
		case err != nil || split:
			// Masters down, restarting or split among contenders: try
			// again after a random wait, growing, so that contenders that
			// split the votes do not meet again.
			c.cfg.logger.Debug("dlock: quorum acquire failed, retrying", "lock", lk.name, "err", err)
			sleep = time.Duration(rand.Int64N(int64(backoff))) + time.Millisecond
			backoff = min(2*backoff, max(lk.ttl/4, q.node))
		default:
			sleep, backoff = r.left, q.node
		}
		timer.Reset(max(sleep, time.Millisecond))
		select {
		case <-w.look:
		case <-timer.C:
		case <-ctx.Done():
			return nil, lk.fail(ctx, ctx.Err())
		case <-c.bg.Done():
			return nil, nameErr(lk.name, ErrClosed)
		}
		r, split, err = q.acquire(ctx, h)
	}
}

// quitUnless quits h unless *l is the lease it obtained (deferred by try
// and lock).
func (q *quorum) quitUnless(ctx context.Context, h *holding, l **Lease) {
	if *l == nil {
		q.quit(ctx, h)
	}
}

// quorumProto is a mutex in quorum mode: requests go through the quorum
// (see Client.eval's callers), so only giveBack is its own.
type quorumProto struct{ mutexProto }

func (quorumProto) prepare(*holding, int64) {}

func (quorumProto) giveBack(ctx context.Context, lk *lock, token string) error {
	lk.c.q.dropAll(ctx, lk, token)
	return nil
}

// closeMembers closes the masters' Clients (at Close).
func (q *quorum) closeMembers() {
	for _, m := range q.members {
		_ = m.c.Close()
	}
}
