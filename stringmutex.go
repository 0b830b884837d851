package dlock

import (
	"context"

	"github.com/dlock-go/dlock/internal/wire"
)

// StringMutex returns a Mutex kept in the format that redsync, redis-py's
// Lock, node-redlock and bsm/redislock use: the Redis key key, exactly as
// given (no prefix, no braces added), holding the owner's random value,
// taken with SET NX PX and released by compare-and-delete. A dlock process
// and a process of one of those libraries that lock the same key exclude
// each other, so a fleet can move to dlock one service at a time.
//
// The Mutex works as any other: Lock waits, TryLock tries once, the
// watchdog renews the lease, the lease context ends when the lease is lost
// (another library's process deleted or overwrote the key: at the next
// renewal, within TTL/3), Extend and TTL work, and Lock re-enters a lease
// of this Client (the other libraries know nothing of it: to them the key
// is simply held).
//
// Fences come from a hash beside the key (see docs/PROTOCOL.md, "String
// locks"), which only dlock increments: a fence orders dlock's holdings of
// the key, never another library's, so storage that checks fences rejects
// a stale dlock writer after a newer dlock holding, but not after a holder
// of another library.
//
// Waiting: a release by dlock publishes a wake-up, as for other locks; a
// release by another library (a DEL) or an expiry is heard through the
// server's keyspace notifications when notify-keyspace-events includes K
// and g (or A); without them a waiter looks again every 25-75 ms (a poll
// with jitter, of the first waiter of each Client only).
//
// Limits: Fair is refused (the other libraries know no line), and so is
// quorum mode (NewQuorum). A lock is always released at Redis: a holder
// never passes it straight to the next waiter of its own Client (as the
// default mode of Mutex does), since the other side must see every release.
//
// key must be non-empty and at most MaxNameLen bytes; a key with a '}' must
// have a hash tag (its fence counter is named into the key's Cluster slot);
// a key of dlock's own (the Client's prefix followed by '{') is refused.
// Invalid keys and options are reported by the Mutex's methods as
// ErrInvalidArgument; a key that holds something other than a string is
// reported as ErrForeignKey and never overwritten.
func (c *Client) StringMutex(key string, opts ...LockOption) *Mutex {
	m := &Mutex{}
	c.initString(&m.lk, key, opts)
	return m
}

// initString makes l the string lock at key (see initLock).
func (c *Client) initString(l *lock, key string, opts []LockOption) {
	cfg := lockOptions(opts)
	*l = lock{
		c: c, name: key, kind: wire.KindString, hash: key, ttl: wholeMillis(cfg.ttl), renew: !cfg.noRenew,
		ttlArg: c.ttlArgOf(cfg.ttl), proto: strProto{},
	}
	l.keyArr = [4]string{key, wire.StringFenceKey(key)}
	if _, _, ok := wire.ParseKey(c.cfg.prefix, key); ok {
		l.err = invalidf("key %q is dlock's own key of a lock (prefix %q): a string lock needs a key of its own", key, c.cfg.prefix)
	} else if err := wire.CheckStringKey(key); err != nil {
		l.err = invalidf("%v", err)
	} else if err := validTTL(cfg.ttl); err != nil {
		l.err = err
	} else if cfg.fair {
		l.err = invalidf("Fair with a string lock: the other libraries that share its key know no line, and would not keep one")
	} else if c.q != nil {
		l.err = invalidf("a string lock needs one Redis deployment, not quorum mode (NewQuorum)")
	} else if err := c.cfg.ack.err; err != nil {
		l.err = err
	}
}

// isString reports whether lk is a string lock (StringMutex).
func (lk *lock) isString() bool { return lk.kind == wire.KindString }

var (
	strAcquireScript = loadScript(wire.StrAcquire)
	strReleaseScript = loadScript(wire.StrRelease)
	strExtendScript  = loadScript(wire.StrExtend)
	strPTTLScript    = loadScript(wire.StrPTTL)
)

// strProto is a string lock at Redis: str_acquire.lua, str_release.lua,
// str_extend.lua, str_pttl.lua. Its KEYS are the key and its fence counter
// (keyArr[:2]). It has no line at Redis: a waiter looks again when woken
// (see stringwait.go).
type strProto struct{}

func (strProto) prepare(h *holding, _ int64) {
	lk, c := h.lk, &h.cmd
	c.join = "0"
	c.setRelease(strReleaseScript, "evalsha", &strReleaseScript.sha, "2", &lk.keyArr[0], &lk.keyArr[1],
		&h.token, &h.fenceStr, &lk.c.idleArg, &lk.keyArr[0], &lk.c.ps.arg)
	c.setAcquire(strAcquireScript, "evalsha", &strAcquireScript.sha, "2", &lk.keyArr[0], &lk.keyArr[1],
		&h.token, &lk.ttlArg, &lk.c.idleArg)
}

func (strProto) joinLine(*holding) {} // no line: the other libraries would not keep it

func (strProto) extend(h *holding, ttl string) call {
	return call{strExtendScript, h.lk.keyArr[:2], []any{h.token, ttl, h.lk.c.idleArg}}
}

func (strProto) pttl(h *holding) call {
	return call{strPTTLScript, h.lk.keyArr[:1], []any{h.token}}
}

// giveBack releases the lock if token holds it (an acquire whose reply was
// lost may have taken it): fence "0" says the fence is not known.
func (strProto) giveBack(ctx context.Context, lk *lock, token string) error {
	if err := lk.c.pubsubReady(ctx); err != nil {
		return err
	}
	_, err := strReleaseScript.run(ctx, lk.c.drv, lk.keyArr[:2], token, "0", lk.c.idleArg, lk.hash, lk.c.ps.arg)
	return err
}
