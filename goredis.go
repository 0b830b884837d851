package dlock

// This file is dlock's front door for go-redis v9 users: the constructors
// that take go-redis clients. Everything else in the package talks to Redis
// through internal/driver, whose go-redis implementation is
// internal/driver/goredis (rueidisdlock holds the rueidis one).

import (
	"fmt"

	"github.com/dlock-go/dlock/internal/driver"
	"github.com/dlock-go/dlock/internal/driver/goredis"
	"github.com/redis/go-redis/v9"
)

// New returns a Client over rdb: a go-redis v9 single-node, failover
// (Sentinel) or cluster client. The Client does not own rdb: Close leaves it
// open.
//
// Wake-ups travel by sharded pub/sub (SPUBLISH, SSUBSCRIBE) on a Cluster and
// on any server that has it (Redis 7.0 and later), and by plain pub/sub
// (PUBLISH, SUBSCRIBE) on a single server without it (earlier Redis,
// miniredis), with the same guarantees; a ClusterClient with a ClusterSlots
// func (as redis.NewFailoverClusterClient makes) counts as a single server. A Client finds out which with one
// command before its first lock call, and keeps the answer for its life. So
// make new Clients after moving to a server of another kind (a failover to a
// replica of another version): an old Client's waiters would not be woken
// by message on a server without SPUBLISH (its releases still succeed), and
// on one with it the old Clients and the new would not hear each other's
// releases (waiters would wake at the holder's TTL).
func New(rdb redis.UniversalClient, opts ...Option) *Client {
	cfg := configure(opts)
	// Lock and unlock scripts go through the client's shared deferred
	// autopipeliner when many are in flight (WithAutoPipeline): concurrent
	// calls share round trips and system calls. The pipeliner never
	// resends them (see Client.pipelined): the engine retries what it must
	// itself.
	return newOver(goredis.New(rdb, cfg.autoPipeline), cfg)
}

// NewQuorum returns a Client that takes every lock on a majority of rdbs,
// independent Redis masters (the Redlock algorithm): at least 3, each a
// go-redis Client of one master (a failover client too), no two the same.
// An odd number is the sensible choice: with N masters a lock needs N/2+1
// of them, so N = 4 tolerates one master down, as N = 3 does, at a greater
// cost. The Client does not own rdbs: Close leaves them open.
// rueidisdlock.NewQuorum is the same over rueidis clients.
//
// Mutex works as on one server, in default mode (Fair, RWMutex and
// Semaphore report errors.ErrUnsupported): Lock, TryLock, Do, reentrancy,
// the lease context, watchdog renewal, Extend, TTL and Unlock. A request
// goes to every master at once, each bounded by WithNodeTimeout; it counts
// only with a majority of grants, and a lease is valid until TTL after its
// first send, less 1% of the TTL and 2 ms for clock drift, which comes out
// below zero (not obtained) if the masters took too long. A failed acquire
// is given back on every master, including those whose reply was lost. A
// renewal needs a majority too: a lease that cannot get one ends with
// ErrLockLost. Waiting is notified by a release on any master.
//
// Fences strictly increase in the order leases are granted while the
// masters keep their data: a grant raises its counter to its fence on a
// majority before Lock returns (see docs/PROTOCOL.md).
//
// What quorum mode assumes (the conditions of the Redlock argument): the
// clocks of the masters and of this process run at nearly the same rate
// (within 1%) and no master's clock jumps; and a master whose data may lack
// a lease it granted (after a restart, whatever its persistence, or a
// failover to a replica) does not vote until every lease it may have
// granted has expired. dlock enforces the last itself: a master's data
// carry an epoch key naming the process that holds them and since when,
// and a master whose key is missing or names another process, or whose
// process has held its data for less than WithRestartDelay, refuses to
// vote for the rest of the delay. Every Client of a quorum must use the
// same restart delay, and no lease may be longer (a TTL or Extend above it
// is refused).
func NewQuorum(rdbs []redis.UniversalClient, opts ...Option) (*Client, error) {
	clients := make([]*redis.Client, len(rdbs))
	master := func(i int) (addr, not string) {
		rc, ok := rdbs[i].(*redis.Client)
		if !ok || rc == nil {
			return "", fmt.Sprintf("a %T: each must be a *redis.Client of one master (or a failover client)", rdbs[i])
		}
		clients[i] = rc
		if addr = rc.Options().Addr; addr == failoverAddr {
			addr = fmt.Sprintf("the failover client %p", rc) // its master is the sentinels' to say
		}
		return addr, ""
	}
	return quorumOver("NewQuorum", opts, len(rdbs), master, func(i int) driver.Conn { return goredis.New(clients[i], false) })
}

// failoverAddr is the address go-redis gives every failover client.
const failoverAddr = "FailoverClient"
