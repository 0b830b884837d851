// This file turns --redis (or $DLOCK_REDIS_URL, $REDIS_URL) into a go-redis
// client for the commands that work on a user's server: run, status, list
// and unlock.

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
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
const redisURLHelp = "Redis `URL`: redis://[user:pass@]host:port[/db], rediss:// (TLS), unix:///path.sock, " +
	"redis+cluster://host:port?addr=host2:port2, redis+sentinel://host:port?master_name=NAME; " +
	"default $DLOCK_REDIS_URL, then $REDIS_URL, then " + defaultRedisURL

// redisTarget is a parsed server address: it makes clients and says where
// they connect, for error messages.
type redisTarget struct {
	url       string
	newClient func() redis.UniversalClient
}

// resolveRedisURL returns the flag's value, else $DLOCK_REDIS_URL, else
// $REDIS_URL, else defaultRedisURL.
func resolveRedisURL(flagValue string) string {
	for _, v := range []string{flagValue, os.Getenv("DLOCK_REDIS_URL"), os.Getenv("REDIS_URL")} {
		if v != "" {
			return v
		}
	}
	return defaultRedisURL
}

// parseRedisTarget parses a server URL. redis://, rediss:// and unix://
// name one server; a "+cluster" or "+sentinel" suffix on the scheme
// (redis+cluster://, rediss+sentinel://...) selects a Redis Cluster (seed
// nodes in addr= parameters) or a Sentinel-managed master (sentinels in
// addr=, the master in master_name=).
func parseRedisTarget(raw string) (*redisTarget, error) {
	scheme, rest, ok := strings.Cut(raw, "://")
	if !ok {
		return nil, fmt.Errorf("--redis %q: not a URL (want e.g. %s)", raw, defaultRedisURL)
	}
	base, mode, _ := strings.Cut(scheme, "+")
	plain := base + "://" + rest
	t := &redisTarget{url: raw}
	switch {
	case mode == "" && (base == "redis" || base == "rediss" || base == "unix"):
		o, err := redis.ParseURL(raw)
		if err != nil {
			return nil, fmt.Errorf("--redis %q: %v", raw, err)
		}
		o.DisableIdentity = true // Redis before 7.2 rejects CLIENT SETINFO
		t.newClient = func() redis.UniversalClient { return redis.NewClient(o) }
	case mode == "cluster" && (base == "redis" || base == "rediss"):
		o, err := redis.ParseClusterURL(plain)
		if err != nil {
			return nil, fmt.Errorf("--redis %q: %v", raw, err)
		}
		o.DisableIdentity = true
		t.newClient = func() redis.UniversalClient { return redis.NewClusterClient(o) }
	case mode == "sentinel" && (base == "redis" || base == "rediss"):
		o, err := redis.ParseFailoverURL(plain)
		if err != nil {
			return nil, fmt.Errorf("--redis %q: %v", raw, err)
		}
		if o.MasterName == "" {
			return nil, fmt.Errorf("--redis %q: a Sentinel URL needs ?master_name=NAME", raw)
		}
		o.DisableIdentity = true
		t.newClient = func() redis.UniversalClient { return redis.NewFailoverClient(o) }
	default:
		return nil, fmt.Errorf("--redis %q: unknown scheme %q (want redis, rediss, unix, redis+cluster or redis+sentinel)", raw, scheme)
	}
	return t, nil
}

// connect makes a client and checks within redisPingTimeout that the server
// answers (any failure, refused connection or rejected password, is an
// unreachableError: exit 69).
func (t *redisTarget) connect(ctx context.Context) (redis.UniversalClient, error) {
	rdb := t.newClient()
	pctx, cancel := context.WithTimeout(ctx, redisPingTimeout)
	defer cancel()
	if err := rdb.Ping(pctx).Err(); err != nil {
		_ = rdb.Close()
		return nil, &unreachableError{url: t.url, err: err}
	}
	return rdb, nil
}

// unreachableError is a server that did not answer PING.
type unreachableError struct {
	url string
	err error
}

func (e *unreachableError) Error() string {
	return fmt.Sprintf("cannot reach Redis at %s: %v", e.url, e.err)
}

func (e *unreachableError) Unwrap() error { return e.err }

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
