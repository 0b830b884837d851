// This file turns --redis (or $DLOCK_REDIS_URL, $REDIS_URL) into a go-redis
// client for the commands that work on a user's server: run, status, list
// and unlock.

package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// defaultRedisURL is the server used when neither --redis nor the
// environment names one.
const defaultRedisURL = "redis://127.0.0.1:6379"

// redisPingTimeout bounds the reachability check made before a command
// touches any lock, so that an unreachable server is reported as such (exit
// 69) instead of as a lock that could not be obtained.
const redisPingTimeout = 5 * time.Second

// redisURLHelp documents --redis in every command's flag list.
const redisURLHelp = "Redis `URL`: redis://[user:pass@]host:port[/db], rediss:// (TLS, see --tls-ca; ?skip_verify=true skips certificate checks), unix:///path.sock, " +
	"redis+cluster://host:port?addr=host2:port2, redis+sentinel://host:port?master_name=NAME (user:pass@ authenticates to the sentinels; " +
	"?password= to the master); default $DLOCK_REDIS_URL, then $REDIS_URL, then " + defaultRedisURL + ". " +
	"Quorum mode: 3 or more independent masters, by repeating --redis or as one comma-separated list (URL,URL,URL; also in the variables)"

// redisTarget is a parsed server address: it makes clients and says where
// they connect, for error messages.
type redisTarget struct {
	// display is the URL with its secrets replaced (redactURL): the only
	// form in which a URL is ever printed.
	display   string
	newClient func() redis.UniversalClient
	// single holds the options of a single server (redis://, rediss://,
	// unix://); nil for a Cluster or Sentinel.
	single *redis.Options
	// tls is the TLS configuration of the client's options (a rediss://
	// URL), which the TLS flags complete; nil without TLS.
	tls *tls.Config
	// master names the master the URL reaches, to find two URLs of one
	// quorum that are the same server: network and address, or a
	// Sentinel's master name and sentinels; "" for a Cluster, which cannot
	// be a quorum master.
	master string
}

// urlsFlag is --redis: one URL, or the masters of a quorum, given by
// repeating the flag or as one comma-separated list (splitURLs). It never
// refuses a value, so that the flag package never prints one (it may hold a
// password): parseRedisTargets checks them.
type urlsFlag struct{ urls *[]string }

func (f urlsFlag) String() string { return "" }

func (f urlsFlag) Set(s string) error {
	if s != "" { // --redis "" leaves the choice to the environment, as before
		*f.urls = append(*f.urls, splitURLs(s)...)
	}
	return nil
}

// resolveRedisURLs returns the URLs of --redis, else those of
// $DLOCK_REDIS_URL, else of $REDIS_URL, else defaultRedisURL. A variable
// may hold a comma-separated list, as --redis may.
func resolveRedisURLs(flagURLs []string) []string {
	if len(flagURLs) > 0 {
		return flagURLs
	}
	for _, v := range []string{os.Getenv("DLOCK_REDIS_URL"), os.Getenv("REDIS_URL")} {
		if v != "" {
			return splitURLs(v)
		}
	}
	return []string{defaultRedisURL}
}

// splitURLs splits a list of server URLs, "URL,URL,...", at each comma that
// a scheme and "://" follow (spaces around the comma are dropped). A comma
// anywhere else, in a password or a query value, stays in its URL, so that
// a value that was one URL before lists existed still is.
func splitURLs(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] != ',' {
			continue
		}
		next := strings.TrimLeft(s[i+1:], " ")
		if hasScheme(next) {
			out = append(out, strings.TrimSpace(s[start:i]))
			start = len(s) - len(next)
			i = start - 1
		}
	}
	return append(out, strings.TrimSpace(s[start:]))
}

// hasScheme reports whether s begins with a URL scheme and "://".
func hasScheme(s string) bool {
	scheme, _, ok := strings.Cut(s, "://")
	if !ok || scheme == "" || !isLetter(scheme[0]) {
		return false
	}
	for i := range len(scheme) {
		if c := scheme[i]; !isLetter(c) && (c < '0' || c > '9') && c != '+' && c != '-' && c != '.' {
			return false
		}
	}
	return true
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

// parseRedisTargets parses the servers a command works on: one URL (a
// server, a Cluster or a Sentinel-managed master), or 3 or more, the
// independent masters of a quorum, and gives the TLS ones the TLS flags'
// certificates. Two URLs, the same server twice, or a Cluster among a
// quorum's masters are refused.
func parseRedisTargets(urls []string, tf *tlsFiles) ([]*redisTarget, error) {
	targets := make([]*redisTarget, len(urls))
	for i, u := range urls {
		t, err := parseRedisTarget(u)
		if err != nil {
			return nil, err
		}
		targets[i] = t
	}
	if err := tf.apply(targets); err != nil {
		return nil, err
	}
	if len(targets) == 1 {
		return targets, nil
	}
	seen := map[string]*redisTarget{}
	for _, t := range targets {
		if t.master == "" {
			return nil, fmt.Errorf("--redis %q: a Redis Cluster cannot be a quorum master: quorum mode takes independent masters (redis://, rediss://, unix:// or redis+sentinel://)", t.display)
		}
		if o := seen[t.master]; o != nil {
			return nil, fmt.Errorf("--redis %q and %q are the same server (%s): a quorum's masters must be independent", o.display, t.display, t.master)
		}
		seen[t.master] = t
	}
	if len(targets) == 2 {
		return nil, fmt.Errorf("--redis given 2 servers (%s, %s): quorum mode needs at least 3 independent masters (a majority of 2 is both, so either one down would stop every lock); give one server, or 3 or more (an odd number, such as 5)", targets[0].display, targets[1].display)
	}
	return targets, nil
}

// quorumOnly refuses the flags that apply to quorum mode alone, among
// those set, when the command has one server.
func quorumOnly(fs *flag.FlagSet, targets []*redisTarget, names ...string) error {
	if len(targets) > 1 {
		return nil
	}
	var err error
	fs.Visit(func(fl *flag.Flag) {
		if err == nil && slices.Contains(names, fl.Name) {
			err = fmt.Errorf("--%s %s applies to quorum mode only (3 or more --redis masters), not to one server", fl.Name, fl.Value)
		}
	})
	return err
}

// parseRedisTarget parses a server URL. redis://, rediss:// and unix://
// name one server; a "+cluster" or "+sentinel" suffix on the scheme
// (redis+cluster://, rediss+sentinel://...) selects a Redis Cluster (seed
// nodes in addr= parameters) or a Sentinel-managed master (sentinels in
// addr=, the master in master_name=). Errors never show the password.
func parseRedisTarget(raw string) (*redisTarget, error) {
	t := &redisTarget{display: redactURL(raw)}
	bad := func(err error) error { return fmt.Errorf("--redis %q: %s", t.display, redactErr(err, raw)) }
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, fmt.Errorf("--redis %q: not a URL (want e.g. %s)", t.display, defaultRedisURL)
	}
	base, mode, _ := strings.Cut(scheme, "+")
	plain := base + "://" + rest
	if first, second, ok := strings.Cut(hostPart(rest), ","); ok {
		// host1,host2: a list, but splitURLs splits only whole URLs.
		second, _, _ = strings.Cut(second, ",")
		return nil, fmt.Errorf("--redis %q: a list of servers names each by its whole URL: %s://%s,%s://%s", t.display, scheme, first, scheme, second)
	}
	switch {
	case mode == "" && (base == "redis" || base == "rediss" || base == "unix"):
		o, err := redis.ParseURL(raw)
		if err == nil && o.Network == "tcp" {
			err = checkAddrs(o.Addr)
		}
		if err == nil {
			err = checkDB(o.DB)
		}
		if err != nil {
			return nil, bad(err)
		}
		o.DisableIdentity = true // Redis before 7.2 rejects CLIENT SETINFO
		t.single, t.tls = o, o.TLSConfig
		t.master = o.Network + " " + o.Addr
		t.newClient = func() redis.UniversalClient { return redis.NewClient(o) }
	case mode == "cluster" && (base == "redis" || base == "rediss"):
		// go-redis's cluster URLs know no skip_verify (its other URLs do).
		plain, skipVerify, err := cutSkipVerify(plain)
		if err != nil {
			return nil, bad(err)
		}
		o, err := redis.ParseClusterURL(plain)
		if err == nil {
			err = checkAddrs(o.Addrs...)
		}
		if err == nil {
			if p := urlPath(plain); p != "" && p != "/" {
				err = fmt.Errorf("a Cluster has only database 0; remove the path %q", p)
			}
		}
		if err == nil && skipVerify {
			if o.TLSConfig == nil {
				err = errors.New("skip_verify applies to rediss+cluster:// (TLS) only")
			} else {
				o.TLSConfig.InsecureSkipVerify = true
			}
		}
		if err != nil {
			return nil, bad(err)
		}
		o.DisableIdentity = true
		t.tls = o.TLSConfig
		t.newClient = func() redis.UniversalClient { return redis.NewClusterClient(o) }
	case mode == "sentinel" && (base == "redis" || base == "rediss"):
		o, err := redis.ParseFailoverURL(plain)
		if err == nil {
			err = checkAddrs(o.SentinelAddrs...)
		}
		if err == nil {
			err = checkDB(o.DB)
		}
		if err == nil && o.MasterName == "" {
			err = errors.New("a Sentinel URL needs ?master_name=NAME")
		}
		if err != nil {
			return nil, bad(err)
		}
		o.DisableIdentity = true
		t.tls = o.TLSConfig
		t.master = fmt.Sprintf("Sentinel master %s at %s", o.MasterName, strings.Join(slices.Sorted(slices.Values(o.SentinelAddrs)), ","))
		t.newClient = func() redis.UniversalClient { return redis.NewFailoverClient(o) }
	default:
		return nil, fmt.Errorf("--redis %q: unknown scheme %q (want redis, rediss, unix, redis+cluster or redis+sentinel)", t.display, scheme)
	}
	return t, nil
}

// checkAddrs refuses a host:port whose port is not a TCP port, which would
// otherwise surface as an unreachable server.
func checkAddrs(addrs ...string) error {
	for _, a := range addrs {
		_, port, err := net.SplitHostPort(a)
		if err != nil {
			return err
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("port %q is not a TCP port (1..65535)", port)
		}
	}
	return nil
}

// checkDB refuses a negative database, which go-redis would take for 0.
func checkDB(db int) error {
	if db < 0 {
		return fmt.Errorf("database %d is negative", db)
	}
	return nil
}

// hostPart returns the host part of rest, a URL after its "scheme://":
// without the user information, path, query and fragment.
func hostPart(rest string) string {
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		rest = rest[at+1:]
	}
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		rest = rest[:i]
	}
	return rest
}

// urlPath returns the path of a URL, or "" if it has none.
func urlPath(raw string) string {
	_, rest, _ := strings.Cut(raw, "://")
	rest, _, _ = strings.Cut(rest, "#")
	rest, _, _ = strings.Cut(rest, "?")
	if i := strings.IndexByte(rest, '/'); i >= 0 {
		return rest[i:]
	}
	return ""
}

// cutSkipVerify removes the skip_verify parameter from a URL and returns
// its value.
func cutSkipVerify(raw string) (string, bool, error) {
	head, query, ok := strings.Cut(raw, "?")
	if !ok {
		return raw, false, nil
	}
	var kept []string
	skip := false
	for _, kv := range strings.Split(query, "&") {
		k, v, _ := strings.Cut(kv, "=")
		if k != "skip_verify" {
			kept = append(kept, kv)
			continue
		}
		b, err := strconv.ParseBool(v)
		if err != nil {
			return "", false, fmt.Errorf("skip_verify=%q is not true or false", v)
		}
		skip = b
	}
	if len(kept) == 0 {
		return head, skip, nil
	}
	return head + "?" + strings.Join(kept, "&"), skip, nil
}

// redacted is what a secret is replaced with in everything dlock prints.
const redacted = "xxxxx"

// redactURL returns raw with its secrets replaced by redacted: the
// password of the user information (as url.URL.Redacted does) and the
// value of every query parameter whose name contains "password". It works
// on text, so that a URL that does not parse is redacted too, and so is
// text that is not a URL at all (user:pass@host, without a scheme). In a
// list of URLs (splitURLs) each is redacted.
func redactURL(raw string) string {
	if urls := splitURLs(raw); len(urls) > 1 {
		for i, u := range urls {
			urls[i] = redactURL(u)
		}
		return strings.Join(urls, ",")
	}
	prefix, rest := cutScheme(raw)
	if user, _, host, ok := cutPassword(rest); ok {
		rest = user + redacted + host
	}
	head, query, hasQuery := strings.Cut(rest, "?")
	if !hasQuery {
		return prefix + head
	}
	query, frag, hasFrag := strings.Cut(query, "#")
	params := strings.Split(query, "&")
	for i, kv := range params {
		k, _, ok := strings.Cut(kv, "=")
		if dk, err := url.QueryUnescape(k); err == nil {
			k = dk
		}
		if ok && strings.Contains(strings.ToLower(k), "password") {
			params[i] = kv[:strings.IndexByte(kv, '=')] + "=" + redacted
		}
	}
	out := prefix + head + "?" + strings.Join(params, "&")
	if hasFrag {
		out += "#" + frag
	}
	return out
}

// cutScheme splits raw after its "scheme://", if it has one.
func cutScheme(raw string) (prefix, rest string) {
	if scheme, r, ok := strings.Cut(raw, "://"); ok {
		return scheme + "://", r
	}
	return "", raw
}

// cutPassword splits s, a URL after its "scheme://" (or text that is not a
// URL), around the password of its user information: the text between the
// first ':' and the last '@'. The last '@' of all, not the last before the
// path or query: a password holding an unescaped '@', '/', '?' or '#' is
// then cut whole (a query value holding '@' is taken for one too, and shown
// redacted: the safe mistake).
func cutPassword(s string) (user, password, host string, ok bool) {
	at := strings.LastIndexByte(s, '@')
	if at < 0 {
		return "", "", "", false
	}
	u, p, ok := strings.Cut(s[:at], ":")
	if !ok {
		return "", "", "", false
	}
	return u + ":", p, s[at:], true
}

// hasSecret reports whether the URL raw holds a password.
func hasSecret(raw string) bool { return redactURL(raw) != raw }

// redactErr is err's message with the URL raw, wherever it appears (a
// *url.Error quotes it whole), in its redacted form. A password holding an
// unescaped '/', '?' or '#' ends the URL's host early for the parsers,
// whose messages then quote pieces of it (a port, a truncated URL, an
// option's name): such an error is replaced by one that says what to fix.
func redactErr(err error, raw string) string {
	_, rest := cutScheme(raw)
	if _, pw, _, ok := cutPassword(rest); ok && strings.ContainsAny(pw, "/?#") {
		return "the password holds an unescaped '/', '?' or '#': percent-encode them (%2F, %3F, %23)"
	}
	msg := err.Error()
	var ue *url.Error
	if errors.As(err, &ue) {
		msg = strings.ReplaceAll(msg, ue.URL, redactURL(ue.URL))
	}
	return strings.ReplaceAll(msg, raw, redactURL(raw))
}

// connect makes a client and checks within redisPingTimeout that the server
// answers. A failure is explained by checkServer.
func (t *redisTarget) connect(ctx context.Context) (redis.UniversalClient, error) {
	rdb := t.newClient()
	if err := t.checkServer(ctx, rdb); err != nil {
		_ = rdb.Close()
		return nil, err
	}
	return rdb, nil
}

// checkServer sends PING through rdb, a client of t, within
// redisPingTimeout. A database the server does not have is a
// badTargetError (exit 64); any other failure, a refused connection or a
// rejected password, is an unreachableError (exit 69) that says what was
// attempted and, when a timeout hides it, the likely cause.
func (t *redisTarget) checkServer(ctx context.Context, rdb redis.UniversalClient) error {
	pctx, cancel := context.WithTimeout(ctx, redisPingTimeout)
	defer cancel()
	err := rdb.Ping(pctx).Err()
	switch {
	case err == nil:
		return nil
	case strings.Contains(err.Error(), "DB index is out of range"):
		return &badTargetError{url: t.display, err: t.noSuchDB(ctx, err)}
	case ctx.Err() == nil && (errors.Is(err, context.DeadlineExceeded) || isTimeout(err)):
		return &unreachableError{url: t.display, err: t.diagnoseTimeout(ctx)}
	}
	return &unreachableError{url: t.display, err: explainTLS(err, t.tls)}
}

// isTimeout reports a network timeout (go-redis's read and write timeouts).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// noSuchDB explains a SELECT the server refused, with the number of
// databases it has when it tells (CONFIG GET may be refused).
func (t *redisTarget) noSuchDB(ctx context.Context, err error) error {
	db := 0
	if t.single != nil {
		db = t.single.DB
	}
	has := "a server has 16 (0..15) unless its databases setting says otherwise"
	if t.single != nil {
		o := *t.single
		o.DB = 0
		c := redis.NewClient(&o)
		defer c.Close()
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		if v, cerr := c.ConfigGet(cctx, "databases").Result(); cerr == nil {
			if n, cerr := strconv.Atoi(v["databases"]); cerr == nil && n > 0 {
				has = fmt.Sprintf("this one has %d (0..%d)", n, n-1)
			}
		}
	}
	return fmt.Errorf("the server has no database %d (%v): %s; this is a usage error, not an outage", db, err, has)
}

// probeTimeout bounds each step of diagnoseTimeout's probe.
const probeTimeout = time.Second

// diagnoseTimeout explains a PING that got no answer in time: it connects
// once more without go-redis and sends a plain-text PING, to tell a server
// that speaks without TLS (when the URL asks for TLS) from one that
// accepts connections but answers nothing (frozen) and from an address
// where nothing accepts them.
func (t *redisTarget) diagnoseTimeout(ctx context.Context) error {
	limit := shortDuration(redisPingTimeout)
	if t.single == nil {
		return fmt.Errorf("no answer to PING within %s: the servers may be frozen or overloaded, or expect TLS (rediss+...)", limit)
	}
	o := t.single
	tls := o.TLSConfig != nil
	attempt := "no answer to PING within " + limit
	if tls {
		attempt = "no answer to the TLS handshake and PING within " + limit
	}
	d := net.Dialer{Timeout: probeTimeout}
	conn, err := d.DialContext(ctx, o.Network, o.Addr)
	if err != nil {
		return fmt.Errorf("%s; a new connection to %s failed too (%v): the host may be down, or a firewall drops the packets", attempt, o.Addr, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(probeTimeout))
	reply := make([]byte, 1)
	_, werr := conn.Write([]byte("PING\r\n"))
	_, rerr := io.ReadFull(conn, reply)
	switch {
	case werr == nil && rerr == nil && tls && (reply[0] == '+' || reply[0] == '-'):
		return fmt.Errorf("%s; the server answers without TLS: use redis:// instead of rediss://", attempt)
	case werr == nil && rerr == nil && !tls && (reply[0] == '+' || reply[0] == '-'):
		return fmt.Errorf("%s, though it answered a second connection at once: it was overloaded or paused for a while", attempt)
	case werr == nil && rerr == nil && !tls:
		return fmt.Errorf("%s; the server answered plain text with something else than Redis does: does it expect TLS (rediss://)?", attempt)
	case !tls && (errors.Is(rerr, io.EOF) || errors.Is(rerr, syscall.ECONNRESET)):
		return fmt.Errorf("%s; the server closes connections that send a plain PING: does it expect TLS (rediss://)?", attempt)
	}
	return fmt.Errorf("%s; the server accepts connections but answers nothing: it is frozen (stopped with SIGSTOP, or blocked by a long script or command) or overloaded", attempt)
}

// pingWithin reports whether the server answers PING within d.
func pingWithin(ctx context.Context, rdb redis.UniversalClient, d time.Duration) error {
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d)
	defer cancel()
	return rdb.Ping(pctx).Err()
}

// unreachableError is a server that did not answer PING.
type unreachableError struct {
	url string // redacted
	err error
}

func (e *unreachableError) Error() string {
	return fmt.Sprintf("cannot reach Redis at %s: %v", e.url, e.err)
}

func (e *unreachableError) Unwrap() error { return e.err }

// badTargetError is a server that answers but refuses what the URL asks
// of it: a usage error (exit 64).
type badTargetError struct {
	url string // redacted
	err error
}

func (e *badTargetError) Error() string {
	return fmt.Sprintf("--redis %q: %v", e.url, e.err)
}

func (e *badTargetError) Unwrap() error { return e.err }

// connectExitCode is the exit code for an error of connect: usage (64) for
// a badTargetError, else unavailable (69).
func connectExitCode(err error) int {
	var bt *badTargetError
	if errors.As(err, &bt) {
		return exitUsage
	}
	return exitUnavailable
}

// redisDown reports whether err looks like an unreachable server, a lost,
// refused or timed-out connection (exit 69) rather than a reply from the
// server.
func redisDown(err error) bool {
	var ne net.Error
	var ue *unreachableError
	return errors.As(err, &ue) || errors.As(err, &ne) || errors.Is(err, io.EOF) ||
		errors.Is(err, redis.ErrClosed) || errors.Is(err, context.DeadlineExceeded)
}

// parseInterleaved parses fs's flags from args, allowing them before,
// between and after positional arguments (dlock status NAME --json). A "--"
// ends the flags: everything after it is positional.
func parseInterleaved(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for range len(args) + 1 { // each round consumes at least one argument
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if consumed := len(args) - len(rest); consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos, args = append(pos, rest[0]), rest[1:]
	}
	return pos, nil
}
