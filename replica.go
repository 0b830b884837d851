package dlock

import (
	"context"
	"fmt"
	"time"

	"github.com/dlock-go/dlock/internal/driver"
)

// ackConfig is WithReplicaAck's setting; n > 0 turns it on.
type ackConfig struct {
	n       int
	timeout time.Duration
	err     error // an invalid setting: every lock call reports it
}

// WithReplicaAck makes every grant wait until at least n replicas of the
// primary that made it have it, for at most timeout, before the holder is
// told it holds the lock: an acquire, a hand-over from the line (a Fair,
// RWMutex or Semaphore waiter, or a default-mode head), an Extend and every
// renewal. It is WAIT, sent on the connection that wrote, in the same
// round trip. A hand-over is written by the releaser's connection; the new
// holder confirms it by an extension of its own, acknowledged after it
// (replication keeps the order of writes), before its Lock returns.
//
// With fewer than n replicas confirming in time it fails closed: an
// acquire or hand-over is undone (released with the holder's token, so
// nothing is left locked) and the call returns an error that wraps
// ErrNotReplicated and says how many confirmed; an Extend or renewal does
// not count, and the lease keeps its earlier deadline (a lease whose
// renewals keep failing so is lost, as when Redis cannot be reached).
// Within one Client a lock is not passed from holder to waiter (see
// Mutex.Lock) while this is on: every grant goes through Redis.
//
// This closes the gap where a primary fails after a grant that no replica
// has yet: a promoted replica that never saw the grant would give the lock
// again. It does not make Redis a consensus system: a replica that
// acknowledged a grant may itself fail before the failover, and an
// acknowledged write can still be lost if the promoted replica is not one
// that acknowledged it (n below the number of replicas); choose n so that
// every replica Sentinel or Cluster may promote has confirmed (n = all
// replicas), and see docs/SAFETY.md.
//
// n must be at least 1 and timeout at least a millisecond and at most half
// the go-redis client's ReadTimeout (WAIT blocks the connection for up to
// timeout); otherwise every lock call returns ErrInvalidArgument. It works
// with a Client, a failover (Sentinel) client and a ClusterClient (WAIT
// goes to the master of the lock's slot), not with a Ring.
func WithReplicaAck(n int, timeout time.Duration) Option {
	return func(c *clientConfig) {
		c.ack = ackConfig{n: n, timeout: timeout}
		switch {
		case n < 1:
			c.ack.err = invalidf("WithReplicaAck: %d replicas: must be at least 1", n)
		case timeout < time.Millisecond:
			c.ack.err = invalidf("WithReplicaAck: timeout %v: must be at least 1ms", timeout)
		}
	}
}

// checkAck checks WithReplicaAck's setting against the driver's traits
// (at New).
func (a *ackConfig) check(t driver.Traits) {
	if a.n == 0 || a.err != nil {
		return
	}
	if t.AckErr != nil {
		a.err = invalidf("WithReplicaAck: %v", t.AckErr)
		return
	}
	read := t.ReadTimeout
	if read > 0 && a.timeout > read/2 {
		// The read deadline covers the script's reply as well as WAIT's,
		// and go-redis resends a pipeline whose read timed out.
		a.err = invalidf("WithReplicaAck: timeout %v: must be at most half the Redis client's ReadTimeout (%v), or the client may give up on WAIT first", a.timeout, read)
	}
}

// wait is the WAIT line that follows a grant on its connection.
func (a *ackConfig) wait() []any {
	return []any{"wait", a.n, a.timeout.Milliseconds()}
}

// on reports whether grants wait for replicas.
func (a *ackConfig) on() bool { return a.n > 0 }

// shortOf returns nil if WAIT w counted enough replicas, else the
// ErrNotReplicated error that says how many confirmed what.
func (a *ackConfig) shortOf(w driver.Reply, what string) error {
	n, err := replyInt(w)
	if err == nil && n >= int64(a.n) {
		return nil
	}
	msg := fmt.Sprintf("%s: %d of %d replicas confirmed within %v", what, n, a.n, a.timeout)
	if err != nil {
		msg += " (WAIT: " + err.Error() + ")"
	}
	return fmt.Errorf("%w: %s", ErrNotReplicated, msg)
}

// ackedReply is a script's reply and whether enough replicas confirmed
// every write its connection had made up to and including it (nil, or the
// ErrNotReplicated error): what runAcked passes through aside.
type ackedReply struct {
	v     any
	short error
}

// runAcked runs a prepared command line of s (see cmdline) about key and
// WAIT after it, on one connection in one round trip. It returns the
// script's reply, and short: nil if enough replicas confirmed, else the
// ErrNotReplicated error that says how many confirmed what. If ctx ends
// first, late (if not nil) gets the script's reply when it comes. After a
// failed connection the round trip is sent again, as go-redis resends a
// pipeline, by a driver that does not resend (driver.Traits.Resends):
// dlock's acquire and extend are idempotent for their token, and each
// writes, so a WAIT after the resend also confirms what the first send
// wrote on that primary. doubt (if not nil) is set when it is sent again:
// the first send may yet run.
func (c *Client) runAcked(ctx context.Context, s *script, key string, args []any, what string, doubt *bool, late func(any, error)) (v any, short error, err error) {
	if late != nil {
		inner := late
		late = func(v any, err error) {
			if r, ok := v.(ackedReply); ok {
				v = r.v
			}
			inner(v, err)
		}
	}
	send := func() (any, error) {
		return c.aside(ctx, func(ctx context.Context) (any, error) {
			v, err := c.sendAcked(ctx, key, args, what)
			if err != nil && isNoScript(err) {
				v, err = c.sendAcked(ctx, key, s.withSource(args), what)
			}
			return v, err
		}, late)
	}
	v, err = send()
	if err != nil && !c.tr.Resends {
		v, err = resend(ctx, v, err, func(error) {
			if doubt != nil {
				*doubt = true
			}
		}, func() (any, error) {
			if c.closed.Load() {
				return nil, ErrClosed // not sent: Close ends a waiting call
			}
			return send()
		})
	}
	if err != nil {
		return nil, nil, err
	}
	r := v.(ackedReply)
	return r.v, r.short, nil
}

func (c *Client) sendAcked(ctx context.Context, key string, args []any, what string) (any, error) {
	// Pipe on a Node sends on one connection to the primary that serves
	// key: WAIT counts what that connection wrote.
	p, err := c.drv.Node(ctx, key)
	if err != nil {
		return nil, err
	}
	r := p.Pipe(ctx, [][]any{args, c.cfg.ack.wait()}, false)
	if err := r[0].Err; err != nil {
		return nil, err
	}
	return ackedReply{v: r[0].Val, short: c.cfg.ack.shortOf(r[1], what)}, nil
}

// evalAcked is eval (see Client.eval) with WAIT after the call; see runAcked.
func (c *Client) evalAcked(ctx context.Context, k call, what string) (v any, short error, err error) {
	return c.runAcked(ctx, k.s, k.keys[0], k.s.line(k.keys, k.args), what, nil, nil)
}

// extendGroups splits a renewal's calls into the pipelines runExtends
// sends: one for all of them (a cluster client's pipeline routes each call
// by its key), or with replica acknowledgement one per primary, on one
// connection, since WAIT counts what one connection wrote. A call whose
// primary is not known is in no group, with its error in cmds.
func (c *Client) extendGroups(ctx context.Context, calls []call, cmds []driver.Reply) [][]int {
	if !c.cfg.ack.on() || !c.tr.Slots {
		all := make([]int, len(calls))
		for i := range all {
			all[i] = i
		}
		return [][]int{all}
	}
	var groups [][]int
	at := map[string]int{}
	for i, k := range calls {
		node, err := c.drv.Node(ctx, k.keys[0])
		if err != nil {
			cmds[i].Err = err
			continue
		}
		g, ok := at[node.Addr()]
		if !ok {
			g = len(groups)
			at[node.Addr()] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// replyInt is an integer reply, or the error that came instead of one.
func replyInt(r driver.Reply) (int64, error) {
	if r.Err != nil {
		return 0, r.Err
	}
	n, ok := r.Val.(int64)
	if !ok {
		return 0, fmt.Errorf("unexpected reply %v (%T) where an integer was due", r.Val, r.Val)
	}
	return n, nil
}
