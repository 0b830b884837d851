package dlock_test

import (
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/wire"
)

// A script's publish is a wake-up, not part of the release: a server that
// refuses it (here an ACL that denies the user both publish commands, as a
// Redis 7 user made without channel permissions is denied them; likewise a
// server that lost SPUBLISH after the Client asked) must not turn a release
// that has already freed the lock, or handed it over, into an error. Redis
// keeps a script's writes when it fails halfway, so the caller was told
// "release failed" about a lock that was released. Waiters then learn of
// the release at their next look instead of by message.
//
// The Clients ask the server about SPUBLISH before the ACL changes: one
// that is refused the question fails every lock call instead (see
// TestACLMissingPiece), so a release refused its publish is one whose ACL
// changed, or whose server lost the command, after that.
func TestPublishRefusedReleaseStillSucceeds(t *testing.T) {
	s := redistest.Start(t)
	ctx := ctxT(t, time.Minute)
	c1, rdb := newClient(t, s)
	c2, _ := newClient(t, s)
	for _, c := range []*dlock.Client{c1, c2} {
		l, err := c.Mutex("refused-first").TryLock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	s.Do(t, "ACL", "SETUSER", "default", "-spublish", "-publish")
	for _, p := range exclusives {
		name := "refused-" + p.kind
		// Freed with nobody in line: the release publishes the fence.
		l, err := p.hold(c1, name)(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Unlock(ctx); err != nil {
			t.Errorf("%s: Unlock with nobody waiting: %v", p.kind, err)
		}
		// Handed over to a waiter in line: the release publishes on its
		// channel.
		held, err := p.hold(c1, name)(ctx)
		if err != nil {
			t.Fatal(err)
		}
		waiting := async(t, ctx, p.wait(c2, name))
		waitLine(t, ctx, rdb, wire.HashKey(wire.DefaultPrefix, name), 1)
		if err := held.Unlock(ctx); err != nil {
			t.Errorf("%s: Unlock handing over to a waiter: %v", p.kind, err)
		}
		next, err := waiting()
		if err != nil {
			t.Fatalf("%s: the waiter: %v", p.kind, err)
		}
		if err := next.Unlock(ctx); err != nil {
			t.Errorf("%s: the waiter's Unlock: %v", p.kind, err)
		}
	}
	// unlock --force's script: the holder is removed, and it says so.
	l, err := exclusives[0].hold(c1, "refused-force")(ctx)
	if err != nil {
		t.Fatal(err)
	}
	key := wire.HashKey(wire.DefaultPrefix, "refused-force")
	v, err := rdb.Eval(ctx, wire.ForceUnlock.Src, []string{key}, 1000, key, "", wire.PublishSharded).Slice()
	if err != nil || len(v) != 3 || v[0] != int64(1) {
		t.Fatalf("force_unlock with the publish refused: %v, %v; want {1, token, fence}", v, err)
	}
	_ = l.Unlock(ctx)
}
