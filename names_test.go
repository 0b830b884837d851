package dlock_test

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/wire"
)

// awkwardNames have bytes that a key, waiter entry or channel could mistake
// for its own punctuation.
var awkwardNames = []string{"a,b", ",", "x{y}z", "{", "x}:q", "a:b:c", "sp ace", "new\nline", "\xff\xfe\x00"}

// exclusive describes a primitive for one lock name: how a holder takes it,
// how a waiter waits for it (an RWMutex's writer), how a newcomer tries it
// (an RWMutex's reader), which must fail while that waiter waits, and how
// one tries what the waiter waits for, which fails while the holder holds.
// Each is given the lock options of the call.
type exclusive struct {
	kind                     string
	hold, wait               opener
	jumpAheadOfWait, tryWait opener
}

// opener returns one call (a Lock, a TryAcquire...) of a primitive.
type opener func(c *dlock.Client, name string, opts ...dlock.LockOption) func(context.Context) (*dlock.Lease, error)

var exclusives = []exclusive{
	{kind: "mutex",
		hold: onMutex((*dlock.Mutex).Lock), wait: onMutex((*dlock.Mutex).Lock),
		jumpAheadOfWait: onMutex((*dlock.Mutex).TryLock), tryWait: onMutex((*dlock.Mutex).TryLock)},
	{kind: "fair",
		hold: onMutex((*dlock.Mutex).Lock, dlock.Fair()), wait: onMutex((*dlock.Mutex).Lock, dlock.Fair()),
		jumpAheadOfWait: onMutex((*dlock.Mutex).TryLock, dlock.Fair()), tryWait: onMutex((*dlock.Mutex).TryLock, dlock.Fair())},
	{kind: "rwmutex",
		hold: onRWMutex((*dlock.RWMutex).RLock), wait: onRWMutex((*dlock.RWMutex).Lock),
		jumpAheadOfWait: onRWMutex((*dlock.RWMutex).TryRLock), tryWait: onRWMutex((*dlock.RWMutex).TryLock)},
	{kind: "semaphore",
		hold: acquire1, wait: acquire1, jumpAheadOfWait: tryAcquire1, tryWait: tryAcquire1},
}

// onMutex is the opener of a Mutex method, with extra options.
func onMutex(f func(*dlock.Mutex, context.Context) (*dlock.Lease, error), extra ...dlock.LockOption) opener {
	return func(c *dlock.Client, n string, o ...dlock.LockOption) func(context.Context) (*dlock.Lease, error) {
		m := c.Mutex(n, slices.Concat(o, extra)...)
		return func(ctx context.Context) (*dlock.Lease, error) { return f(m, ctx) }
	}
}

// onRWMutex is the opener of an RWMutex method.
func onRWMutex(f func(*dlock.RWMutex, context.Context) (*dlock.Lease, error)) opener {
	return func(c *dlock.Client, n string, o ...dlock.LockOption) func(context.Context) (*dlock.Lease, error) {
		rw := c.RWMutex(n, o...)
		return func(ctx context.Context) (*dlock.Lease, error) { return f(rw, ctx) }
	}
}

// acquire1 acquires one permit of the semaphore n of size 1.
func acquire1(c *dlock.Client, n string, o ...dlock.LockOption) func(context.Context) (*dlock.Lease, error) {
	s := c.Semaphore(n, 1, o...)
	return func(ctx context.Context) (*dlock.Lease, error) { return s.Acquire(ctx, 1) }
}

// tryAcquire1 tries one permit of the semaphore n of size 1.
func tryAcquire1(c *dlock.Client, n string, o ...dlock.LockOption) func(context.Context) (*dlock.Lease, error) {
	s := c.Semaphore(n, 1, o...)
	return func(ctx context.Context) (*dlock.Lease, error) { return s.TryAcquire(ctx, 1) }
}

// TestAwkwardNames: every byte a name may contain survives every key,
// waiter entry and channel of every primitive: a waiter in line keeps its
// place (a newcomer does not get in ahead of it), is handed the lock by the
// release, and every key at Redis reads back as the name.
func TestAwkwardNames(t *testing.T) {
	s := redistest.Start(t)
	cs, rdb := newClients(t, s, 3)
	for _, p := range exclusives {
		if err := rdb.FlushAll(t.Context()).Err(); err != nil { // a name is one kind of lock
			t.Fatal(err)
		}
		for _, name := range awkwardNames {
			t.Run(p.kind+"/"+name, func(t *testing.T) {
				ctx := ctxT(t, 20*time.Second)
				a, err := p.hold(cs[0], name)(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if a.Name() != name {
					t.Fatalf("Lease.Name() = %q", a.Name())
				}
				wctx, cancel := context.WithCancel(ctx)
				got := make(chan *dlock.Lease, 1)
				werr := make(chan error, 1)
				go func() {
					b, err := p.wait(cs[1], name)(wctx)
					got <- b
					werr <- err
				}()
				defer func() { cancel(); <-werr }()
				hash := wire.HashKey(wire.DefaultPrefix, name)
				waitLine(t, ctx, rdb, hash, 1)
				if l, err := p.jumpAheadOfWait(cs[2], name)(ctx); !errors.Is(err, dlock.ErrNotObtained) {
					t.Fatalf("a newcomer got %v, %v while a waiter was in line", l, err)
				}
				if n := rdb.LLen(ctx, hash+wire.SuffixLine).Val(); n != 1 {
					t.Fatalf("the waiter lost its place in line (%d in line)", n)
				}
				keys, err := rdb.Keys(ctx, "*").Result()
				if err != nil {
					t.Fatal(err)
				}
				found := false
				for _, k := range keys {
					n, _, ok := wire.ParseKey(wire.DefaultPrefix, k)
					if ok && n == name {
						found = true
					}
				}
				if !found {
					t.Fatalf("no key at Redis reads back as %q: %q", name, keys)
				}
				if err := a.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
				b := <-got
				if b == nil {
					t.Fatal(<-werr)
				}
				if b.Fence() <= a.Fence() {
					t.Fatalf("fence %d after %d", b.Fence(), a.Fence())
				}
				if p.kind == "mutex" || p.kind == "fair" {
					// Handed over by the release (which read the waiter's
					// entry), not found free by a look of the waiter's.
					if from := rdb.HGet(ctx, hash, wire.FieldHandedFrom).Val(); from != strconv.FormatUint(a.Fence(), 10) {
						t.Fatalf("the waiter was not handed the lock by the release (handed over from fence %q, want %d)", from, a.Fence())
					}
				}
				if err := b.Unlock(ctx); err != nil {
					t.Fatal(err)
				}
				if n := rdb.LLen(ctx, hash+wire.SuffixLine).Val(); n != 0 {
					t.Fatalf("%d left in line", n)
				}
			})
		}
	}
}

// TestNameBeginningWithBrace: PREFIX{}x} would hash the whole key, so the
// keys of one lock would not share a Cluster slot; such names are refused.
func TestNameBeginningWithBrace(t *testing.T) {
	s := redistest.Start(t)
	c, _ := newClient(t, s)
	ctx := ctxT(t, 5*time.Second)
	for _, p := range exclusives {
		if _, err := p.hold(c, "}x")(ctx); !errors.Is(err, dlock.ErrInvalidArgument) {
			t.Errorf("%s: name \"}x\": %v, want ErrInvalidArgument", p.kind, err)
		}
	}
}

// TestPrefixWithEmptyHashTag: a prefix whose first '{' is followed at once
// by '}' gives every key an empty hash tag, so the keys of one lock would
// not share a Cluster slot; such prefixes are refused, others (a '{' left
// open, a non-empty tag) work.
func TestPrefixWithEmptyHashTag(t *testing.T) {
	s := redistest.Start(t)
	ctx := ctxT(t, 5*time.Second)
	for prefix, ok := range map[string]bool{"x{}": false, "{}": false, "a{}{b}": false, "a{": true, "a{b}:": true, "}{": true} {
		c := newDlock(t, s.Client(t), dlock.WithPrefix(prefix))
		for _, p := range exclusives {
			l, err := p.hold(c, p.kind)(ctx)
			switch {
			case ok && err != nil:
				t.Errorf("prefix %q, %s: %v", prefix, p.kind, err)
			case !ok && !errors.Is(err, dlock.ErrInvalidArgument):
				t.Errorf("prefix %q, %s: %v, want ErrInvalidArgument", prefix, p.kind, err)
			}
			if l != nil {
				_ = l.Unlock(ctx)
			}
		}
		_ = c.Close()
	}
}
