package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// The raw floor: what the two Redis commands cost on the shared go-redis
// client, with no library around them. SET key token NX PX ttl to take the
// lock, compare-and-delete by EVALSHA to release it; a held lock is retried
// after a fixed sleep (env.retry, 1ms).

// rawUnlock is the compare-and-delete release script.
var rawUnlock = redis.NewScript(`if redis.call('get',KEYS[1])==ARGV[1] then return redis.call('del',KEYS[1]) else return 0 end`)

var errRawNotHeld = errors.New("raw: lock not held at unlock")

func init() {
	register(&impl{
		name:  "raw",
		order: 0,
		settings: func(e *env) string {
			return fmt.Sprintf("SET NX PX %v + EVALSHA compare-and-delete on the shared go-redis client; waits by retrying SET NX after a %v timer", e.ttl, e.retry)
		},
		open:   func(e *env) (locker, error) { return openRaw(e, false) },
		quorum: rawQuorumImpl(false),
	})
	register(&impl{
		name:   "raw-majority",
		order:  2,
		quorum: rawQuorumImpl(true),
	})
	register(&impl{
		name:  "raw-autopipeline",
		order: 1,
		settings: func(e *env) string {
			return fmt.Sprintf("the raw floor's commands (SET NX PX %v, EVALSHA compare-and-delete, %v retry timer) sent through the shared go-redis client's AutoPipeline() (default options), as dlock sends its scripts", e.ttl, e.retry)
		},
		open: func(e *env) (locker, error) { return openRaw(e, true) },
	})
}

// rawConn is what the raw floor sends through: the go-redis client itself, or
// its shared autopipeliner.
type rawConn interface {
	redis.Scripter
	Process(ctx context.Context, cmd redis.Cmder) error
}

type rawLocker struct {
	rdb   rawConn
	ttlMS any // boxed once, so a SET adds no allocation for it
	retry time.Duration
}

func openRaw(e *env, autoPipeline bool) (locker, error) {
	if err := rawUnlock.Load(context.Background(), e.rdb).Err(); err != nil {
		return nil, err
	}
	var conn rawConn = e.rdb
	if autoPipeline {
		ap, err := e.rdb.AutoPipeline()
		if err != nil {
			return nil, err
		}
		conn = ap
	}
	return &rawLocker{rdb: conn, ttlMS: strconv.FormatInt(e.ttl.Milliseconds(), 10), retry: e.retry}, nil
}

func (l *rawLocker) Close() error { return nil }

type rawHeld struct {
	rdb        rawConn
	key, token string
}

func (l *rawLocker) Lock(ctx context.Context, key string) (held, error) {
	token := rawToken()
	w := rawWait{delay: l.retry}
	defer w.stop()
	for {
		ok, err := rawSet(ctx, l.rdb, key, token, l.ttlMS)
		if err != nil {
			return nil, err
		}
		if ok {
			return &rawHeld{rdb: l.rdb, key: key, token: token}, nil
		}
		if err := w.wait(ctx); err != nil {
			return nil, err
		}
	}
}

// rawWait is the raw floors' fixed delay between attempts, on one timer
// made at the first wait.
type rawWait struct {
	delay time.Duration
	timer *time.Timer
}

// wait waits the delay, or until ctx ends (its error).
func (w *rawWait) wait(ctx context.Context) error {
	if w.timer == nil {
		w.timer = time.NewTimer(w.delay)
	} else {
		w.timer.Reset(w.delay)
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-w.timer.C:
		return nil
	}
}

func (w *rawWait) stop() {
	if w.timer != nil {
		w.timer.Stop()
	}
}

func (h *rawHeld) Unlock(ctx context.Context) error {
	ok, err := rawDel(ctx, h.rdb, h.key, h.token)
	if err == nil && !ok {
		err = errRawNotHeld
	}
	return err
}

// rawToken returns a new owner token: 128 random bits in hex.
func rawToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand contract since Go 1.24)
	return hex.EncodeToString(b[:])
}

// rawSet sends SET key token PX ttlMS NX: whether it set the key.
func rawSet(ctx context.Context, rdb rawConn, key, token string, ttlMS any) (bool, error) {
	cmd := redis.NewBoolCmd(ctx, "set", key, token, "px", ttlMS, "nx")
	_ = rdb.Process(ctx, cmd)
	ok, err := cmd.Result()
	if err == redis.Nil {
		err = nil
	}
	return ok, err
}

// rawDel runs the compare-and-delete: whether token's key was deleted.
func rawDel(ctx context.Context, rdb rawConn, key, token string) (bool, error) {
	n, err := rawUnlock.Run(ctx, rdb, []string{key}, token).Int64()
	return n == 1, err
}
