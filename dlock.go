// Package dlock provides distributed locks on Redis: a Mutex (optionally
// Fair), an RWMutex and a weighted Semaphore, whose every holding is a Lease
// with a 128-bit owner token, a fencing token, a context that ends when the
// lease is lost, watchdog renewal and an idempotent Unlock.
//
// # Usage
//
// A program's main, with imports "context", "errors", "fmt", "log", "time",
// "github.com/dlock-go/dlock" and "github.com/redis/go-redis/v9" (the package
// Example is this code; go test runs it against a real server):
//
//	ctx := context.Background()
//	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
//	defer rdb.Close()
//	locks := dlock.New(rdb) // one Client per process: it renews every lease it hands out
//	defer locks.Close()
//
//	invoice := locks.Mutex("invoice:42", dlock.TTL(15*time.Second)) // options follow the name
//	lease, err := invoice.Lock(ctx)                                  // waits, notified, until free or ctx ends
//	if err != nil {
//		log.Fatal(err) // errors.Is(err, ctx.Err()) when ctx ended first
//	}
//	// Work under lease.Context(), which ends if the lock is lost, and give
//	// lease.Fence() to storage so that it can refuse a holder that lost it.
//	fmt.Println("locked", lease.Name())
//
//	if _, err := locks.Mutex("invoice:42").TryLock(ctx); errors.Is(err, dlock.ErrNotObtained) {
//		fmt.Println("TryLock: held by someone else")
//	}
//	if err := lease.Unlock(ctx); err != nil {
//		log.Fatal(err)
//	}
//	fmt.Println("unlocked")
//
// # What dlock guarantees
//
// On one Redis server (and on Sentinel or Cluster with the caveats below):
//
//   - Mutual exclusion while the holder's pauses and network delays stay well
//     under the TTL and the server neither loses data nor steps its clock. A
//     lease's expiry is the lock key's own PEXPIRE, kept by the server's clock;
//     the client measures elapsed time only with Go's monotonic clock, so
//     client wall-clock jumps change nothing.
//   - Lease.Context ends, with context.Cause ErrLockLost, no later than the
//     lease's deadline on the holder's monotonic clock when renewal cannot
//     reach Redis, and as soon as renewal finds the lock gone (expired, deleted
//     or overwritten). Lease.Unlock and Lease.Extend return ErrLockLost then,
//     and never touch a lock that changed hands; Extend never recreates it.
//   - Fences (Lease.Fence) strictly increase per lock name across all holders.
//     The counter lives in the lock's own key, which outlives a release by the
//     idle period (WithIdleExpiry), and a new counter starts from the server
//     clock in microseconds: so fences keep increasing across reclaims,
//     expiries and even restarts that lost the key, as long as the server
//     clock does not step backwards (if it does and the key is lost, a
//     Client that was granted a higher fence for the name logs the
//     regression at Error level, see WithLogger). A held lock costs Redis
//     one small hash (under 200 bytes: TestMemoryPerLock checks it).
//   - Waiting is notified, not polled: waiters of one Client share one
//     subscription and queue locally in arrival order, and only the head of
//     that queue contends at Redis, where it takes a place in the lock's line;
//     Unlock hands the lock straight to the first live waiter in that line and
//     tells its Client alone, or, with nobody in line, publishes on the lock's
//     pub/sub channel (sharded where the server has it, see New). A head
//     whose look finds the lock held by a lease of its own Client neither
//     subscribes nor takes a place in line: that lease's Unlock wakes it
//     directly. Every wait is bounded by the holder's remaining TTL, so a
//     missed message or a crashed holder costs at most that TTL. Lock waits
//     until its ctx ends; there is no retry limit.
//   - In default mode a Client also passes the lock among its own waiters
//     without a round trip before the next holder starts: the lock stays the
//     passing lease's at Redis until the pass is recorded (the new lease lives
//     on the old one's deadline until then, and ends with ErrLockLost if the
//     old one had been lost), and the new fence is the old one plus one. The
//     lock goes round the Clients in turns: a Client passes it only to the
//     waiters it had queued when its turn began, then it goes back to the
//     line at Redis. Fair, Semaphore and RWMutex waiters are never passed to.
//   - Semaphore and RWMutex waiters, and Fair mutex waiters, wait in a line at
//     Redis and are handed the lock (or permits) by the releasing script, in
//     arrival order. A Semaphore never has more than its size in permits held;
//     an RWMutex has one writer or any number of readers, and once a writer
//     waits, later readers wait behind it. Each reader or permit holder has
//     its own lease, so one that crashed frees only its own share, at its TTL.
//
// # What it does not guarantee
//
// A lease is a lease: a holder paused past its TTL (GC, SIGSTOP, swap) keeps
// running after someone else obtained the lock. Its Lease.Context has ended
// by then, but only a resource that checks Lease.Fence can reject its late
// writes; use fences for anything that must never see a stale writer. A
// failover can lose a lock that had not reached the replica (unless the
// Client is made WithReplicaAck, which makes every grant wait for replicas
// and fail closed with ErrNotReplicated without them; a replica that
// confirmed can still fail itself), and a server clock that jumps forward
// expires locks early.
//
// # Leader election
//
// Client.Election makes a Fair mutex into an election: candidates lead one
// at a time in arrival order, the leader's lease fence is its term, its
// value is published only while Redis still names it the owner, and
// Election.Observe follows the leader by notification (see Election).
//
// # Several names as one
//
// Client.MultiLock holds several mutex names as one Lease: all of them or
// none, taken in one global order (Cluster slot, then name) so that callers
// locking overlapping sets never deadlock, the names of one slot by one
// script (see MultiLock).
//
// # Quorum mode
//
// NewQuorum takes every lock on a majority of independent masters (the
// Redlock algorithm), for a Mutex; see NewQuorum for what it assumes.
//
// # Other client libraries
//
// New takes a go-redis v9 client. Package rueidisdlock makes the same Client
// over a rueidis client instead, with the same guarantees; this package does
// not import rueidis.
package dlock

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/internal/driver"
	"github.com/dlock-go/dlock/internal/hub"
	"github.com/dlock-go/dlock/internal/wire"
)

// MaxNameLen is the longest lock name accepted, in bytes.
const MaxNameLen = wire.MaxNameLen

// A Client owns the Redis connection, one shared subscription for wake-ups
// and one watchdog that renews every lease it holds. It is safe for
// concurrent use. Close it when done: that ends its goroutines and releases
// the leases it still holds.
type Client struct {
	drv      driver.Conn       // the Redis client (nil in quorum mode)
	tr       driver.Traits     // drv's, read once
	ttlArg   string            // DefaultTTL in ms, formatted once
	liveArg  string            // fairLiveness in ms, formatted once
	idleArg  string            // the idle period in ms, formatted once
	id       string            // random, names this Client's hand-over channels
	inflight atomic.Int64      // lock-path scripts awaiting Redis
	spawn    func(func()) bool // goBg, as a func made once (a method value per call would cost an allocation)
	cfg      clientConfig
	obs      *observer // metrics, spans and debug lines; nil: none (observe.go)

	closed    atomic.Bool
	closeOnce sync.Once
	bg        context.Context // ends at Close
	stop      context.CancelFunc
	gs        goroutines

	tokens tokenSource
	dog    watchdog
	hub    *hub.Hub
	sw     strWait // string locks' waits (stringwait.go)
	ps     pubsub
	fences fenceMemo

	observers watchers // Election.Observe's goroutines, by the channels they hear (election.go)

	mu      sync.Mutex         // guards locals, byToken, late and the waiters in them
	locals  map[string]*local  // the locks this Client waits for, by lock key
	byToken map[string]*waiter // waiters in line at Redis, by token (for hand-overs)
	late    map[string]bool    // hand-overs (channel and token: lateKey) found before their message (expectHandOver)
	seq     uint64             // default-mode waiters ever queued: the last one's arrival number
	heard   uint64             // hand-over messages delivered to a waiting waiter (for tests)

	gaps        atomic.Uint64 // subscriptions the hub re-established after a fault (for tests)
	besideWoken atomic.Uint64 // waiters beside a holder of ours woken to look again (for tests)

	q      *quorum // quorum mode (NewQuorum): the masters; drv and hub are nil
	parent *Client // a quorum master's Client: the quorum Client its wake-ups go to
	// renewalHook, set by tests before the first lock, runs on the watchdog
	// goroutine after it read the TTL it will renew a holding to, before the
	// renewal is sent: an interleaving no fault on the wire can reach.
	renewalHook func(h *holding)
	// subscribeHook, set by tests, runs in a waiter's Lock just before it
	// subscribes its lock's channels: a Close can be made to fall there.
	subscribeHook func()
	// passHook, set by tests before the first lock, runs in passOn with
	// c.mu held, right after the pass from → to is made and before the
	// waiter is woken.
	passHook func(from, to *holding)
}

// configure applies opts to the defaults.
func configure(opts []Option) clientConfig {
	cfg := defaultClientConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.logger == nil {
		cfg.logger = noLogger()
	}
	return cfg
}

// newOver returns a Client over drv: what New does after it made the
// go-redis driver, and what rueidisdlock.New does through driver.Attach.
func newOver(drv driver.Conn, cfg clientConfig) *Client {
	cfg.ack.check(drv.Traits())
	if cfg.quorum.set != "" && cfg.quorum.err == nil {
		cfg.quorum.err = invalidf("%s applies to NewQuorum only", cfg.quorum.set)
	}
	c := newClient(drv, cfg)
	// A Cluster is sharded, but it is still asked (hub.Detect) at the first
	// lock call, so that a user refused the channels is told there.
	c.hub = hub.New(drv, clientHandler{c}, cfg.logger, c.hubKind)
	return c
}

// init lets a driver outside this package (rueidisdlock) make a Client,
// one server's or a quorum's, without an exported constructor that names internal types: package
// driver holds the hook, which only this module can import, and a driver
// package that calls it imports dlock, so this init has run by then.
func init() {
	driver.Attach = func(drv driver.Conn, opts any) any {
		o, _ := opts.([]Option)
		return newOver(drv, configure(o))
	}
	driver.AttachQuorum = func(who string, opts any, n int, master func(int) (string, string), conn func(int) driver.Conn) (any, error) {
		o, _ := opts.([]Option)
		c, err := quorumOver(who, o, n, master, conn)
		if err != nil {
			return nil, err // not a typed nil in an any
		}
		return c, nil
	}
}

func noLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// newClient is the part of a Client that New and NewQuorum share (drv is
// nil in quorum mode).
func newClient(drv driver.Conn, cfg clientConfig) *Client {
	bg, stop := context.WithCancel(context.Background())
	c := &Client{
		drv:     drv,
		cfg:     cfg,
		obs:     newObserver(cfg),
		ttlArg:  formatMillis(DefaultTTL),
		liveArg: formatMillis(fairLiveness),
		idleArg: formatMillis(cfg.idle),
		bg:      bg,
		stop:    stop,
		locals:  make(map[string]*local),
		byToken: make(map[string]*waiter),
		late:    make(map[string]bool),
	}
	if drv != nil {
		c.tr = drv.Traits()
	}
	c.spawn = c.goBg
	c.id = c.tokens.next()[:12]
	c.dog.init()
	c.fences.init()
	c.ps.init()
	return c
}

// Close ends the Client: held leases are released (best effort, within a
// few seconds) and their contexts end with cause ErrClosed; waiting calls
// return ErrClosed; background goroutines end. Further calls return
// ErrClosed. A lock taken, passed or handed over to a call as Close runs is
// released by that call, which returns ErrClosed. Close is idempotent and
// does not close the Redis client. Calls of Close at the same time all
// return once it is done. Close waits for the replies of calls still in
// flight, so that a grant arriving late is given back: the Redis client's
// I/O timeout bounds that wait (go-redis's ReadTimeout, rueidis's
// ConnWriteTimeout), so leave it on; with it turned off, Close on a server
// that stopped answering waits until it answers again.
func (c *Client) Close() error {
	c.closeOnce.Do(c.close)
	return nil
}

func (c *Client) close() {
	c.closed.Store(true)
	// A pass decided before closed was set has started its record by now
	// (passOn holds c.mu throughout): the record releases what it passed.
	c.mu.Lock()
	//lint:ignore SA2001 an empty critical section is the barrier
	c.mu.Unlock()
	c.dog.stop()
	live := c.dog.drain()
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.bg), 3*time.Second)
	defer cancel()
	var quorumLive []*holding
	for _, h := range live {
		if !h.closeDown() { // a pending one is released by its record
			continue
		}
		if c.q != nil {
			quorumLive = append(quorumLive, h)
		} else {
			_, _ = h.cmd.relScript.do(ctx, c.drv, h.cmd.release(), false)
		}
	}
	if c.q != nil {
		c.q.releaseAll(ctx, quorumLive)
	}
	c.stop()
	if c.q != nil {
		c.gs.wait()
		c.q.closeMembers()
		return
	}
	c.hub.Close()
	c.closeKeyspace()
	c.gs.wait()
}

// goroutines tracks a Client's background goroutines so that Close can wait
// for them; once Close waits, no new one starts (a sync.WaitGroup may not
// be added to while it is waited on).
type goroutines struct {
	mu     sync.Mutex
	n      int
	closed bool
	idle   chan struct{}
}

// goBg runs f on a tracked goroutine and reports whether it started.
func (c *Client) goBg(f func()) bool {
	g := &c.gs
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		return false
	}
	g.n++
	g.mu.Unlock()
	go func() {
		defer g.done()
		f()
	}()
	return true
}

func (g *goroutines) done() {
	g.mu.Lock()
	g.n--
	if g.n == 0 && g.idle != nil {
		close(g.idle)
		g.idle = nil
	}
	g.mu.Unlock()
}

func (g *goroutines) wait() {
	g.mu.Lock()
	g.closed = true
	if g.n == 0 {
		g.mu.Unlock()
		return
	}
	idle := make(chan struct{})
	g.idle = idle
	g.mu.Unlock()
	<-idle
}

func validName(name string) error {
	if err := wire.CheckName(name); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	return nil
}

func validPrefix(prefix string) error {
	if err := wire.CheckPrefix(prefix); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	return nil
}

// wholeMillis is ttl as Redis gets it (formatMillis): a lease believed to
// last a fraction of a millisecond longer would outlive its key.
func wholeMillis(ttl time.Duration) time.Duration { return ttl.Truncate(time.Millisecond) }

func validTTL(ttl time.Duration) error {
	switch {
	case ttl < time.Millisecond:
		return invalidf("TTL %v is below 1ms", ttl)
	case ttl > MaxTTL:
		return invalidf("TTL %v is above MaxTTL (%v)", ttl, MaxTTL)
	}
	return nil
}

// tokenSource hands out 128-bit crypto-random owner tokens. It reads
// randomness in blocks so that a lock costs no system call of its own.
type tokenSource struct {
	mu  sync.Mutex
	buf [16 * 256]byte
	off int
}

func (t *tokenSource) next() string {
	var b [16]byte
	t.mu.Lock()
	if t.off == 0 || t.off == len(t.buf) {
		_, _ = rand.Read(t.buf[:]) // never fails on supported platforms (crypto/rand contract)
		t.off = 0
	}
	copy(b[:], t.buf[t.off:t.off+16])
	t.off += 16
	t.mu.Unlock()
	return base64.RawURLEncoding.EncodeToString(b[:])
}
