// Package rueidisdlock runs dlock over a rueidis client
// (github.com/redis/rueidis) instead of go-redis: a single server, a
// Sentinel-managed primary (rueidis.ClientOption.Sentinel) or a Redis
// Cluster. The Client it returns is a *dlock.Client like any other, with the
// same guarantees; only this package imports rueidis, so a program that uses
// dlock with go-redis never compiles it.
//
// What differs from go-redis, and why:
//
//   - rueidis pipelines every command of its client by itself (its
//     auto-pipelining), so WithAutoPipeline has no effect here.
//   - A lock call is bounded by its ctx the way dlock bounds a go-redis
//     client without ContextTimeoutEnabled: the command is sent without the
//     caller's cancellation, the call returns when ctx ends, and the reply,
//     when it comes, is still acted on (a grant that came too late is given
//     back rather than left to its TTL). Off Cluster, concurrent calls go
//     together (DoMulti) from a few shared goroutines, each caller waiting
//     on its own channel or its ctx, rather than on a goroutine each; on a
//     Cluster each call waits aside, so that a paused master holds up only
//     its own calls. A command on a connection that stops answering fails
//     when rueidis gives the connection up (ClientOption.ConnWriteTimeout,
//     10 s by default).
//   - rueidis never resends the commands dlock sends (they are built with
//     Arbitrary, which rueidis does not mark retryable): a release is sent
//     once and dlock decides whether to send it again, knowing that it did
//     (a release resent after a lost reply answers "not the owner", which
//     dlock must not take for a lost lease); an acquire whose reply was lost
//     is resent by dlock with the same token. MOVED and ASK replies are
//     followed, as go-redis does: they say the command did not run.
//     ClientOption.ConnLifetime must stay 0 (its default): rueidis resends
//     any command whose connection it retired by lifetime, whether or not
//     it ran.
//   - On Sentinel, rueidis closes its connections to a primary that was
//     replaced gracefully, still reading their replies for up to a second
//     each, where go-redis's failover client closes them at once. A reply
//     awaited while the client moved to another primary may come from the
//     old one, whose writes the promoted replica never saw (a grant there
//     is a second holder), so it is an unknown outcome, as a lost reply
//     is: the engine asks the promoted replica again (an acquire with the
//     same token). A subscription event that comes once the client moved
//     drops that subscription connection, and it is made again. Each round
//     trip costs two looks at the client's primary (Nodes: about 300 ns
//     and three allocations each), one just before the send and one after
//     the reply, and each subscription event costs one.
//   - Subscriptions use RESP3 push on one dedicated connection per server
//     (per Cluster master), with pub/sub hooks, so that dlock sees every
//     subscribe confirmed and every unsubscribe the server sends (a Cluster
//     node does when a slot moves); Client.Receive reports neither.
//   - A limit of rueidis (v1.0.79): a script running on the server longer
//     than its busy-reply-threshold while one of dlock's subscriptions ends
//     (a waiter gives up, for one) makes rueidis panic ("protocol
//     bug, message handled out of order"), ending the process: the server
//     answers -BUSY both to the unsubscribe and to the PING rueidis sends
//     after it. Keep scripts on that server shorter than
//     busy-reply-threshold, or use dlock over go-redis, which survives it
//     (docs/SAFETY.md, Documented limits).
//   - WithReplicaAck sends WAIT on a dedicated connection, after the write
//     it counts. Its timeout is not checked against the client's read
//     timeout (rueidis does not say what it is): keep it well below
//     ConnWriteTimeout.
//   - Quorum mode: NewQuorum takes rueidis clients as dlock.NewQuorum
//     takes go-redis ones, with the same contract; each client is one
//     master's (single-server or Sentinel mode, not a Cluster).
package rueidisdlock

import (
	"fmt"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/driver"
	"github.com/redis/rueidis"
)

// New returns a dlock Client over client, with dlock's options. The Client
// does not own client: Close leaves it open. It fails only if client is
// nil; a server that cannot be reached shows in the lock calls, as with
// dlock.New.
func New(client rueidis.Client, opts ...dlock.Option) (*dlock.Client, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: rueidisdlock.New: the rueidis client is nil", dlock.ErrInvalidArgument)
	}
	// driver.Attach is set by dlock's init (this package imports dlock):
	// it makes a Client over a driver without dlock exporting a
	// constructor that names internal types.
	return driver.Attach(newConn(client), opts).(*dlock.Client), nil
}

// NewQuorum is dlock.NewQuorum over rueidis clients: a Client that takes
// every lock on a majority of clients, independent Redis masters (the
// Redlock algorithm), with the same contract, options and assumptions
// (see dlock.NewQuorum). There must be at least 3, each a rueidis client
// of one master: a single server, or a Sentinel-managed primary
// (rueidis.ClientOption.Sentinel), not a Cluster; no two may send to the
// same server (for a Sentinel client, its primary when NewQuorum is
// called). The Client does not own clients: Close leaves them open. Every
// error satisfies errors.Is(err, dlock.ErrInvalidArgument).
//
// A master that is down when its client is made: rueidis.NewClient fails
// for it unless ClientOption.ForceSingleClient is set, in which case it
// returns the client with the error, and the client dials again at each
// call. Keep such a client: the master counts as down until it answers,
// as a go-redis client's would.
func NewQuorum(clients []rueidis.Client, opts ...dlock.Option) (*dlock.Client, error) {
	master := func(i int) (addr, not string) {
		switch c := clients[i]; {
		case c == nil:
			return "", "nil: each must be a rueidis client of one master (a single server or a Sentinel-managed primary)"
		case c.Mode() == rueidis.ClientModeCluster:
			return "", "a Cluster client: each must be a rueidis client of one master (a single server or a Sentinel-managed primary)"
		default:
			return nodesKey(c.Nodes()), ""
		}
	}
	c, err := driver.AttachQuorum("rueidisdlock.NewQuorum", opts, len(clients), master, func(i int) driver.Conn { return newConn(clients[i]) })
	if err != nil {
		return nil, err
	}
	return c.(*dlock.Client), nil
}
