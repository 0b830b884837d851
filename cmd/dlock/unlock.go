package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock/internal/driver/goredis"
	"github.com/dlock-go/dlock/internal/hub"
	"github.com/dlock-go/dlock/internal/wire"
	"github.com/redis/go-redis/v9"
)

func init() {
	register(command{
		name:    "unlock",
		summary: "remove a lock's holder (--force; for operators)",
		run:     runUnlock,
	})
}

// unlockScript runs with EVALSHA, sending the source only on NOSCRIPT.
var unlockScript = redis.NewScript(wire.ForceUnlock.Src)

// defaultIdle is the library's default WithIdleExpiry.
const defaultIdle = 10 * time.Minute

const unlockUsage = `Usage: dlock unlock --force NAME [flags]

Removes the holder of the mutex NAME, for operators: the lock becomes free at
once and waiting clients are woken, as if the holder had released it, except
that the lock is not handed straight to the first waiter of a --fair line
(Fair waiters find it free at their next look). A key that is not a dlock
mutex is left as it is. Prints the token and fence it removed.

This is dangerous, hence --force: the holder may still be running. It finds
out at its next renewal (within a third of its TTL; dlock run then stops
its COMMAND and exits 76), but until then two holders may act at once.
Storage that checks fences rejects the old holder's writes: the next holder
gets a larger fence, since the fence counter is kept (and moved on by one,
so that the removed holder's own Unlock reports the loss).

Use --token with the token dlock status shows, so that a holder that took
the lock after you looked is left alone.

Quorum mode (3 or more --redis masters): the holder is removed on every
master that answers, each reported on a line of its own (per_master in
--json). Once a majority has answered, the holder keeps the lock on too few
masters to renew it.

Examples:

  dlock status stuck-job                       # note the token
  dlock unlock --force --token TOKEN stuck-job
  dlock unlock --force --json stuck-job

Exit codes: 0 removed, 1 nothing removed (not held, or held by another
token than --token) or any other error, 64 usage error (also without
--force), 69 Redis unavailable (quorum mode: fewer than a majority of the
masters answered; the others were still acted on).

Flags:
`

// unlockResult is the --json output.
type unlockResult struct {
	Name    string `json:"name"`
	Key     string `json:"key"`
	Removed bool   `json:"removed"`
	// Token and Fence are the holder's: the one removed, or the one left in
	// place when --token did not match.
	Token string `json:"token,omitempty"`
	Fence uint64 `json:"fence,omitempty"`
}

// runUnlock is "dlock unlock".
func runUnlock(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, fl, usageErr := newInspect("dlock unlock", stderr)
	force := fs.Bool("force", false, "required: remove the holder even though it may still be running")
	token := fs.String("token", "", "remove the holder only if it is this `TOKEN` (from dlock status)")
	var idle time.Duration
	durationVar(fs, &idle, "idle", defaultIdle, time.Second, 0, "10m", "how long (a `duration`, at least 1s) the released key keeps the fence counter: the holders' WithIdleExpiry")
	pos, code, ok := parseInspect(fs, args, unlockUsage, stdout, usageErr)
	if !ok {
		return code
	}
	name, err := oneName(pos, "one lock NAME")
	switch {
	case err != nil:
		return usageErr(err)
	case !*force:
		return usageErr(errors.New("refusing without --force: the holder may still be running, and removing it lets another take the lock at once"))
	}
	targets, code := fl.targets(stderr, "dlock unlock")
	if targets == nil {
		return code
	}
	if len(targets) > 1 {
		return unlockQuorum(ctx, targets, fl, name, *token, idle, stdout, stderr)
	}
	rdb, code := connectOne(ctx, targets[0], stderr, "dlock unlock")
	if rdb == nil {
		return code
	}
	defer rdb.Close()

	uctx, cancel := context.WithTimeout(ctx, inspectTimeout)
	defer cancel()
	res, status, err := forceUnlock(uctx, rdb, *fl.prefix, name, *token, idle)
	if err != nil {
		if isForeignReply(err) {
			fmt.Fprintf(stderr, "dlock unlock: lock %q: %s; nothing removed (see dlock status %s)\n", name, whatKeyIs(ctx, rdb, *fl.prefix, name, fmt.Sprintf("Redis key %q is not a dlock mutex", res.Key)), textSafe(name))
			return exitFailed
		}
		return reportRedisErr(ctx, stderr, "dlock unlock", err)
	}
	code = exitOK
	switch status {
	case unlockRemoved:
		res.Removed = true
		if !*fl.json {
			fmt.Fprintf(stdout, "removed the holder of lock %q: token %s, fence %d; waiters notified\n", name, textSafe(res.Token), res.Fence)
		}
	case unlockOtherToken:
		code = exitFailed
		fmt.Fprintf(stderr, "dlock unlock: lock %q is held by token %s (fence %d), not by --token %s; nothing removed\n", name, textSafe(res.Token), res.Fence, textSafe(*token))
	default:
		code = exitFailed
		fmt.Fprintf(stderr, "dlock unlock: lock %q is not held; nothing removed\n", name)
	}
	if *fl.json {
		if c := writeJSON(stdout, stderr, "dlock unlock", res); c != exitOK {
			return c
		}
	}
	return code
}

// What force_unlock.lua did (its first reply element; 0: not held).
const (
	unlockRemoved    = 1
	unlockOtherToken = 2 // held by another token than --token; unchanged
)

// forceUnlock removes the holder of the mutex name on rdb (one server or
// deployment; a Cluster too) if it is token (any holder if token is ""),
// and returns what it did: unlockRemoved, unlockNotHeld or
// unlockOtherToken, and the holder it removed or left. res.Removed is not
// set.
func forceUnlock(ctx context.Context, rdb redis.UniversalClient, prefix, name, token string, idle time.Duration) (res unlockResult, status int64, err error) {
	key := wire.HashKey(prefix, name)
	res = unlockResult{Name: name, Key: key}
	// Waiters hear the release on the pub/sub the server has: the same
	// question a library Client asks once (sharded unless SPUBLISH is unknown).
	pub := wire.PublishSharded
	kind, err := hub.Detect(ctx, goredis.New(rdb, false), wire.ProbeChannel(prefix))
	if err != nil {
		return res, 0, err
	}
	if kind == hub.Plain {
		pub = wire.PublishPlain
	}
	reply, err := unlockScript.Run(ctx, rdb, []string{key},
		strconv.FormatInt(idle.Milliseconds(), 10), key, token, pub).Slice()
	if err != nil {
		return res, 0, err
	}
	status, _ = reply[0].(int64)
	if len(reply) == 3 {
		res.Token, _ = reply[1].(string)
		f, _ := reply[2].(string)
		res.Fence, _ = strconv.ParseUint(f, 10, 64)
	}
	return res, status, nil
}

// isForeignReply reports force_unlock.lua's refusal of a key that is not a
// dlock mutex.
func isForeignReply(err error) bool {
	msg := err.Error()
	return strings.HasPrefix(msg, "DLOCK_FOREIGN") || strings.HasPrefix(msg, "WRONGTYPE")
}
