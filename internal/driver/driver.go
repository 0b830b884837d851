// Package driver is the seam between dlock's engine and a Redis client
// library: everything the engine sends or hears goes through a Conn. The
// go-redis v9 implementation is internal/driver/goredis; the rueidis one is
// in package rueidisdlock, so that a go-redis user's build never compiles
// rueidis.
//
// Command lines are []any whose first element names the command in lower
// case ("evalsha", "eval", "exists", "wait", "spublish", "script"); the
// other elements are string, *string (read, never kept past the call),
// int or int64. An "evalsha" or "eval" line is {name, sha or source, numkeys,
// keys..., args...}; any other line that has a key has it second. A driver
// routes a line on a Cluster by that key.
//
// Replies come in these shapes only: int64, string, []any (of these
// shapes, or an error for an element that is an error reply), or nil; an
// error reply of the server is an error that satisfies ReplyError, and
// every other error (a network failure, a closed client, ctx) does not.
package driver

import (
	"context"
	"errors"
	"time"
)

// Conn is a Redis client as dlock's engine uses it: a single server, a
// Sentinel-managed primary or a Cluster. Its methods are safe for
// concurrent use.
type Conn interface {
	// Do sends one command line and returns its reply. once: the driver
	// must not send the line again by itself after a failure that may have
	// followed a run (a network error, a timeout); a refusal that shows the
	// line did not run (MOVED, ASK) may be followed. A line sent without
	// once may be resent by the driver if Resends says so.
	Do(ctx context.Context, line []any, once bool) (any, error)

	// Pipe sends lines in one round trip (one per node of a Cluster,
	// routing each line by its key) and returns a reply per line, in
	// order. once applies to every line, as in Do.
	Pipe(ctx context.Context, lines [][]any, once bool) []Reply

	// Node returns the primary that serves key: on a Cluster the master of
	// its slot in the client's slot map, otherwise the one server.
	Node(ctx context.Context, key string) (Node, error)

	// LoadScript loads src on every primary (each master of a Cluster).
	LoadScript(ctx context.Context, src string) error

	// Submit runs line, sent once, through the client's shared batching
	// pipeliner (Pipelined says whether it has one) and waits for its reply,
	// for ctx or for stop (nil: none), which the engine closes when its
	// Client closes; at stop Submit returns ErrStopped. If ctx ends or stop
	// is closed first the line still runs: late, if not nil, gets its reply
	// when it comes, on a goroutine that goBg starts as the caller leaves
	// (Close waits for those), or, if goBg refuses (the Client is closing),
	// before Submit returns: a grant must still be given back. A driver
	// whose pipeliner can wait on a ctx only may ignore stop if every call
	// ends at the client's own timeout: go-redis's does.
	Submit(ctx context.Context, line []any, late func(any, error), goBg func(func()) bool, stop <-chan struct{}) (any, error)

	// Traits says what kind of client this is; it does not change.
	Traits() Traits

	// ReloadSlots asks a Cluster client to reload its slot map soon, in the
	// background (coalesced): after a call failed in a way that suggests
	// the map is stale. Other clients ignore it.
	ReloadSlots()
}

// ErrStopped is Submit's error when its stop channel closed before the
// reply came.
var ErrStopped = errors.New("the call's wait was stopped")

// Traits are the fixed facts about a Conn the engine branches on.
type Traits struct {
	// Cluster: a Redis Cluster, which reads its slot map from the servers
	// and always has sharded pub/sub. A cluster client given its slot map
	// by other means (go-redis's failover cluster client) is not one.
	Cluster bool
	// Slots: the client routes by a slot map (a Cluster client of either
	// kind), so Node's answer depends on the key and may change.
	Slots bool
	// ContextAware: the client bounds its socket I/O by the ctx deadline
	// and returns when ctx ends, so the engine need not run calls aside.
	// A driver that says so loses the reply of a call cut short by ctx.
	ContextAware bool
	// Resends: the driver itself resends a line sent without once after a
	// network failure (go-redis does by default). Otherwise the engine
	// resends what must be resent (an acquire, with the same token).
	Resends bool
	// Pipelined: Submit batches lines with other callers' (go-redis's
	// deferred autopipeliner). Otherwise Do does so itself, or nothing
	// does, and the engine never calls Submit.
	Pipelined bool
	// EagerSubmit: Submit sends a line at once (it holds none back to
	// batch it) and waits without a goroutine per call, so the engine
	// uses it for every call it would otherwise run aside (one whose ctx
	// can end), however few are in flight. Only with Pipelined.
	EagerSubmit bool
	// ReadTimeout bounds how long the client waits for a reply on one
	// connection (0: no bound); AckErr, if not nil, says why WAIT cannot
	// be sent on the connection that wrote (WithReplicaAck is refused).
	ReadTimeout time.Duration
	AckErr      error
}

// Reply is the answer to one line of a pipeline.
type Reply struct {
	Val any
	Err error
}

// Node is one primary: Pipe on it sends its lines on one connection, so
// that WAIT counts what the lines before it wrote.
type Node interface {
	// Addr is the primary's address on a Cluster, "" otherwise.
	Addr() string
	// Pipe sends lines on one connection to this primary, in one round
	// trip. once applies as in Conn.Do.
	Pipe(ctx context.Context, lines [][]any, once bool) []Reply
	// PubSub returns a new subscription connection to this primary, with
	// no channel yet. It dials on first use; ctx bounds nothing after
	// PubSub returns.
	PubSub(ctx context.Context) PubSub
}

// PubSub is one subscription connection. Its commands are sent in order,
// and Receive returns the server's answers and messages in the order they
// came: Redis answers a connection's commands in order, which is how the
// hub matches them. Subscribe and Unsubscribe may be called from one
// goroutine while Receive is called from another.
type PubSub interface {
	// Subscribe sends SUBSCRIBE (sharded false) or SSUBSCRIBE of one
	// channel; its confirmation or refusal comes through Receive.
	Subscribe(ctx context.Context, sharded bool, channel string) error
	// Unsubscribe sends UNSUBSCRIBE or SUNSUBSCRIBE of one channel.
	Unsubscribe(ctx context.Context, sharded bool, channel string) error
	// Ping sends PING; its Pong comes through Receive.
	Ping(ctx context.Context) error
	// Receive waits at most timeout for the next event. An error that
	// satisfies ReplyError is the server's refusal of the oldest command
	// still unanswered; any other error means the connection is lost.
	Receive(ctx context.Context, timeout time.Duration) (Event, error)
	// Close ends the connection; Receive then fails.
	Close() error
}

// EventKind is what a PubSub received.
type EventKind uint8

const (
	// Message is a published message: Channel and Payload.
	Message EventKind = iota + 1
	// Subscription confirms a subscribe or unsubscribe, or is an
	// unsubscribe the server sent on its own: Kind ("subscribe",
	// "ssubscribe", "unsubscribe", "sunsubscribe") and Channel.
	Subscription
	// Pong answers a Ping.
	Pong
)

// Event is one thing a PubSub received.
type Event struct {
	Type             EventKind
	Kind             string
	Channel, Payload string
}

// ReplyError is an error reply of the server, as opposed to a failure to
// get a reply. go-redis's redis.Error satisfies it as it is.
type ReplyError interface {
	error
	RedisError()
}

// Attach makes a *dlock.Client over a Conn, with opts a []dlock.Option,
// and returns it as any. Package dlock sets it in its init, so that a
// driver outside dlock (rueidisdlock) can build a Client while dlock's
// public API names no internal type; such a package imports dlock, which
// makes the init run before any call.
var Attach func(c Conn, opts any) any

// AttachQuorum makes a quorum *dlock.Client (dlock.NewQuorum's) over n
// masters, with opts a []dlock.Option, as Attach does one Client; who
// names the caller in its errors. master(i) returns master i's address
// (two masters at one address are one master) or, if it cannot be a
// master, what it is and why not ("a Cluster client: each must be ...");
// conn(i) makes master i's Conn, called only once every master passed.
// The error, if any, satisfies errors.Is(err, dlock.ErrInvalidArgument).
var AttachQuorum func(who string, opts any, n int, master func(i int) (addr, not string), conn func(i int) Conn) (any, error)
