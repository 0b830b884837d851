package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/dlock-go/dlock/internal/wire"
	"github.com/redis/go-redis/v9"
)

func init() {
	register(command{
		name:    "status",
		summary: "show a lock's holder, fence, remaining TTL and waiting clients",
		run:     runStatus,
	})
}

// inspectTimeout bounds the Redis round trips of status, list (per batch)
// and unlock.
const inspectTimeout = 10 * time.Second

const statusUsage = `Usage: dlock status NAME [flags]

Shows what Redis holds for the lock NAME: its type, whether it is held, the
holder's owner token, the fence (the last one granted: the holder's while
held), the remaining TTL and who waits for it. It only reads.

Types: mutex; semaphore; rwmutex; another dlock primitive's name (its
details are not shown by this version); foreign (the key holds something
dlock did not write); none (no key: the lock is free and its fence counter
was reclaimed after the idle period, or it was never taken).

States: held; free (released: the key is kept for the idle period so that
fences keep increasing); unknown (not a lock this version knows).

A semaphore or rwmutex is held while one of its holdings (each its own
lease) is live; it shows those holdings: the permits they hold out of the
size (semaphore), or its readers or writer (rwmutex). A holding whose lease
ran out is not shown, even before a lock call gives its permits back.

TTL: while held, the lease left (for a semaphore or rwmutex, that of the
holding that ends last); while free, the time until the idle key and its
fence counter are reclaimed. In --json, ttl_ms is -1 for a key without
expiry and -2 for no key.

Waiting: waiting_clients counts the dlock clients (processes, usually)
with callers waiting for the lock, in any mode. in_line counts the places
in the lock's line at Redis whose waiter still keeps them: one per Fair
waiter (dlock run --fair), semaphore or rwmutex waiter, and one per client
waiting in default mode (its first caller; the others wait behind it inside
that client). An rwmutex's line is split into waiting_readers and
waiting_writers.

Quorum mode (3 or more --redis masters): the lock as the masters hold it
together, then each master's view. States: held (a majority holds it for
one owner), partial (some hold it, but no majority for one owner: an
acquire under way, or the grants of one that failed, which expire at their
TTL), free, unknown. ttl is the lease left on a majority. Each master shows
what it holds (the owner token's first characters, the fence, the TTL) and
whether it votes: a master whose data is younger than --restart-delay does
not (its epoch key, PREFIX + "epoch", says when its data began; a master
without one gets it from its uptime at a client's first request). --json
gives the same, each master's view in per_master.

Examples:

  dlock status nightly-backup
  dlock status --json deploy-web | jq -r .token
  dlock status --redis redis://redis.internal:6379/2 --prefix jobs: report
  dlock status --redis redis://r1:6379,redis://r2:6379,redis://r3:6379 job

Exit codes: 0 ok (whatever the state), 64 usage error, 69 Redis unavailable
(quorum mode: fewer than a majority of the masters answer, after showing
what they do), 1 any other error.

Flags:
`

// lockInfo is what status and list report about one lock key.
type lockInfo struct {
	Name string `json:"name"`
	Key  string `json:"key"`
	// Type is "mutex", the kind of another dlock primitive (its hash's k
	// field), "foreign" or "none".
	Type string `json:"type"`
	// RedisType is the key's Redis type when Type is "foreign".
	RedisType string `json:"redis_type,omitempty"`
	// State is "held", "free" or "unknown". A semaphore or rwmutex is held
	// while one of its holdings' leases is live.
	State string `json:"state"`
	Token string `json:"token,omitempty"`
	Fence uint64 `json:"fence,omitempty"`
	// TTLMillis is, while held, the lease left (for a semaphore or
	// rwmutex, that of the holding that ends last); while free, the key's
	// PTTL: the idle time left until the key and its fence counter are
	// reclaimed. -1: a key without expiry; -2: no key.
	TTLMillis int64 `json:"ttl_ms"`
	// WaitingClients counts the dlock clients (processes, usually) that
	// have callers waiting for the lock: the subscribers of its wake-up
	// channel.
	WaitingClients int64 `json:"waiting_clients"`
	// InLine counts the live places in the lock's line at Redis (key
	// PREFIX{NAME}:q): one per Fair, semaphore and rwmutex waiter, and one
	// per client waiting in default mode (its first waiter; the others wait
	// behind it inside that client). A place whose waiter stopped keeping
	// it is not counted.
	InLine int64 `json:"in_line"`
	// WaitingReaders and WaitingWriters split an rwmutex's line.
	WaitingReaders int64 `json:"waiting_readers,omitempty"`
	WaitingWriters int64 `json:"waiting_writers,omitempty"`
	// Holders counts the live holdings of a semaphore or rwmutex (each its
	// own lease); one whose lease ran out is not counted.
	Holders int64 `json:"holders,omitempty"`
	// PermitsHeld and Size: the permits a semaphore's live holdings hold,
	// and its size.
	PermitsHeld int64 `json:"permits_held,omitempty"`
	Size        int64 `json:"size,omitempty"`
	// Mode of a held rwmutex: "read" or "write".
	Mode string `json:"mode,omitempty"`
}

// inspectFlags are the flags status, list and unlock share.
type inspectFlags struct {
	redisURLs *[]string
	tls       *tlsFiles
	prefix    *string
	json      *bool
}

// newInspect starts an inspecting command (status, list, unlock, leader):
// its flag set with the flags they share, and usageErr, which reports a
// usage error the way they all do.
func newInspect(name string, stderr io.Writer) (*flag.FlagSet, inspectFlags, func(error) int) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	usageErr := func(err error) int {
		fmt.Fprintf(stderr, "%s: %v (see %s -h)\n", name, err, name)
		return exitUsage
	}
	return fs, addInspectFlags(fs), usageErr
}

// parseInspect parses an inspecting command's arguments; ok false: exit
// with code (at -h, or after reporting a usage error).
func parseInspect(fs *flag.FlagSet, args []string, usage string, stdout io.Writer, usageErr func(error) int) (pos []string, code int, ok bool) {
	pos, err := parseInterleaved(fs, args)
	if help, err := usageOrHelp(err, fs, usage, stdout); help {
		return nil, exitOK, false
	} else if err != nil {
		return nil, usageErr(err), false
	}
	return pos, 0, true
}

func addInspectFlags(fs *flag.FlagSet) inspectFlags {
	fl := inspectFlags{redisURLs: new([]string)}
	fs.Var(urlsFlag{fl.redisURLs}, "redis", redisURLHelp)
	fl.tls = addTLSFlags(fs)
	fl.prefix = fs.String("prefix", "dlock:", "key `prefix` of the locks (the library's WithPrefix)")
	fl.json = fs.Bool("json", false, "print JSON instead of text")
	return fl
}

// targets parses the prefix and the servers the flags name: one, or a
// quorum's masters. On failure it reports the error and returns a usage
// exit code and no targets.
func (fl inspectFlags) targets(stderr io.Writer, cmd string) ([]*redisTarget, int) {
	if err := wire.CheckPrefix(*fl.prefix); err != nil {
		fmt.Fprintf(stderr, "%s: %v (see %s -h)\n", cmd, err, cmd)
		return nil, exitUsage
	}
	targets, err := parseRedisTargets(resolveRedisURLs(*fl.redisURLs), fl.tls)
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v (see %s -h)\n", cmd, err, cmd)
		return nil, exitUsage
	}
	return targets, 0
}

// connectOne reaches target, one server. On failure it reports the error
// and returns the exit code (usage or unavailable) and no client.
func connectOne(ctx context.Context, target *redisTarget, stderr io.Writer, cmd string) (redis.UniversalClient, int) {
	rdb, err := target.connect(ctx)
	if err != nil {
		return nil, reportRedisErr(ctx, stderr, cmd, err)
	}
	return rdb, 0
}

// oneName returns the one lock NAME among the positional arguments pos,
// checked; hint follows the complaint about an extra argument.
func oneName(pos []string, hint string) (string, error) {
	switch {
	case len(pos) == 0:
		return "", errors.New("missing the lock NAME")
	case len(pos) > 1:
		return "", fmt.Errorf("unexpected argument %q (%s)", pos[1], hint)
	}
	return pos[0], checkName(pos[0])
}

// runStatus is "dlock status".
func runStatus(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, fl, usageErr := newInspect("dlock status", stderr)
	var restartDelay time.Duration
	restartDelayVar(fs, &restartDelay)
	pos, code, ok := parseInspect(fs, args, statusUsage, stdout, usageErr)
	if !ok {
		return code
	}
	name, err := oneName(pos, "one lock NAME; dlock list shows many")
	if err != nil {
		return usageErr(err)
	}
	targets, code := fl.targets(stderr, "dlock status")
	if targets == nil {
		return code
	}
	if err := quorumOnly(fs, targets, "restart-delay"); err != nil {
		return usageErr(err)
	}
	if len(targets) > 1 {
		return statusQuorum(ctx, targets, fl, name, restartDelay, stdout, stderr)
	}
	rdb, code := connectOne(ctx, targets[0], stderr, "dlock status")
	if rdb == nil {
		return code
	}
	defer rdb.Close()

	key := wire.HashKey(*fl.prefix, name)
	ictx, cancel := context.WithTimeout(ctx, inspectTimeout)
	defer cancel()
	node, err := nodeFor(ictx, rdb, key)
	if err != nil {
		return reportRedisErr(ctx, stderr, "dlock status", err)
	}
	infos, err := inspect(ictx, node, *fl.prefix, []string{key})
	if err != nil {
		return reportRedisErr(ctx, stderr, "dlock status", err)
	}
	info := infos[0]
	if *fl.json {
		return writeJSON(stdout, stderr, "dlock status", info)
	}
	writeStatus(stdout, info)
	return exitOK
}

// nodeFor returns the client that serves key: rdb itself, or on a Cluster
// the master of key's slot (pub/sub counts are per shard).
func nodeFor(ctx context.Context, rdb redis.UniversalClient, key string) (redis.Cmdable, error) {
	if c, ok := rdb.(*redis.ClusterClient); ok {
		return c.MasterForKey(ctx, key)
	}
	return rdb, nil
}

// inspect reads keys (all served by node) in two pipelined round trips:
// TYPE, HMGET, PTTL, the wake-up channel's subscribers and the line's
// length of each key, with the server's clock; then, for the semaphores and
// rwmutexes and the locks with someone in line, their holdings and
// waiters, so that leases and places that ran out are told from live ones.
func inspect(ctx context.Context, node redis.Cmdable, prefix string, keys []string) ([]lockInfo, error) {
	type cmds struct {
		typ   *redis.StatusCmd
		hash  *redis.SliceCmd
		pttl  *redis.IntCmd
		subs  *redis.MapStringIntCmd // SUBSCRIBE: clients of a server without sharded pub/sub
		ssubs *redis.MapStringIntCmd // SSUBSCRIBE
		line  *redis.IntCmd
	}
	cs := make([]cmds, len(keys))
	var clock *redis.TimeCmd
	_, err := node.Pipelined(ctx, func(p redis.Pipeliner) error {
		clock = p.Time(ctx)
		for i, k := range keys {
			cs[i] = cmds{
				typ:   p.Type(ctx, k),
				hash:  p.HMGet(ctx, k, wire.FieldOwner, wire.FieldFence, wire.FieldKind, wire.FieldSize),
				pttl:  redis.NewIntCmd(ctx, "pttl", k),
				subs:  p.PubSubNumSub(ctx, k),
				ssubs: p.PubSubShardNumSub(ctx, k),
				line:  p.LLen(ctx, k+wire.SuffixLine),
			}
			_ = p.Process(ctx, cs[i].pttl)
		}
		return nil
	})
	// HMGET (and LLEN) fail with WRONGTYPE on a foreign key, and a server
	// without sharded pub/sub (Redis before 7.0, miniredis) has no PUBSUB
	// SHARDNUMSUB; only the other commands' errors matter.
	if err != nil && !strings.HasPrefix(err.Error(), "WRONGTYPE") && !noShardNumSub(err) {
		return nil, err
	}
	if err := clock.Err(); err != nil {
		return nil, err
	}
	now := clock.Val().UnixMilli()
	infos := make([]lockInfo, len(keys))
	for i, k := range keys {
		c := cs[i]
		for _, cmd := range []redis.Cmder{c.typ, c.pttl, c.subs} {
			if err := cmd.Err(); err != nil {
				return nil, err
			}
		}
		if err := c.ssubs.Err(); err != nil && !noShardNumSub(err) {
			return nil, err
		}
		// A client waits subscribed with the kind of pub/sub the server
		// has (see docs/PROTOCOL.md), so it is counted once.
		waiting := c.subs.Val()[k] + c.ssubs.Val()[k]
		info := lockInfo{Name: nameOfKey(prefix, k), Key: k, TTLMillis: c.pttl.Val(), WaitingClients: waiting}
		typ := c.typ.Val()
		var o, f, kind, size string
		var hasO, hasF, hasK bool
		if typ == "hash" && c.hash.Err() == nil {
			v := c.hash.Val()
			o, hasO = v[0].(string)
			f, hasF = v[1].(string)
			kind, hasK = v[2].(string)
			size, _ = v[3].(string)
		}
		switch {
		case typ == "none" || (typ == "hash" && !hasO && !hasF && !hasK && info.TTLMillis == -2):
			// No key (or it expired between the commands).
			info.Type, info.State, info.TTLMillis = "none", "free", -2
		case typ != "hash":
			info.Type, info.RedisType, info.State = "foreign", typ, "unknown"
		case hasK && (kind == wire.KindSemaphore || kind == wire.KindRWMutex):
			info.Type, info.State = kind, "free"
			info.Fence, _ = strconv.ParseUint(f, 10, 64)
			if kind == wire.KindSemaphore {
				info.Size, _ = strconv.ParseInt(size, 10, 64)
			}
		case hasK:
			info.Type, info.State = kind, "unknown"
			info.Fence, _ = strconv.ParseUint(f, 10, 64)
		case !hasF:
			info.Type, info.RedisType, info.State = "foreign", typ, "unknown"
		default:
			info.Type, info.State = wire.KindMutex, "free"
			info.Fence, _ = strconv.ParseUint(f, 10, 64)
			if hasO {
				info.State, info.Token = "held", o
			}
		}
		infos[i] = info
	}

	// The second round trip, for the keys whose holdings or line need it.
	type details struct {
		hash    *redis.MapStringStringCmd // a semaphore's or rwmutex's hash
		holders *redis.ZSliceCmd          // token -> lease deadline (ms)
		waiters *redis.MapStringStringCmd // token -> "deadline_ms,..."
	}
	ds := make([]details, len(keys))
	need := false
	_, err = node.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, k := range keys {
			info := &infos[i]
			if info.Type == wire.KindSemaphore || info.Type == wire.KindRWMutex {
				ds[i].hash = p.HGetAll(ctx, k)
				ds[i].holders = p.ZRangeWithScores(ctx, k+wire.SuffixHolders, 0, -1)
				need = true
			}
			if cs[i].line.Err() == nil && cs[i].line.Val() > 0 && info.State != "unknown" {
				ds[i].waiters = p.HGetAll(ctx, k+wire.SuffixWaiters)
				need = true
			}
		}
		return nil
	})
	if !need {
		return infos, nil
	}
	if err != nil && !strings.HasPrefix(err.Error(), "WRONGTYPE") {
		return nil, err
	}
	for i := range infos {
		if d := ds[i]; d.holders != nil && d.holders.Err() == nil && d.hash.Err() == nil {
			liveHoldings(&infos[i], now, d.hash.Val(), d.holders.Val())
		}
		if d := ds[i]; d.waiters != nil && d.waiters.Err() == nil {
			liveWaiters(&infos[i], now, d.waiters.Val())
		}
	}
	return infos, nil
}

// noShardNumSub reports the reply of a server that has no PUBSUB
// SHARDNUMSUB (Redis before 7.0: "ERR Unknown subcommand or wrong number of
// arguments"; miniredis: "ERR unknown subcommand").
func noShardNumSub(err error) bool {
	return strings.Contains(strings.ToLower(err.Error()), "unknown subcommand")
}

// liveHoldings fills in a semaphore's or rwmutex's state from its hash and
// its holders (token -> lease deadline, server ms): only holdings whose
// lease has not run out at now count. The scripts give back the permits of
// a holding that ran out only when a lock call needs them, so Redis's own
// count of permits held may still include them.
func liveHoldings(info *lockInfo, now int64, hash map[string]string, holders []redis.Z) {
	var last int64
	for _, z := range holders {
		deadline := int64(z.Score)
		token, _ := z.Member.(string)
		v, ok := hash[wire.FieldHolding+token]
		if deadline <= now || !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.SplitN(v, ",", 2)[0], 10, 64)
		info.Holders++
		info.PermitsHeld += n
		last = max(last, deadline)
	}
	if info.Holders == 0 {
		info.PermitsHeld = 0
		return
	}
	info.State = "held"
	info.TTLMillis = last - now
	if info.Type == wire.KindRWMutex {
		if info.PermitsHeld >= wire.RWWriter {
			info.Mode = "write"
		} else {
			info.Mode = "read"
		}
		info.PermitsHeld = 0 // an rwmutex has readers or a writer, not permits
	}
}

// liveWaiters counts the places in line whose waiter keeps them (the
// entry's deadline, server ms, is after now); an rwmutex's by kind: a
// waiter wanting every permit is a writer.
func liveWaiters(info *lockInfo, now int64, waiters map[string]string) {
	for _, v := range waiters {
		fields := strings.SplitN(v, ",", 4)
		deadline, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil || deadline <= now {
			continue
		}
		info.InLine++
		if info.Type == wire.KindRWMutex && len(fields) == 4 {
			if n, _ := strconv.ParseInt(fields[2], 10, 64); n >= wire.RWWriter {
				info.WaitingWriters++
			} else {
				info.WaitingReaders++
			}
		}
	}
}

// whatKeyIs says what the key of lock name holds instead of a dlock mutex,
// as status reads it ("Redis key "dlock:{x}" is a list, not a dlock
// mutex"), or, if it cannot be read, fallback.
func whatKeyIs(ctx context.Context, rdb redis.UniversalClient, prefix, name, fallback string) string {
	key := wire.HashKey(prefix, name)
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), inspectTimeout)
	defer cancel()
	if node, nerr := nodeFor(ictx, rdb, key); nerr == nil {
		if infos, ierr := inspect(ictx, node, prefix, []string{key}); ierr == nil {
			switch i := infos[0]; {
			case i.Type == "foreign" && i.RedisType == "hash":
				return fmt.Sprintf("Redis key %q is a hash that dlock did not write, not a dlock mutex", key)
			case i.Type == "foreign":
				return fmt.Sprintf("Redis key %q is a %s, not a dlock mutex", key, i.RedisType)
			case i.Type != wire.KindMutex && i.Type != "none":
				return fmt.Sprintf("Redis key %q is a dlock %s, not a mutex", key, i.Type)
			}
		}
	}
	return fallback
}

// nameOfKey is the lock name of a lock key, or the key itself if it is
// not one.
func nameOfKey(prefix, key string) string {
	if name, role, ok := wire.ParseKey(prefix, key); ok && role == wire.RoleHash {
		return name
	}
	return key
}

// writeStatus prints one lock as aligned "field value" lines.
func writeStatus(w io.Writer, i lockInfo) {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "lock\t%s\n", textSafe(i.Name))
	fmt.Fprintf(tw, "key\t%s\n", textSafe(i.Key))
	typ := i.Type
	switch i.Type {
	case "foreign":
		typ = fmt.Sprintf("foreign (a Redis %s that is not a dlock lock)", i.RedisType)
	case "none":
		typ = "none (no key: the lock is free)"
	}
	fmt.Fprintf(tw, "type\t%s\n", typ)
	fmt.Fprintf(tw, "state\t%s\n", i.State)
	if i.Token != "" {
		fmt.Fprintf(tw, "token\t%s\n", textSafe(i.Token))
	}
	if i.Fence != 0 {
		fmt.Fprintf(tw, "fence\t%d\n", i.Fence)
	}
	switch {
	case i.Type == "semaphore":
		fmt.Fprintf(tw, "permits\t%d of %d held by %s\n", i.PermitsHeld, i.Size, plural(i.Holders, "holder"))
	case i.Type == "rwmutex" && i.Mode == "write":
		fmt.Fprintf(tw, "holders\ta writer\n")
	case i.Type == "rwmutex":
		fmt.Fprintf(tw, "holders\t%s\n", plural(i.Holders, "reader"))
	}
	if i.Type != "none" {
		ttl := formatTTL(i.TTLMillis)
		switch {
		case i.State == "held" && i.Holders > 1:
			ttl += " (lease left of the holding that ends last)"
		case i.State == "held":
			ttl += " (lease left)"
		case i.State == "free":
			ttl += " (until the idle key and its fence counter are reclaimed)"
		}
		fmt.Fprintf(tw, "ttl\t%s\n", ttl)
	}
	fmt.Fprintf(tw, "waiting\t%s\n", waitingText(i))
	_ = tw.Flush()
}

// textSafe returns s as it is if every character of it is printable (a
// space included), else quoted with Go's escapes (strconv.Quote). Names,
// keys and tokens come from Redis or the command line: a "\n" in them
// would forge a line of output, and an escape sequence would reach the
// terminal. JSON output escapes them by itself.
func textSafe(s string) string {
	for _, r := range s {
		if r == utf8.RuneError || (!unicode.IsPrint(r) && r != ' ') {
			return strconv.Quote(s)
		}
	}
	return s
}

// waitingText says who waits: the clients with callers waiting, and the
// live places in line at Redis (an rwmutex's by kind).
func waitingText(i lockInfo) string {
	if i.WaitingClients == 0 && i.InLine == 0 {
		return "nobody"
	}
	s := plural(i.WaitingClients, "client") + " with callers waiting"
	if i.InLine > 0 {
		s += fmt.Sprintf("; %d in line at Redis", i.InLine)
		if i.WaitingReaders+i.WaitingWriters > 0 {
			s += fmt.Sprintf(" (%s, %s)", plural(i.WaitingReaders, "reader"), plural(i.WaitingWriters, "writer"))
		}
	}
	return s
}

// plural is "1 holder", "2 holders", "0 holders".
func plural(n int64, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// formatTTL renders a PTTL reply.
func formatTTL(ms int64) string {
	switch {
	case ms == -1:
		return "no expiry"
	case ms < 0:
		return "-"
	}
	return (time.Duration(ms) * time.Millisecond).String()
}

// writeJSON prints v as indented JSON.
func writeJSON(stdout, stderr io.Writer, cmd string, v any) int {
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		fmt.Fprintf(stderr, "%s: writing JSON: %v\n", cmd, err)
		return exitFailed
	}
	return exitOK
}

// reportRedisErr prints one line for an error talking to Redis and returns
// the exit code: 130 if interrupted, 69 if Redis is unreachable, else 1.
func reportRedisErr(ctx context.Context, stderr io.Writer, cmd string, err error) int {
	switch {
	case ctx.Err() != nil:
		fmt.Fprintf(stderr, "%s: interrupted\n", cmd)
		return exitInterrupted
	case connectExitCode(err) == exitUsage:
		fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
		return exitUsage
	case redisDown(err):
		fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
		return exitUnavailable
	default:
		fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
		return exitFailed
	}
}
