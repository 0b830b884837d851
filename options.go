package dlock

import (
	"log/slog"
	"time"
)

// Option configures a Client.
type Option func(*clientConfig)

type clientConfig struct {
	prefix string
	logger *slog.Logger
	idle   time.Duration

	autoPipeline bool

	ack ackConfig // WithReplicaAck

	quorum quorumConfig // WithNodeTimeout, WithRestartDelay

	obs obsConfig // WithMeterProvider, WithTracerProvider, WithNameAttribute
}

func defaultClientConfig() clientConfig {
	return clientConfig{prefix: "dlock:", logger: nil, idle: 10 * time.Minute, autoPipeline: true,
		quorum: quorumConfig{node: DefaultNodeTimeout, delay: DefaultRestartDelay}}
}

// WithPrefix sets the prefix of every Redis key and channel the Client uses.
// Default "dlock:". Clients that must see each other's locks need the same prefix.
// A prefix whose first '{' is followed at once by '}' is refused (locks
// report ErrInvalidArgument): the keys of a lock would not share a Cluster slot.
func WithPrefix(prefix string) Option { return func(c *clientConfig) { c.prefix = prefix } }

// WithLogger sets the logger for background events (lost leases, renewal
// errors, reconnects) and, at Debug level, for every acquiring call,
// wait, Unlock and renewal ("dlock: acquire", "dlock: waiting", "dlock:
// unlock", "dlock: renewed"). No line carries an owner token: an "owner"
// attribute is a short hash of it. Default: none (nothing is logged).
func WithLogger(l *slog.Logger) Option { return func(c *clientConfig) { c.logger = l } }

// WithIdleExpiry sets how long a lock name's key (which keeps its fencing
// counter) lives after its last holder leaves. Default 10 minutes. Shorter
// saves memory when many unique names are locked once; fences stay strictly
// increasing across the expiry as long as the server clock does not step
// backwards by more than this period (new counters are seeded from the
// server's clock in microseconds). Values below one second are raised to one
// second.
func WithIdleExpiry(d time.Duration) Option {
	return func(c *clientConfig) {
		c.idle = max(d, time.Second)
	}
}

// WithAutoPipeline chooses whether lock and unlock scripts go through the
// go-redis client's shared autopipeliner (Client.AutoPipeline), which batches
// concurrent calls into one round trip. Default true (when the client
// offers one). Turn it off to send every call on its own pooled connection.
func WithAutoPipeline(on bool) Option { return func(c *clientConfig) { c.autoPipeline = on } }

// LockOption configures one lock (Mutex).
type LockOption func(*lockConfig)

type lockConfig struct {
	ttl     time.Duration
	noRenew bool
	fair    bool
}

// DefaultTTL is the lease length when TTL is not given.
const DefaultTTL = 10 * time.Second

// MaxTTL is the longest lease length accepted.
const MaxTTL = 365 * 24 * time.Hour

// TTL sets the lease length: how long the lock outlives a holder that stops
// renewing it (crashed, paused, partitioned). Default 10s. It must be at least
// one millisecond; a fraction of a millisecond is dropped (Redis counts
// whole milliseconds).
func TTL(d time.Duration) LockOption { return func(c *lockConfig) { c.ttl = d } }

// NoRenew turns the watchdog off: the lease ends TTL after it was obtained
// unless Extend is called. Default: renewal on, every TTL/3, until Unlock.
func NoRenew() LockOption { return func(c *lockConfig) { c.noRenew = true } }

// Fair makes Lock strictly first-come, first-served across all clients: a
// waiter takes a place in a line kept at Redis, and Unlock hands the lock
// straight to the first live waiter inside the release script, which tells
// it so (the next holder starts half a round trip after the release, not
// after a wake-up and a new attempt). A waiter keeps its place alive while
// it waits; one that died or gave up is skipped within about a second.
// Default: off (waiters of one Client are served in order, and only the first
// of them waits in the line at Redis, so the lock is handed round the Clients
// in turn; but a Lock or TryLock that finds the lock free takes it at once).
//
// Fair and default callers of one name stay mutually exclusive and share the
// line, but only Fair callers keep it strictly: a default Lock or TryLock
// takes a free lock even when others are in line (which only happens while
// the lock is not handed over, e.g. after a holder crashed).
func Fair() LockOption { return func(c *lockConfig) { c.fair = true } }
