package dlock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// multiBasics locks names (given out of order) as one MultiLock on a and
// checks the lease at Redis and against b: one token on every name, a
// fence per name, exclusion of overlapping MultiLocks and Mutexes, TTL,
// Extend, Unlock (twice) that frees every name, and a waiter on b that is
// notified of the release.
func multiBasics(t *testing.T, ctx context.Context, a, b *dlock.Client, rdb redis.Cmdable, names []string) {
	t.Helper()
	ml := a.MultiLock(names, dlock.TTL(5*time.Second))
	l, err := ml.Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := l.Names(); len(got) != len(names) || !sameSet(got, names) {
		t.Fatalf("Names = %v, want %v in some order", got, names)
	}
	if l.Fence() != 0 || len(l.Token()) != 22 {
		t.Fatalf("Fence = %d (want 0: one per name), Token %q", l.Fence(), l.Token())
	}
	for _, n := range names {
		if o := owner(ctx, rdb, n); o != l.Token() {
			t.Fatalf("owner of %s = %q, want the lease's token %q", n, o, l.Token())
		}
		f, _ := rdb.HGet(ctx, "dlock:{"+n+"}", "f").Uint64()
		if f == 0 || l.FenceOf(n) != f {
			t.Fatalf("FenceOf(%s) = %d, Redis has %d", n, l.FenceOf(n), f)
		}
	}
	if l.FenceOf("not-held") != 0 {
		t.Fatal("FenceOf a name the lease does not hold is not 0")
	}
	other := append([]string{"unrelated-" + t.Name()}, names[len(names)-1])
	if _, err := b.MultiLock(other).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) || !strings.Contains(err.Error(), strconv.Quote(names[len(names)-1])) {
		t.Fatalf("overlapping TryLock: %v, want ErrNotObtained naming %q", err, names[len(names)-1])
	}
	if o := owner(ctx, rdb, other[0]); o != "" {
		t.Fatalf("a refused TryLock left %s owned by %q", other[0], o)
	}
	if _, err := b.Mutex(names[0]).TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("Mutex TryLock of a part: %v, want ErrNotObtained", err)
	}
	if d, err := l.TTL(ctx); err != nil || d <= 4*time.Second || d > 5*time.Second {
		t.Fatalf("TTL = %v, %v; want about 5s", d, err)
	}
	if err := l.Extend(ctx, 8*time.Second); err != nil {
		t.Fatal(err)
	}
	if d, err := l.TTL(ctx); err != nil || d <= 7*time.Second {
		t.Fatalf("TTL after Extend(8s) = %v, %v", d, err)
	}
	waiter := async(t, ctx, b.MultiLock(other).Lock)
	waitFor(t, ctx, "the waiter to wait in line", func() bool {
		return rdb.LLen(ctx, "dlock:{"+names[len(names)-1]+"}:q").Val() > 0 || rdb.HGet(ctx, "dlock:{"+names[len(names)-1]+"}", "w").Val() == "1"
	})
	start := time.Now()
	if err := l.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Unlock(ctx); err != nil {
		t.Fatalf("second Unlock: %v", err)
	}
	if l.Context().Err() == nil {
		t.Fatal("lease context live after Unlock")
	}
	w, err := waiter()
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Fatalf("waiter got the names %v after the release: not notified (TTL 5s)", d)
	}
	if err := w.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	for _, n := range append(names, other...) {
		if o := owner(ctx, rdb, n); o != "" {
			t.Fatalf("%s still owned by %q after every Unlock", n, o)
		}
	}
}

func sameSet(a, b []string) bool {
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

func TestMultiLockBasics(t *testing.T) {
	s := redistest.Start(t)
	cs, rdb := newClients(t, s, 2)
	ctx := ctxT(t, 20*time.Second)
	multiBasics(t, ctx, cs[0], cs[1], rdb, []string{"multi/c", "multi/a", "multi/b"})
	// One name is a MultiLock too.
	multiBasics(t, ctx, cs[0], cs[1], rdb, []string{"multi/one"})
}

func TestClusterMultiLockBasics(t *testing.T) {
	nodes := redistest.Cluster(t, 3)
	rdb := redistest.ClusterClient(t, nodes)
	ctx := ctxT(t, 30*time.Second)
	var cs []*dlock.Client
	for range 2 {
		c := newDlock(t, rdb)
		t.Cleanup(func() { _ = c.Close() })
		cs = append(cs, c)
	}
	// Names on every master, and two that share a slot (one hash tag).
	names := append(namesOnEveryNode(t, ctx, rdb, 3, "cm-"), "{tag}x", "{tag}y")
	multiBasics(t, ctx, cs[0], cs[1], rdb, names)
}

func TestMultiLockErrors(t *testing.T) {
	s := redistest.Start(t)
	c, _ := newClient(t, s)
	ctx := ctxT(t, 10*time.Second)
	for _, tc := range []struct {
		names []string
		want  string
	}{
		{nil, "no names"},
		{[]string{"a", "b", "a"}, `"a": invalid argument: given twice`},
		{[]string{"a", "", "b"}, "lock name is empty"},
		{[]string{"a", "}b"}, `begins with '}'`},
	} {
		ml := c.MultiLock(tc.names)
		for what, call := range map[string]func(context.Context) (*dlock.Lease, error){"Lock": ml.Lock, "TryLock": ml.TryLock} {
			if _, err := call(ctx); !errors.Is(err, dlock.ErrInvalidArgument) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s of %q: %v, want ErrInvalidArgument saying %q", what, tc.names, err, tc.want)
			}
		}
	}
	if _, err := c.MultiLock([]string{"a"}, dlock.TTL(0)).Lock(ctx); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Errorf("TTL 0: %v", err)
	}
	// Under a lease of one of its names it would wait for itself.
	held, err := c.Mutex("b").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.MultiLock([]string{"a", "b"}).Lock(held.Context()); !errors.Is(err, dlock.ErrInvalidArgument) || !strings.Contains(err.Error(), `"b"`) {
		t.Errorf("Lock under a lease of b: %v", err)
	}
	ml, err := c.MultiLock([]string{"x", "y"}).Lock(held.Context()) // other names: fine
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.MultiLock([]string{"y", "z"}).TryLock(ml.Context()); !errors.Is(err, dlock.ErrInvalidArgument) {
		t.Errorf("TryLock under a MultiLock lease of y: %v", err)
	}
	// A Mutex under a MultiLock's lease context does not re-enter its part.
	if _, err := c.Mutex("x").TryLock(ml.Context()); !errors.Is(err, dlock.ErrNotObtained) {
		t.Errorf("Mutex TryLock of a part under the MultiLock's lease context: %v, want ErrNotObtained", err)
	}
	_ = ml.Unlock(ctx)
	_ = held.Unlock(ctx)
	// A ctx that ended.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := c.MultiLock([]string{"a"}).Lock(cctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Lock with an ended ctx: %v", err)
	}
	// Quorum mode.
	_, rdbs := quorumMasters(t, 3)
	if _, err := newQuorum(t, rdbs).MultiLock([]string{"a"}).Lock(ctx); !errors.Is(err, dlock.ErrInvalidArgument) || !strings.Contains(err.Error(), "quorum") {
		t.Errorf("quorum mode: %v", err)
	}
	// Closed.
	_ = c.Close()
	if _, err := c.MultiLock([]string{"a"}).Lock(ctx); !errors.Is(err, dlock.ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
}

// multiUndone holds the last of names in lock order with b, and checks
// that a's TryLock, and a Lock whose ctx ends while it waits, fail naming
// it and leave no other name owned: what they took of earlier names (in
// earlier slots, on a Cluster) is given back.
func multiUndone(t *testing.T, ctx context.Context, a, b *dlock.Client, rdb redis.Cmdable, names []string) {
	t.Helper()
	ml := a.MultiLock(names)
	order := ml.Names()
	last := order[len(order)-1]
	held, err := b.Mutex(last).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	free := func(what string) {
		t.Helper()
		for _, n := range order[:len(order)-1] {
			if o := owner(ctx, rdb, n); o != "" {
				t.Fatalf("%s: %s left owned by %q", what, n, o)
			}
		}
	}
	if _, err := ml.TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) || !strings.Contains(err.Error(), strconv.Quote(last)) {
		t.Fatalf("TryLock with %s held: %v, want ErrNotObtained naming it", last, err)
	}
	free("TryLock")
	wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = ml.Lock(wctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), strconv.Quote(last)) {
		t.Fatalf("Lock whose ctx ended waiting for %s: %v", last, err)
	}
	free("Lock")
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	// The Lock that gave up left its place in last's line in the
	// background: the release may hand last to that place, which its
	// Client then gives back, or a TryLock may meet the place still live.
	// Either way last is free again soon, not after a TTL.
	var l *dlock.Lease
	waitWithin(t, ctx, 3*time.Second, "a TryLock of every name once "+last+" is free", func() bool {
		l, err = ml.TryLock(ctx)
		return err == nil
	})
	_ = l.Unlock(ctx)
}

func TestMultiLockPartialUndone(t *testing.T) {
	s := redistest.Start(t)
	cs, rdb := newClients(t, s, 2)
	multiUndone(t, ctxT(t, 20*time.Second), cs[0], cs[1], rdb, []string{"undo/a", "undo/b", "undo/c"})
}

func TestClusterMultiLockPartialUndone(t *testing.T) {
	nodes := redistest.Cluster(t, 3)
	rdb := redistest.ClusterClient(t, nodes)
	ctx := ctxT(t, 30*time.Second)
	a, b := newDlock(t, rdb), newDlock(t, rdb)
	t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
	multiUndone(t, ctx, a, b, rdb, append(namesOnEveryNode(t, ctx, rdb, 3, "cu-"), "{cu}1", "{cu}2"))
}

// TestMultiLockLostPart: a part whose key is overwritten is found lost by
// the watchdog: the lease context ends with ErrLockLost naming that name,
// and Unlock reports the loss after still releasing the other names.
func TestMultiLockLostPart(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	l, err := c.MultiLock([]string{"lost/a", "lost/b", "lost/c"}, dlock.TTL(600*time.Millisecond)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	lctx := l.Context()
	if err := rdb.HSet(ctx, "dlock:{lost/b}", "o", "someone-else").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lctx.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("lease context still live 2s after a part was taken away (TTL 600ms)")
	}
	if cause := context.Cause(lctx); !errors.Is(cause, dlock.ErrLockLost) || !strings.Contains(cause.Error(), `"lost/b"`) {
		t.Fatalf("cause %v, want ErrLockLost naming lost/b", cause)
	}
	if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Unlock: %v, want ErrLockLost", err)
	}
	for _, n := range []string{"lost/a", "lost/c"} {
		if o := owner(ctx, rdb, n); o != "" {
			t.Fatalf("%s still owned by %q after Unlock", n, o)
		}
	}
	if o := owner(ctx, rdb, "lost/b"); o != "someone-else" {
		t.Fatalf("Unlock changed the part it had lost: owner %q", o)
	}
	if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("Unlock again: %v, want ErrLockLost again", err)
	}
}

// TestMultiLockKeepsTheLine: a free name with a live waiter in its line is
// that waiter's: a MultiLock refuses to take it (and so the whole group),
// while a place that lapsed does not count.
func TestMultiLockKeepsTheLine(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 10*time.Second)
	ml := c.MultiLock([]string{"line/a", "line/b"}, dlock.Fair())
	l, err := ml.Lock(ctx) // the keys exist, with fences
	if err != nil {
		t.Fatal(err)
	}
	_ = l.Unlock(ctx)
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	place := func(deadline time.Time) {
		t.Helper()
		entry := strconv.FormatInt(deadline.UnixMilli(), 10) + ",10000,dlock:{line/b}:c:someone"
		if err := rdb.HSet(ctx, "dlock:{line/b}:w", "waiter-token", entry).Err(); err != nil {
			t.Fatal(err)
		}
		if rdb.LLen(ctx, "dlock:{line/b}:q").Val() == 0 {
			rdb.RPush(ctx, "dlock:{line/b}:q", "waiter-token")
		}
	}
	place(now.Add(time.Minute))
	if _, err := ml.TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) || !strings.Contains(err.Error(), `"line/b"`) {
		t.Fatalf("TryLock past a live waiter of line/b: %v, want ErrNotObtained naming it", err)
	}
	if o := owner(ctx, rdb, "line/a"); o != "" {
		t.Fatalf("line/a taken by %q though line/b was refused", o)
	}
	place(now.Add(-time.Second)) // the place lapsed
	l, err = ml.TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock past a lapsed place: %v", err)
	}
	_ = l.Unlock(ctx)
}

// TestMultiLockContextAfterPartEnded: a lease whose Context is asked for
// only after a part has ended (renewal found its key gone) reports itself
// ended at once, not once that part's end has reached it.
func TestMultiLockContextAfterPartEnded(t *testing.T) {
	s := redistest.Start(t)
	c, rdb := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	for i := range 20 {
		names := []string{fmt.Sprintf("ended-a%d", i), fmt.Sprintf("ended-b%d", i)}
		l, err := c.MultiLock(names, dlock.TTL(300*time.Millisecond)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := rdb.Del(ctx, "dlock:{"+names[1]+"}").Err(); err != nil {
			t.Fatal(err)
		}
		part := dlock.PartOf(l, names[1])
		waitFor(t, ctx, "the renewal to find the part gone", func() bool { return part.Context().Err() != nil })
		if err := l.Context().Err(); err == nil {
			t.Fatalf("round %d: the lease's Context is not done though its part %s ended", i, names[1])
		}
		_ = l.Unlock(ctx)
	}
}
