package main

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/wire"
)

// unlock --force removes the holder and wakes a waiter, which runs with a
// larger fence; the old holder learns of it at its next renewal and exits 76.
func TestUnlockForce(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	rdb := s.Client(t)

	holder := startDlock(t, s.Addr(), "run", "--ttl", "2s", "stuck", "--", "sh", "-c", `echo "$DLOCK_TOKEN $DLOCK_FENCE"; exec sleep 30`)
	fields := strings.Fields(holder.line())
	if len(fields) != 2 {
		t.Fatalf("holder printed %q", fields)
	}
	token, fence := fields[0], fenceOf(t, fields[1])
	waiter := startDlock(t, s.Addr(), "run", "--wait", "20s", "stuck", "--", "sh", "-c", `echo "$DLOCK_FENCE"`)
	waitSubscribed(t, rdb, "dlock:{stuck}", 1)

	code, _, errOut := runDlock(t, s.Addr(), "unlock", "stuck")
	if code != exitUsage || !strings.Contains(errOut, "--force") {
		t.Errorf("unlock without --force: exit %d, stderr %q; want %d and a word about --force", code, errOut, exitUsage)
	}
	code, _, errOut = runDlock(t, s.Addr(), "unlock", "--force", "--token", "someone-else", "stuck")
	if code != exitFailed || !strings.Contains(errOut, token) || !strings.Contains(errOut, "nothing removed") {
		t.Errorf("unlock --token of another holder: exit %d, stderr %q", code, errOut)
	}
	if o := rdb.HGet(t.Context(), "dlock:{stuck}", "o").Val(); o != token {
		t.Fatalf("after a refused unlock the owner is %q, want %q", o, token)
	}

	code, out, errOut := runDlock(t, s.Addr(), "unlock", "--force", "--json", "--token", token, "stuck")
	if code != 0 {
		t.Fatalf("unlock --force: exit %d; stderr %q", code, errOut)
	}
	var res unlockResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("unlock --json does not parse: %v\n%s", err, out)
	}
	if !res.Removed || res.Token != token || res.Fence != fence || res.Name != "stuck" {
		t.Errorf("unlock --json: %+v; want removed token %s fence %d", res, token, fence)
	}

	// Woken by the published release, the waiter runs with a larger fence.
	afterForceUnlock(t, holder, waiter, fence)

	code, _, errOut = runDlock(t, s.Addr(), "unlock", "--force", "stuck")
	if code != exitFailed || !strings.Contains(errOut, "not held") {
		t.Errorf("unlock of a free lock: exit %d, stderr %q", code, errOut)
	}
	if f := rdb.HGet(t.Context(), "dlock:{stuck}", "f").Val(); f == "" {
		t.Errorf("the fence counter is gone after unlock --force")
	}

	// Text output names the token; a foreign key is left alone.
	h2 := startDlock(t, s.Addr(), "run", "stuck", "--", "sh", "-c", `echo "$DLOCK_TOKEN"; exec sleep 30`)
	token2 := h2.line()
	code, out, errOut = runDlock(t, s.Addr(), "unlock", "stuck", "--force")
	if code != 0 || !strings.Contains(out, token2) {
		t.Errorf("unlock --force (text): exit %d, stdout %q, stderr %q; want the token %s", code, out, errOut, token2)
	}
	rdb.Set(t.Context(), "dlock:{plain}", "x", 0)
	code, _, errOut = runDlock(t, s.Addr(), "unlock", "--force", "plain")
	if code != exitFailed || !strings.Contains(errOut, "not a dlock mutex") {
		t.Errorf("unlock of a foreign key: exit %d, stderr %q", code, errOut)
	}
	if v := rdb.Get(t.Context(), "dlock:{plain}").Val(); v != "x" {
		t.Errorf("foreign key changed to %q", v)
	}
}

// TestUnlockForceReportsLossToHolder: the removed holder's own Unlock says
// the lease was lost (it must not mistake the removal for its own release).
func TestUnlockForceReportsLossToHolder(t *testing.T) {
	s := redistest.Start(t)
	c := dlock.New(s.Client(t))
	defer c.Close()
	ctx := t.Context()
	l, err := c.Mutex("forced", dlock.NoRenew()).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := runDlock(t, s.Addr(), "unlock", "--force", "forced"); code != 0 {
		t.Fatalf("unlock --force: exit %d, stderr %q", code, errOut)
	}
	if err := l.Unlock(ctx); !errors.Is(err, dlock.ErrLockLost) {
		t.Fatalf("removed holder's Unlock: %v, want ErrLockLost", err)
	}
}

// unlock --force checks the whole hash before it writes: a hash whose
// fence is not a number is not a dlock mutex, and is left exactly as it
// was (a script that fails after a write keeps that write).
func TestUnlockForceLeavesForeignHashAlone(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	rdb := s.Client(t)
	for _, f := range []string{"not-a-number", "1.5", "-3", ""} {
		rdb.Del(t.Context(), "dlock:{odd}")
		rdb.HSet(t.Context(), "dlock:{odd}", "o", "someone", "f", f)
		code, _, errOut := runDlock(t, s.Addr(), "unlock", "--force", "odd")
		if code != exitFailed || !strings.Contains(errOut, "not a dlock mutex") {
			t.Errorf("fence %q: exit %d, stderr %q; want %d and not a dlock mutex", f, code, errOut, exitFailed)
		}
		got := rdb.HGetAll(t.Context(), "dlock:{odd}").Val()
		if len(got) != 2 || got["o"] != "someone" || got["f"] != f {
			t.Errorf("fence %q: the hash became %v", f, got)
		}
		if ttl := rdb.PTTL(t.Context(), "dlock:{odd}").Val(); ttl != -1 {
			t.Errorf("fence %q: the hash got an expiry (%v)", f, ttl)
		}
	}
}

// unlock --force on a server without sharded pub/sub (Redis before 7.0,
// miniredis) publishes the release with PUBLISH, as a Client there does: it
// removes the holder and reports it, a plain subscriber hears the removed
// holder's fence (a refused publish does not fail the script, so only the
// message tells that the right command was used), and the waiter takes the
// lock.
func TestUnlockForceWithoutShardedPubSub(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t, redistest.Options{NoShardedPubSub: true})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	wake := s.Client(t).Subscribe(ctx, wire.HashKey(wire.DefaultPrefix, "plain"))
	defer wake.Close()
	if _, err := wake.Receive(ctx); err != nil { // the confirmation
		t.Fatal(err)
	}
	holder := startDlock(t, s.Addr(), "run", "--ttl", "30s", "plain", "--", "sh", "-c", `echo "$DLOCK_FENCE"; exec sleep 30`)
	fence := fenceOf(t, holder.line())
	waiter := startDlock(t, s.Addr(), "run", "--wait", "20s", "plain", "--", "sh", "-c", `echo "$DLOCK_FENCE"`)
	code, out, errOut := runDlock(t, s.Addr(), "unlock", "--force", "plain")
	if code != 0 || !strings.Contains(out, "removed the holder") {
		t.Fatalf("unlock --force: exit %d, stdout %q, stderr %q; want the holder removed", code, out, errOut)
	}
	if msg, err := wake.ReceiveMessage(ctx); err != nil || msg.Payload != strconv.FormatUint(fence, 10) {
		t.Errorf("the first release heard by a plain subscriber: %v, %v; want the removed holder's fence %d", msg, err, fence)
	}
	afterForceUnlock(t, holder, waiter, fence)
}

// afterForceUnlock checks what follows an unlock --force of holder's lock
// (fence) while waiter waits: the waiter runs with a larger fence and
// exits 0, and the removed holder exits as one whose lease was lost.
func afterForceUnlock(t *testing.T, holder, waiter *dlockProc, fence uint64) {
	t.Helper()
	if f2 := fenceOf(t, waiter.line()); f2 <= fence {
		t.Errorf("waiter's fence %d is not above the removed holder's %d", f2, fence)
	}
	if code := waiter.exit(); code != 0 {
		t.Errorf("waiter: exit %d; stderr %q", code, waiter.stderr)
	}
	if code := holder.exit(); code != exitLeaseLost {
		t.Errorf("removed holder: exit %d, want %d; stderr %q", code, exitLeaseLost, holder.stderr)
	}
}
