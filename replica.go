package dlock

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
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

// checkAck checks WithReplicaAck's setting against rdb (at New).
func (a *ackConfig) check(rdb redis.UniversalClient) {
	if a.n == 0 || a.err != nil {
		return
	}
	var read time.Duration
	switch r := rdb.(type) {
	case *redis.Client:
		read = r.Options().ReadTimeout
	case *redis.ClusterClient:
		read = r.Options().ReadTimeout
	default:
		a.err = invalidf("WithReplicaAck: a %T is not supported: use a Client, a failover client or a ClusterClient", rdb)
		return
	}
	if read > 0 && a.timeout > read/2 {
		// The read deadline covers the script's reply as well as WAIT's,
		// and go-redis resends a pipeline whose read timed out.
		a.err = invalidf("WithReplicaAck: timeout %v: must be at most half the Redis client's ReadTimeout (%v), or the client may give up on WAIT first", a.timeout, read)
	}
}

// wait queues WAIT on p.
func (a *ackConfig) wait(ctx context.Context, p redis.Pipeliner) *redis.IntCmd {
	w := redis.NewIntCmd(ctx, "wait", a.n, a.timeout.Milliseconds())
	_ = p.Process(ctx, w)
	return w
}

// on reports whether grants wait for replicas.
func (a *ackConfig) on() bool { return a.n > 0 }

// ackedReply is a script's reply together with how many replicas confirmed
// every write its connection had made up to and including it.
type ackedReply struct {
	v        any
	replicas int64
	err      error // WAIT's own error (replicas is 0 then)
}

// short returns nil if enough replicas confirmed, else the ErrNotReplicated
// error that says how many.
func (a *ackConfig) short(r ackedReply, what string) error {
	if r.err == nil && r.replicas >= int64(a.n) {
		return nil
	}
	msg := fmt.Sprintf("%s: %d of %d replicas confirmed within %v", what, r.replicas, a.n, a.timeout)
	if r.err != nil {
		msg += " (WAIT: " + r.err.Error() + ")"
	}
	return fmt.Errorf("%w: %s", ErrNotReplicated, msg)
}

// unwrapAcked returns the script's own reply of v (an ackedReply or not).
func unwrapAcked(v any) any {
	if r, ok := v.(ackedReply); ok {
		return r.v
	}
	return v
}

// ackPipe returns a pipeline on one connection to the primary that serves
// key: WAIT counts what that connection wrote.
func (c *Client) ackPipe(ctx context.Context, key string) (redis.Pipeliner, error) {
	if cc, ok := c.rdb.(*redis.ClusterClient); ok {
		node, err := cc.MasterForKey(ctx, key)
		if err != nil {
			return nil, err
		}
		return node.Pipeline(), nil
	}
	return c.rdb.Pipeline(), nil
}

// runAcked runs a prepared command line of s (see cmdline) and WAIT after
// it, on one connection in one round trip, and returns an ackedReply. If ctx
// ends first, late (if not nil) gets the reply when it comes.
func (c *Client) runAcked(ctx context.Context, s *script, key string, args []any, late func(any, error)) (any, error) {
	return c.aside(ctx, func(ctx context.Context) (any, error) {
		v, err := c.sendAcked(ctx, key, args)
		if err != nil && isNoScript(err) {
			a := make([]any, len(args))
			copy(a, args)
			a[0], a[1] = "eval", s.src
			v, err = c.sendAcked(ctx, key, a)
		}
		return v, err
	}, late)
}

func (c *Client) sendAcked(ctx context.Context, key string, args []any) (any, error) {
	p, err := c.ackPipe(ctx, key)
	if err != nil {
		return nil, err
	}
	cmd := redis.NewCmd(ctx, args...)
	_ = p.Process(ctx, cmd)
	w := c.cfg.ack.wait(ctx, p)
	_, _ = p.Exec(ctx)
	if err := cmd.Err(); err != nil {
		c.clusterHint(err)
		return nil, err
	}
	n, werr := w.Result()
	return ackedReply{v: cmd.Val(), replicas: n, err: werr}, nil
}

// evalAcked is eval (see Client.eval) with WAIT after the call.
func (c *Client) evalAcked(ctx context.Context, k call) (any, error) {
	args := make([]any, 0, 3+len(k.keys)+len(k.args))
	args = append(args, "evalsha", k.s.sha, len(k.keys))
	for _, key := range k.keys {
		args = append(args, key)
	}
	args = append(args, k.args...)
	return c.runAcked(ctx, k.s, k.keys[0], args, nil)
}

// runExtendsAcked is runExtends with WAIT: the extends of the keys one
// primary serves go in one pipeline with one WAIT after them. acked[i]
// says whether enough replicas confirmed cmds[i]'s connection.
func (c *Client) runExtendsAcked(ctx context.Context, calls []call) (cmds []*redis.Cmd, acked []error) {
	cmds = make([]*redis.Cmd, len(calls))
	acked = make([]error, len(calls))
	groups := map[any][]int{}
	var order []any
	for i, k := range calls {
		var id any = 0
		if cc, ok := c.rdb.(*redis.ClusterClient); ok {
			node, err := cc.MasterForKey(ctx, k.keys[0])
			if err != nil {
				cmds[i] = redis.NewCmd(ctx)
				cmds[i].SetErr(err)
				continue
			}
			id = node
		}
		if _, seen := groups[id]; !seen {
			order = append(order, id)
		}
		groups[id] = append(groups[id], i)
	}
	for _, id := range order {
		idx := groups[id]
		send := func(withSrc bool) {
			p, err := c.ackPipe(ctx, calls[idx[0]].keys[0])
			if err != nil {
				for _, i := range idx {
					cmds[i] = redis.NewCmd(ctx)
					cmds[i].SetErr(err)
				}
				return
			}
			for _, i := range idx {
				k := calls[i]
				if withSrc {
					cmds[i] = p.Eval(ctx, k.s.src, k.keys, k.args...)
				} else {
					cmds[i] = p.EvalSha(ctx, k.s.sha, k.keys, k.args...)
				}
			}
			w := c.cfg.ack.wait(ctx, p)
			_, _ = p.Exec(ctx)
			n, werr := w.Result()
			short := c.cfg.ack.short(ackedReply{replicas: n, err: werr}, "renewal")
			for _, i := range idx {
				acked[i] = short
			}
		}
		send(false)
		for _, i := range idx {
			if isNoScript(cmds[i].Err()) {
				send(true)
				break
			}
		}
		for _, i := range idx {
			if err := cmds[i].Err(); err != nil {
				c.clusterHint(err)
				break
			}
		}
	}
	return cmds, acked
}
