package dlock

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/dlock-go/dlock/internal/hub"
	"github.com/dlock-go/dlock/internal/wire"
)

// pubsub is what a Client knows of its server's pub/sub. Waiters hear only
// releases published with the kind they subscribed with, so the kind is the
// server's to say, not an option: sharded (SPUBLISH, SSUBSCRIBE) on a
// Cluster and on any server that has it (Redis 7.0 and later), plain
// (PUBLISH, SUBSCRIBE) on a server without it (earlier Redis, miniredis),
// where, off Cluster, it means the same.
type pubsub struct {
	known atomic.Bool   // kind and arg are set, for good
	turn  chan struct{} // capacity 1: held by the one call asking the server
	kind  hub.Kind
	// arg is the publish command the scripts are given (wire.PublishSharded
	// or PublishPlain). Prepared command lines point at it (see cmdline), so
	// it is written once, before known is set, and a line that carries it
	// is sent only after pubsubReady.
	arg string
}

func (p *pubsub) init() { p.turn = make(chan struct{}, 1) }

func (p *pubsub) set(k hub.Kind) {
	p.kind, p.arg = k, wire.PublishSharded
	if k == hub.Plain {
		p.arg = wire.PublishPlain
	}
	p.known.Store(true)
}

// pubsubReady makes sure c knows its server's kind of pub/sub, which a
// script that publishes and a subscription need. The first call of the
// Client asks the server with one SPUBLISH (hub.Detect); a Cluster is
// sharded, and asked only to learn whether the user may publish. An error means the server did not answer: the
// caller fails as its own command would have, and the next call asks again.
func (c *Client) pubsubReady(ctx context.Context) error {
	if c.ps.known.Load() {
		return nil
	}
	select {
	case c.ps.turn <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-c.ps.turn }()
	if c.ps.known.Load() {
		return nil
	}
	v, err := c.aside(ctx, func(ctx context.Context) (any, error) {
		detect := func() (any, error) { return hub.Detect(ctx, c.drv, wire.ProbeChannel(c.cfg.prefix)) }
		v, err := detect()
		if err != nil && !c.tr.Resends && !badCertificate(err) {
			// Asked again after a failed connection, as go-redis resends
			// it (see script.run): over rueidis on Sentinel the first
			// call after a switch is an unknown outcome (rueidisdlock's
			// watch), which would fail a Client's first lock call.
			v, err = resend(ctx, v, err, nil, detect)
		}
		return v, err
	}, nil)
	if badCertificate(err) {
		return err // explainRefusal says what to fix
	}
	if err != nil && refused(err) {
		// No channel (or no SPUBLISH) permission: waiters would never be
		// notified and releases could not notify them. Fail closed, here,
		// rather than degrade to looking at each lock's TTL.
		return fmt.Errorf("the Redis user may not publish on dlock's channels (SPUBLISH %q: %w): its ACL needs the channel pattern &%s* and the commands in docs/PRODUCTION.md", wire.ProbeChannel(c.cfg.prefix), err, c.cfg.prefix)
	}
	if err != nil {
		return fmt.Errorf("asking the server whether it has SPUBLISH: %w", err)
	}
	k := v.(hub.Kind)
	c.cfg.logger.Debug("dlock: pub/sub kind", "kind", k)
	c.ps.set(k)
	return nil
}

// hubKind tells the hub which pub/sub to subscribe with.
func (c *Client) hubKind(ctx context.Context) (hub.Kind, error) {
	if err := c.pubsubReady(ctx); err != nil {
		return 0, err
	}
	return c.ps.kind, nil
}
