package dlock_test

// The checks of TestInterleavings (interleave_test.go): what a run records
// of each lease, and what must hold of the leases believed valid at once,
// of Redis, and of every call's result.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faults"
	"github.com/dlock-go/dlock/internal/wire"
	"github.com/redis/go-redis/v9"
)

// failf records a violation (under w.mu).
func (w *interleaving) failf(format string, args ...any) {
	if len(w.fails) < 20 {
		w.fails = append(w.fails, fmt.Sprintf("%8.3fs ", w.now().Seconds())+fmt.Sprintf(format, args...))
	}
}

// valid reports whether o is believed valid now. Called under w.mu.
func (o *ilLease) valid() bool { return !o.gaveUp && o.l.Context().Err() == nil }

// granted records a new grant and checks it against everything held.
func (w *interleaving) granted(me *ilLease) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.grants++
	me.at = w.now()
	if w.exclusive() {
		w.inOrder(me)
	}
	if me.valid() {
		switch w.kind {
		case "mutex", "fair", "election", "multi", "string":
			// (Per name: a MultiLock's lease has a fence for each.)
			for i, name := range me.names {
				if f := me.fences[i]; f <= w.top[name] {
					w.failf("fence %d of %q granted %v after a lease with fence %d was seen valid", f, name, me, w.top[name])
				}
				w.top[name] = max(w.top[name], me.fences[i])
			}
		case "rw":
			if me.writer && me.fence <= w.maxAll || !me.writer && me.fence <= w.maxFence {
				w.failf("fence %d granted %v after fences %d (writers) / %d (all) were seen valid", me.fence, me, w.maxFence, w.maxAll)
			}
			if me.writer {
				w.maxFence = max(w.maxFence, me.fence)
			}
			w.maxAll = max(w.maxAll, me.fence)
		}
	}
	if w.kind == "sem" {
		if w.fences[me.fence] {
			w.failf("fence %d granted twice (%v)", me.fence, me)
		}
		w.fences[me.fence] = true
	}
	w.held[me] = struct{}{}
	w.checkLocked("grant of " + me.String())
}

// inOrder checks that me's fence is above those of every grant recorded
// before me's call was made, whether or not either lease is still valid:
// that grant's call returned before me's began, so it was granted first.
// (A mutex counter only grows; in quorum mode every grant has raised its
// fence on a majority before its call returned, and every later majority
// meets one of them.) Called under w.mu.
// Each name of a MultiLock's lease is checked against the grants of that
// name.
func (w *interleaving) inOrder(me *ilLease) {
	for j, name := range me.names {
		order, fence := w.order[name], me.fences[j]
		i := sort.Search(len(order), func(i int) bool { return order[i].at >= me.called })
		if i > 0 && fence <= order[i-1].max {
			w.failf("fence %d of %q granted %v by a call made at %.3fs, after a grant of fence %d had returned", fence, name, me, me.called.Seconds(), order[i-1].max)
		}
		top := fence
		if n := len(order); n > 0 {
			top = max(top, order[n-1].max)
		}
		w.order[name] = append(order, ilGrant{at: me.at, max: top})
	}
}

// check checks that the leases believed valid now may all be.
func (w *interleaving) check(why string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.checkLocked(why)
}

func (w *interleaving) checkLocked(why string) {
	w.checks++
	var valid []*ilLease
	var permits int64
	writer := false
	for o := range w.held {
		if o.valid() {
			valid = append(valid, o)
			permits += o.permits
			writer = writer || o.writer
		}
	}
	bad := false
	switch w.kind {
	case "mutex", "fair", "election", "multi", "string":
		// One holder of each name at a time.
		per := map[string]int{}
		for _, o := range valid {
			for _, n := range o.names {
				per[n]++
				bad = bad || per[n] > 1
			}
		}
	case "rw":
		bad = writer && len(valid) > 1
	case "sem":
		bad = permits > w.size
	}
	if bad {
		w.failf("at %s: %d leases believed valid at once (%d permits): %v", why, len(valid), permits, valid)
	}
}

// giveUp marks me given up by its holder: from now on it is not believed valid.
func (w *interleaving) giveUp(me *ilLease) {
	w.mu.Lock()
	me.gaveUp = true
	delete(w.held, me)
	w.mu.Unlock()
}

// checkFree checks that, one TTL after every caller returned, nothing holds
// the lock at Redis any more (on any master of a quorum; on a Cluster, on
// the master that serves its slot now, and no key of it is left on the
// others): no name of the run's pool.
func (w *interleaving) checkFree(returned time.Time) {
	t := w.t
	deadline := returned.Add(w.maxTTL + 500*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if w.topo == ilCluster {
		w.checkNoStrayKeys(ctx)
	}
	for _, name := range w.pool {
		for i, plain := range w.readers() {
			for {
				held, what := w.heldAtRedis(ctx, plain, name)
				if !held {
					break
				}
				if time.Now().After(deadline) {
					w.mu.Lock()
					w.failf("%v after every caller returned, the lock %q is still held at Redis%s: %s", time.Since(returned).Round(time.Millisecond), name, w.masterName(i), what)
					w.mu.Unlock()
					break
				}
				if ctx.Err() != nil {
					t.Fatal(ctx.Err())
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
}

// heldAtRedis reports whether the lock is held at Redis, and by what: a
// mutex by its owner; a semaphore or RWMutex by a holding whose lease has
// not run out (one that ran out may still be counted until the next call
// that needs permits prunes it, but it holds nothing). A semaphore's count
// of permits used must always be the sum of its holdings'. A string lock
// is held while its key is there.
func (w *interleaving) heldAtRedis(ctx context.Context, plain redis.Cmdable, name string) (bool, string) {
	t := w.t
	if w.kind == "string" {
		v, err := plain.Get(ctx, name).Result()
		if errors.Is(err, redis.Nil) {
			return false, ""
		}
		if err != nil {
			t.Fatal(err)
		}
		return true, fmt.Sprintf("the key holds %q", v)
	}
	keys := wire.KeysOf(wire.DefaultPrefix, name)
	h, err := plain.HGetAll(ctx, keys.Hash).Result()
	if err != nil {
		t.Fatal(err)
	}
	if o := h[wire.FieldOwner]; o != "" {
		return true, fmt.Sprintf("owner %q, hash %q", o, h)
	}
	var sum int64
	for f, v := range h {
		if strings.HasPrefix(f, wire.FieldHolding) {
			n, _, _ := strings.Cut(v, ",")
			p, _ := strconv.ParseInt(n, 10, 64)
			sum += p
		}
	}
	if u, _ := strconv.ParseInt(h[wire.FieldUsed], 10, 64); u != sum {
		w.mu.Lock()
		w.failf("%d permits counted used, %d held by holdings: hash %q", u, sum, h)
		w.mu.Unlock()
	}
	now, err := plain.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	live, err := plain.ZRangeByScoreWithScores(ctx, keys.Holders, &redis.ZRangeBy{
		Min: strconv.FormatInt(now.UnixMilli(), 10), Max: "+inf"}).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(live) > 0 {
		return true, fmt.Sprintf("holders with time left %v, hash %q", live, h)
	}
	return false, ""
}

// lateGrantOp counts, among a run's ops, the Try calls that reported a
// grant too late to be valid, given back.
const lateGrantOp = "late grant given back"

// lateGrants checks the outcome of a lock call (Lock, TryLock, ...) asking
// for ttl against the acquire replies of its token that the late rule (see
// injector) held back by ttl or more: a grant such a reply brought came
// too late to be valid, so the call gave it back (a Try call reports
// ErrNotObtained, saying why; a Lock tries again) and must not return it.
// A lease is dated from the send of the acquire that granted it: from a
// later acquire, sent after that reply, its deadline is after the reply;
// from that reply's, before it. Try calls' reports of a late grant given
// back are counted (Lock calls' by lateLog), so that a run shows it
// reached that path.
func (w *interleaving) lateGrants(ic *ilClient, ttl time.Duration, l *dlock.Lease, err error) {
	if err != nil {
		if errors.Is(err, dlock.ErrNotObtained) && strings.Contains(err.Error(), "past the lease's validity") {
			w.count(lateGrantOp)
		}
		return
	}
	acquire, tok := w.acquireScripts(), l.Token()
	for _, name := range l.Names() {
		// (A MultiLock's lease: each name from the acquires that named it.)
		deadline, key := dlock.Deadline(partOf(l, name)), w.hashOf(name)
		kept := ic.ins[0].Events(func(e faults.Event) bool {
			return e.Kind == faults.DelayReply && e.Delay >= ttl && slices.Contains(acquire, e.Call.Script) &&
				e.Call.Has(tok) && (!w.manyNames() || e.Call.Has(key)) && deadline.Before(w.epoch.Add(e.At+e.Delay))
		})
		if len(kept) > 0 {
			w.mu.Lock()
			w.failf("a lock call with TTL %v returned a lease (token %s) of %q valid until %.3fs, granted by an acquire whose reply was held back past that: %v",
				ttl, tok, name, deadline.Sub(w.epoch).Seconds(), kept)
			w.mu.Unlock()
		}
	}
}

// inLine reports whether c is an acquire that a waiter in the line makes
// (the looks that keep its place).
func inLine(c faults.Call) bool { return !outsideLine(c) }

// manyNames reports whether the run locks several names (kind multi).
func (w *interleaving) manyNames() bool { return len(w.pool) > 1 }

// hashOf is the key that names the lock name in its scripts' KEYS (the
// first of them): a string lock's own key, else its hash.
func (w *interleaving) hashOf(name string) string {
	if w.kind == "string" {
		return name
	}
	return wire.KeysOf(wire.DefaultPrefix, name).Hash
}

// partOf is the lease of name in l: a MultiLock's part, else l.
func partOf(l *dlock.Lease, name string) *dlock.Lease {
	if p := dlock.PartOf(l, name); p != nil {
		return p
	}
	return l
}

// pending reports whether some name of o is pending (see dlock.Pending).
func (o *ilLease) pending() bool {
	return slices.ContainsFunc(o.names, func(n string) bool { return dlock.Pending(partOf(o.l, n)) })
}

// describe is dlock.Describe of each name of o.
func (o *ilLease) describe() string {
	if !o.multi {
		return dlock.Describe(o.l)
	}
	var b strings.Builder
	for _, n := range o.names {
		fmt.Fprintf(&b, "[%q: %s] ", n, dlock.Describe(partOf(o.l, n)))
	}
	return b.String()
}

// outsideLine reports whether c is an acquire that takes no place in the
// line (a Try call's, or a Lock's first look): acquire.lua with KEYS[1]
// alone, fair_acquire.lua or sem.lua's "a" with join (ARGV[4], ARGV[5])
// "0", and every multi_acquire.lua and str_acquire.lua.
func outsideLine(c faults.Call) bool {
	switch c.Script {
	case "acquire":
		return len(c.Keys) == 1
	case "fair_acquire":
		return len(c.Args) > 3 && c.Args[3] == "0"
	case "sem." + wire.SemAcquire:
		return len(c.Args) > 4 && c.Args[4] == "0"
	case "multi_acquire", "str_acquire":
		return true // neither takes a place in a line (a string lock has none)
	}
	return false
}

// lateLog is the logger of a run's Clients: it counts the late grants
// their Lock calls gave back, which they report (at debug level, with
// ErrNotObtained) before they try again, and among them the waits that
// started over with a fresh token.
type lateLog struct{ n, over *atomic.Int64 }

func (h lateLog) Enabled(context.Context, slog.Level) bool { return true }

func (h lateLog) Handle(_ context.Context, r slog.Record) error {
	r.Attrs(func(a slog.Attr) bool {
		if err, ok := a.Value.Any().(error); ok && errors.Is(err, dlock.ErrNotObtained) {
			h.n.Add(1)
			if strings.Contains(r.Message, "waiting on with a new token") {
				h.over.Add(1)
			}
		}
		return true
	})
	return nil
}

func (h lateLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h lateLog) WithGroup(string) slog.Handler      { return h }

// returnedBy fails the run if a call whose ctx ended at end returned more
// than 3s after that: no call may hang past its ctx.
func (w *interleaving) returnedBy(op string, end time.Time) {
	if late := time.Since(end); late > 3*time.Second {
		w.mu.Lock()
		w.failf("%s returned %v after its ctx ended", op, late.Round(time.Millisecond))
		w.mu.Unlock()
	}
}

// checkRedis checks that every lease believed valid is held at Redis: its
// token owns the mutex (or, passed to it and not yet recorded, the passer's
// may), or holds permits whose lease has time left. A lease that is not
// pending stays so; Redis is read after that is known and before the
// leases' validity is asked, and validity only ever ends, so a lease
// granted before the read and valid after it was valid at the read.
//
// In quorum mode the lease must be held on a majority of the masters (no
// majority is left to grant it to anyone else), where a master that lost
// its data less than the restart delay before the read counts as holding
// it: it votes for nobody until then. Its copy on the others expires
// no earlier than its holder's deadline, which ends its validity. The
// lease fresh, just granted, must be held on a majority with a fence
// counter at least its fence, as NewQuorum promises of a grant by the
// time Lock returns (later, renewals may keep it on masters whose counter
// was not raised: those that answered its grant after the majority did).
func (w *interleaving) checkRedis(fresh *ilLease) {
	w.mu.Lock()
	var settled []*ilLease
	for o := range w.held {
		if !o.pending() {
			settled = append(settled, o)
		}
	}
	w.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	read := w.now()
	readAt := w.epoch.Add(read)
	readers := w.readers()
	views := make([]ilView, len(readers))
	for i, plain := range readers {
		views[i] = w.viewAt(ctx, plain)
	}
	// With replica acknowledgement every lease believed valid was
	// confirmed by the replica: it must be there too, also while the
	// chaos holds the replication stream back (read after the primary; a
	// stopped replica answers once it resumes).
	var rv ilView
	if w.topo == ilReplicaAck {
		rv = w.viewAt(ctx, w.replicaPlain)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for i := range views {
		if w.topo != ilQuorum {
			break
		}
		r := w.restarted[i]
		views[i].lost = r.lost()
		// One that restarted, read since, must not have voted.
		if views[i].lost && !r.up.IsZero() && readAt.After(r.up) && views[i].owner != "" {
			w.failf("master %d, restarted without its data %v before it was read (at %.3fs), granted the lock within the restart delay (%v): owner %q",
				i, readAt.Sub(r.killed).Round(time.Millisecond), read.Seconds(), w.delay, views[i].owner)
		}
	}
	for _, v := range views {
		if v.err != nil && !v.lost { // (one being restarted may not answer)
			w.t.Error(v.err)
			return
		}
	}
	if rv.err != nil {
		w.t.Error(rv.err)
		return
	}
	for _, o := range settled {
		if o.at >= read || !o.valid() {
			continue
		}
		tok := o.l.Token()
		if w.topo == ilQuorum {
			var fence uint64 // the counter the lease must find, if fresh
			what := "hold it"
			if o == fresh {
				fence, what = o.fence, "hold it with its fence"
			}
			if n := countHolding(views, tok, fence); n < ilMasters/2+1 {
				w.failf("%v is believed valid, but %d of %d masters (read from %.3fs) %s or lost their data within the restart delay: %v; the lease: %s; its Client's last faults: %s",
					o, n, ilMasters, read.Seconds(), what, views, dlock.Describe(o.l), o.ic.lastFaults(read-2*time.Second))
			}
			continue
		}
		if !views[0].holds(o) {
			w.failf("%v is believed valid, but Redis (read at %.3fs) names %v; the lease: %s; its Client's last faults: %s",
				o, read.Seconds(), views[0], o.describe(), o.ic.lastFaults(read-2*time.Second))
		}
		if w.topo == ilReplicaAck && !rv.holds(o) {
			w.failf("%v is believed valid, but the replica (read after %.3fs) names %v: a failover now would lose it; the lease: %s",
				o, read.Seconds(), rv, o.describe())
		}
	}
}

// ilView is what one server said about who holds the lock.
type ilView struct {
	owner   string             // a mutex's owner (a string lock's value)
	owners  map[string]string  // kind multi: each name's owner
	fence   uint64             // a mutex's fence counter
	holders map[string]float64 // a semaphore's or RWMutex's live holdings (nil for a mutex)
	lost    bool               // a quorum master that lost its data within the restart delay
	err     error
}

// has reports whether the view names tok as a holder.
func (v ilView) has(tok string) bool {
	if v.holders != nil {
		return v.holders[tok] != 0
	}
	return v.owner == tok
}

// holds reports whether the view names o's token as the holder of each of
// o's names.
func (v ilView) holds(o *ilLease) bool {
	if v.owners == nil {
		return v.has(o.l.Token())
	}
	return !slices.ContainsFunc(o.names, func(n string) bool { return v.owners[n] != o.l.Token() })
}

func (v ilView) String() string {
	var s string
	switch {
	case v.err != nil:
		s = v.err.Error()
	case v.owners != nil:
		s = fmt.Sprintf("owners %q", v.owners)
	case v.holders != nil:
		s = fmt.Sprintf("live holders %v", v.holders)
	default:
		s = fmt.Sprintf("owner %q fence %d", v.owner, v.fence)
	}
	if v.lost {
		s += " (lost its data within the restart delay)"
	}
	return s
}

// countHolding counts the quorum masters that hold tok's lease with a
// fence counter of at least fence, or lost their data within the restart
// delay.
func countHolding(views []ilView, tok string, fence uint64) int {
	n := 0
	for _, v := range views {
		if v.lost || v.err == nil && v.has(tok) && v.fence >= fence {
			n++
		}
	}
	return n
}

// lastFaults lists the faults injected into ic's calls since from, on each
// of its go-redis clients.
func (ic *ilClient) lastFaults(from time.Duration) string {
	var b strings.Builder
	for i, in := range ic.ins {
		if len(ic.ins) > 1 {
			fmt.Fprintf(&b, "\n  master %d: ", i)
		}
		fmt.Fprintf(&b, "%v", in.Events(func(e faults.Event) bool { return e.At > from }))
	}
	return b.String()
}

// viewAt reads who holds the lock on the server rdb talks to: a mutex's
// owner and fence counter, or a semaphore's holdings whose lease has time
// left.
func (w *interleaving) viewAt(ctx context.Context, rdb redis.Cmdable) (v ilView) {
	keys := wire.KeysOf(wire.DefaultPrefix, w.name)
	switch w.kind {
	case "multi":
		v.owners = map[string]string{}
		for _, name := range w.pool {
			var o string
			o, v.err = rdb.HGet(ctx, wire.KeysOf(wire.DefaultPrefix, name).Hash, wire.FieldOwner).Result()
			if errors.Is(v.err, redis.Nil) {
				v.err = nil
			}
			if v.err != nil {
				return v
			}
			v.owners[name] = o
		}
		return v
	case "string":
		v.owner, v.err = rdb.Get(ctx, w.name).Result()
		if errors.Is(v.err, redis.Nil) {
			v.err = nil
		}
		if v.err == nil {
			f, err := rdb.HGet(ctx, wire.StringFenceKey(w.name), "f").Result()
			if err != nil && !errors.Is(err, redis.Nil) {
				return ilView{err: err}
			}
			v.fence, _ = strconv.ParseUint(f, 10, 64)
		}
		return v
	}
	if w.exclusive() {
		var h []any
		h, v.err = rdb.HMGet(ctx, keys.Hash, wire.FieldOwner, wire.FieldFence).Result()
		if v.err == nil {
			v.owner, _ = h[0].(string)
			f, _ := h[1].(string)
			v.fence, _ = strconv.ParseUint(f, 10, 64)
		}
		return v
	}
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		return ilView{err: err}
	}
	zs, err := rdb.ZRangeByScoreWithScores(ctx, keys.Holders, &redis.ZRangeBy{
		Min: strconv.FormatInt(now.UnixMilli(), 10), Max: "+inf"}).Result()
	if err != nil {
		return ilView{err: err}
	}
	v.holders = map[string]float64{}
	for _, z := range zs {
		v.holders[z.Member.(string)] = z.Score
	}
	return v
}

// readers are the clients that read the lock at Redis: a plain client of
// each master (one, off quorum mode), or on a Cluster a plain
// ClusterClient, which finds each key on the master that serves it now.
func (w *interleaving) readers() []redis.Cmdable {
	if w.topo == ilCluster {
		return []redis.Cmdable{w.cplain}
	}
	out := make([]redis.Cmdable, len(w.plains))
	for i, p := range w.plains {
		out[i] = p
	}
	return out
}

// expected fails the run for an error no fault explains.
func (w *interleaving) expected(err error, op string) {
	var rerr redis.Error
	switch {
	case err == nil,
		errors.Is(err, dlock.ErrNotObtained),
		errors.Is(err, dlock.ErrLockLost),
		errors.Is(err, dlock.ErrClosed),
		w.topo == ilReplicaAck && errors.Is(err, dlock.ErrNotReplicated),
		errors.Is(err, context.Canceled),
		errors.Is(err, context.DeadlineExceeded):
		return
	case errors.As(err, &rerr) && !errors.Is(err, dlock.ErrInvalidArgument):
		return // a refusal the faults or a pause explain (LOADING, BUSY...)
	}
	var nerr net.Error
	if errors.As(err, &nerr) || errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, redis.ErrClosed) {
		return // a lost or cut connection
	}
	w.mu.Lock()
	w.failf("%s: unexpected error %v", op, err)
	w.mu.Unlock()
}

// exclusive reports whether the run's lock has one holder at a time.
func (w *interleaving) exclusive() bool {
	return w.kind == "mutex" || w.kind == "fair" || w.kind == "election" || w.kind == "multi" || w.kind == "string"
}
