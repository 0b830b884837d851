package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// The raw floor on several masters (the quorum scenario): the raw floor's
// two commands and nothing else a Redlock needs beyond counting votes. On
// one master, SET NX PX then the compare-and-delete, in sequence on the
// caller's goroutine. On several, a lock attempt starts one goroutine per
// master, which sends the SET, waits for the release and then sends the
// compare-and-delete (one goroutine for both, so that the delete never
// overtakes its own master's SET when Lock returned before that master
// answered). Each request is bounded by the per-master timeout. raw waits
// for every master's answer at each step; raw-majority returns as soon as
// the answers in decide it (a majority agreed, or can no longer).

// rawQuorumImpl is the quorum side of raw (majority false) and of
// raw-majority.
func rawQuorumImpl(majority bool) *quorumImpl {
	waits := "every master"
	if majority {
		waits = "a majority of the masters (or until no majority can)"
	}
	return &quorumImpl{
		settings: func(e *env, node time.Duration) string {
			return fmt.Sprintf("the raw floor's commands (SET key token NX PX %v, EVALSHA compare-and-delete) on go-redis clients with ContextTimeoutEnabled and MaxRetries -1: in sequence on one master; on more, a goroutine per master per cycle sends both, each bounded by a %v per-master timeout, and Lock and Unlock wait for %s; a failed attempt waits for every master's SET and gives back what was granted; a held lock is retried after %v", e.ttl, node, waits, e.retry)
		},
		open: func(e *env, rdbs []*redis.Client, node time.Duration) (tryLocker, error) {
			return &rawQuorum{rdbs: rdbs, node: node, majority: majority, ttlMS: strconv.FormatInt(e.ttl.Milliseconds(), 10), retry: e.retry}, nil
		},
		prepare: func(ctx context.Context, rdb *redis.Client) error { return rawUnlock.Load(ctx, rdb).Err() },
		held: func(ctx context.Context, rdb *redis.Client, key string) (bool, error) {
			n, err := rdb.Exists(ctx, key).Result()
			return n > 0, err
		},
		// No resends by go-redis: a SET NX or a compare-and-delete resent
		// after a run whose reply was lost answers no (and a resend after a
		// refused connection waits out its backoff against a master that is
		// down).
		options: func(o *redis.Options) { o.ContextTimeoutEnabled, o.MaxRetries = true, -1 },
	}
}

type rawQuorum struct {
	rdbs     []*redis.Client
	node     time.Duration
	majority bool // decide once the answers in can (else wait for all)
	ttlMS    any
	retry    time.Duration
}

var errRawNotObtained = errors.New("raw: not obtained")

func (q *rawQuorum) Close() error { return nil }

// Lock tries until an attempt wins, a fixed retry delay apart.
func (q *rawQuorum) Lock(ctx context.Context, key string) (held, error) {
	w := rawWait{delay: q.retry}
	defer w.stop()
	for {
		h, err := q.TryLock(ctx, key)
		if !errors.Is(err, errRawNotObtained) {
			return h, err
		}
		if err := w.wait(ctx); err != nil {
			return nil, err
		}
	}
}

func (q *rawQuorum) TryLock(ctx context.Context, key string) (held, error) {
	token := rawToken()
	if len(q.rdbs) == 1 {
		ok, err := rawSet(ctx, q.rdbs[0], key, token, q.ttlMS)
		switch {
		case err != nil:
			return nil, err
		case !ok:
			return nil, errRawNotObtained
		}
		return &rawHeld{rdb: q.rdbs[0], key: key, token: token}, nil
	}
	n := len(q.rdbs)
	c := &rawCycle{q: q, key: key, token: token, set: make(chan rawVote, n), del: make(chan rawVote, n), release: make(chan struct{})}
	for _, rdb := range q.rdbs {
		go c.master(ctx, rdb)
	}
	t := c.count(c.set)
	if t.ok >= q.maj() {
		return c, nil
	}
	// Given back: wait for every master's SET, then for the delete of each
	// that granted (those whose SET failed get theirs in the background).
	for t.got < n {
		t.add(<-c.set)
	}
	c.unlock(ctx)
	for k := 0; k < t.ok; {
		if v := <-c.del; v.granted {
			k++
		}
	}
	if t.failed > n-q.maj() {
		// Too many masters failed for a majority: an error, not a lock
		// held elsewhere, so that Lock does not retry it.
		return nil, fmt.Errorf("raw: %d of %d masters failed: %w", t.failed, n, t.err)
	}
	return nil, fmt.Errorf("%w: %d of %d masters granted", errRawNotObtained, t.ok, n)
}

// A rawCycle is one lock attempt on several masters, and its release.
type rawCycle struct {
	q          *rawQuorum
	key, token string
	set, del   chan rawVote // one vote per master each
	release    chan struct{}
	relCtx     context.Context // the release's: set before release is closed
}

// A rawVote is one master's answer: ok, the SET set the key (or the
// delete deleted it). granted: a delete's master had granted the SET.
type rawVote struct {
	ok, granted bool
	err         error
}

func (q *rawQuorum) maj() int { return len(q.rdbs)/2 + 1 }

// master runs the attempt on one master: its SET, then, once released, the
// compare-and-delete if the SET granted or may have (an error).
func (c *rawCycle) master(ctx context.Context, rdb *redis.Client) {
	sctx, cancel := context.WithTimeout(ctx, c.q.node)
	ok, err := rawSet(sctx, rdb, c.key, c.token, c.q.ttlMS)
	cancel()
	c.set <- rawVote{ok: ok, err: err}
	<-c.release
	if !ok && err == nil {
		c.del <- rawVote{}
		return
	}
	dctx, cancel := context.WithTimeout(c.relCtx, c.q.node)
	deleted, derr := rawDel(dctx, rdb, c.key, c.token)
	cancel()
	c.del <- rawVote{ok: deleted, granted: ok, err: derr}
}

// A rawTally counts votes.
type rawTally struct {
	ok, failed, got int
	err             error // the first failure's
}

func (t *rawTally) add(v rawVote) {
	t.got++
	switch {
	case v.err != nil:
		t.failed++
		if t.err == nil {
			t.err = v.err
		}
	case v.ok:
		t.ok++
	}
}

// count takes votes until they decide (raw-majority) or all are in (raw).
func (c *rawCycle) count(votes <-chan rawVote) rawTally {
	n, maj := len(c.q.rdbs), c.q.maj()
	var t rawTally
	for t.got < n {
		t.add(<-votes)
		if c.q.majority && (t.ok >= maj || n-t.got+t.ok < maj) {
			break
		}
	}
	return t
}

func (c *rawCycle) unlock(ctx context.Context) {
	c.relCtx = ctx
	close(c.release)
}

// Unlock releases the lock on every master: freed if a majority deleted it.
func (c *rawCycle) Unlock(ctx context.Context) error {
	c.unlock(ctx)
	if t := c.count(c.del); t.ok < c.q.maj() {
		return fmt.Errorf("%w: deleted on %d of %d masters (%d failed: %v)", errRawNotHeld, t.ok, len(c.q.rdbs), t.failed, t.err)
	}
	return nil
}
