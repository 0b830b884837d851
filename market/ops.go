package market

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Time limits, the book's values.
const (
	listTimeout     = 5 * time.Second  // a WATCH listing gives up after this
	purchaseTimeout = 10 * time.Second // a WATCH purchase gives up after this
	lockTimeout     = 10 * time.Second // acquiring a lock gives up after this
	lockPoll        = time.Millisecond // the faithful lock sleeps this between SETNX attempts
	// releaseTimeout bounds the faithful release's WATCH retry loop, which
	// the book leaves unbounded. Nobody else writes a held lock key, so it
	// never retries in practice.
	releaseTimeout = 10 * time.Second
	// emptyPause is how long a buyer sleeps when the market is empty.
	emptyPause = time.Millisecond
)

// outcome is the result of one list or purchase call.
type outcome int

const (
	outOK         outcome = iota
	outGone               // purchase: the entry is gone or its price changed
	outNoFunds            // purchase: the buyer cannot pay
	outTimeout            // gave up after its own time limit
	outStopped            // gave up because the run ended (in flight at the deadline)
	outMissing            // list: the item is not in the seller's inventory
	outLockFailed         // the Locker returned an error
)

// trader runs list and purchase calls of one variant on one worker's own
// connection. It is used by one goroutine; its counters need no locking.
type trader struct {
	conn   *redis.Conn
	spec   *variantSpec
	locker Locker
	fault  fault
	// stop is done at the deadline: retry loops and lock waits give up at
	// their next step, critical sections already entered finish.
	stop context.Context
	// deadline is stop's deadline; time held after it is not counted.
	deadline time.Time

	retries        int64 // aborted EXECs of WATCH purchases
	listRetries    int64 // aborted EXECs of WATCH listings
	lockFailures   int64 // failed SETNX attempts, or Locker errors
	unlockFailures int64 // releases that found the lock no longer theirs
	lockErr        error // the first Locker or unlock error, for the report
	// held is the time this worker held a lock before the deadline: from
	// obtaining it to starting its release; sections counts those holdings
	// (the ones that began before the deadline).
	held     time.Duration
	sections int64
	// acquiring and releasing are the wall time of every successful lock
	// acquisition (waiting included) and of every release; acquired counts
	// both.
	acquiring, releasing time.Duration
	acquired             int64
}

// acquiredSince counts a lock acquisition that began at start and
// succeeded now; it returns now, when the critical section begins.
func (t *trader) acquiredSince(start time.Time) time.Time {
	now := time.Now()
	t.acquiring += now.Sub(start)
	t.acquired++
	return now
}

func (t *trader) stopped() bool { return t.stop.Err() != nil }

// holdEnds adds the time from since until now (or the deadline, if
// earlier) to held: a critical section that began at since ends.
func (t *trader) holdEnds(since time.Time) {
	end := time.Now()
	if !t.deadline.IsZero() && end.After(t.deadline) {
		end = t.deadline
	}
	if end.After(since) {
		t.held += end.Sub(since)
		t.sections++
	}
}

// releaseTook counts a release that began at start and ends now.
func (t *trader) releaseTook(start time.Time) { t.releasing += time.Since(start) }

// list moves item from seller's inventory into the market at price.
func (t *trader) list(ctx context.Context, seller int, item, member string, price int64) (outcome, error) {
	switch {
	case t.spec.lua:
		n, err := listScript.Run(ctx, t.conn, []string{inventoryKey(seller), marketKey}, item, member, price).Int64()
		if err != nil {
			return 0, err
		}
		if n == 0 {
			return outMissing, nil
		}
		return outOK, nil
	case t.spec.lock == lockNone:
		return t.listWatch(ctx, seller, item, member, price)
	}
	release, out, err := t.lock(ctx, t.lockNames(member, seller)...)
	if err != nil || out != outOK {
		return out, err
	}
	out, err = t.listUnguarded(ctx, seller, item, member, price)
	if rerr := release(ctx); err == nil {
		err = rerr
	}
	return out, err
}

// listWatch is the book's list_item: WATCH the inventory, check the item,
// MULTI ZADD SREM EXEC; retry aborted EXECs for up to 5 s.
func (t *trader) listWatch(ctx context.Context, seller int, item, member string, price int64) (outcome, error) {
	inv := inventoryKey(seller)
	end := time.Now().Add(listTimeout)
	for {
		if err := t.conn.Do(ctx, "WATCH", inv).Err(); err != nil {
			return 0, err
		}
		has, err := t.conn.SIsMember(ctx, inv, item).Result()
		if err != nil {
			return 0, err
		}
		if !has {
			return outMissing, t.conn.Do(ctx, "UNWATCH").Err()
		}
		_, err = t.conn.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.ZAdd(ctx, marketKey, redis.Z{Score: float64(price), Member: member})
			p.SRem(ctx, inv, item)
			return nil
		})
		if err == nil {
			return outOK, nil
		}
		if !errors.Is(err, redis.TxFailedErr) {
			return 0, err
		}
		t.listRetries++
		if t.stopped() {
			return outStopped, nil
		}
		if !time.Now().Before(end) {
			return outTimeout, nil
		}
	}
}

// listUnguarded is the listing inside a lock: the same read, no WATCH, the
// writes in one MULTI/EXEC.
func (t *trader) listUnguarded(ctx context.Context, seller int, item, member string, price int64) (outcome, error) {
	inv := inventoryKey(seller)
	has, err := t.conn.SIsMember(ctx, inv, item).Result()
	if err != nil {
		return 0, err
	}
	if !has {
		return outMissing, nil
	}
	_, err = t.conn.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAdd(ctx, marketKey, redis.Z{Score: float64(price), Member: member})
		p.SRem(ctx, inv, item)
		return nil
	})
	if err != nil {
		return 0, err
	}
	return outOK, nil
}

// purchase buys the market entry member (item of seller) for buyer at the
// price the buyer saw.
func (t *trader) purchase(ctx context.Context, buyer int, item string, seller int, member string, price int64) (outcome, error) {
	switch {
	case t.spec.lua:
		keys := []string{marketKey, userKey(buyer), userKey(seller), inventoryKey(buyer)}
		n, err := purchaseScript.Run(ctx, t.conn, keys, member, item, price).Int64()
		if err != nil {
			return 0, err
		}
		switch n {
		case 1:
			return outOK, nil
		case 0:
			return outGone, nil
		default:
			return outNoFunds, nil
		}
	case t.spec.lock == lockNone:
		return t.purchaseWatch(ctx, buyer, item, seller, member, price)
	}
	release, out, err := t.lock(ctx, t.lockNames(member, buyer, seller)...)
	if err != nil || out != outOK {
		return out, err
	}
	out, err = t.purchaseUnguarded(ctx, buyer, item, seller, member, price)
	if rerr := release(ctx); err == nil {
		err = rerr
	}
	return out, err
}

// purchaseWatch is the book's purchase_item: WATCH the market and the
// buyer, read the price and the funds, give up (not a retry) if the entry is
// gone or the funds are short, else MULTI, the four writes, EXEC. Every
// aborted EXEC is a retry; it gives up after 10 s.
func (t *trader) purchaseWatch(ctx context.Context, buyer int, item string, seller int, member string, seen int64) (outcome, error) {
	buyerKey := userKey(buyer)
	end := time.Now().Add(purchaseTimeout)
	for {
		if err := t.conn.Do(ctx, "WATCH", marketKey, buyerKey).Err(); err != nil {
			return 0, err
		}
		score, err := t.conn.ZScore(ctx, marketKey, member).Result()
		gone := errors.Is(err, redis.Nil)
		if err != nil && !gone {
			return 0, err
		}
		funds, err := t.conn.HGet(ctx, buyerKey, "funds").Int64()
		if err != nil {
			return 0, err
		}
		price := int64(score)
		if gone || price != seen || funds < price {
			if err := t.conn.Do(ctx, "UNWATCH").Err(); err != nil {
				return 0, err
			}
			if gone || price != seen {
				return outGone, nil
			}
			return outNoFunds, nil
		}
		_, err = t.conn.TxPipelined(ctx, func(p redis.Pipeliner) error {
			t.buyWrites(ctx, p, buyer, item, seller, member, price)
			return nil
		})
		if err == nil {
			return outOK, nil
		}
		if !errors.Is(err, redis.TxFailedErr) {
			return 0, err
		}
		t.retries++
		if t.stopped() {
			return outStopped, nil
		}
		if !time.Now().Before(end) {
			return outTimeout, nil
		}
	}
}

// purchaseUnguarded is the purchase inside a lock: the same two reads in one
// round trip (as the book's purchase_item_with_lock does), no WATCH, the
// writes in one MULTI/EXEC.
func (t *trader) purchaseUnguarded(ctx context.Context, buyer int, item string, seller int, member string, seen int64) (outcome, error) {
	buyerKey := userKey(buyer)
	var score *redis.FloatCmd
	var funds *redis.StringCmd
	_, err := t.conn.Pipelined(ctx, func(p redis.Pipeliner) error {
		score = p.ZScore(ctx, marketKey, member)
		funds = p.HGet(ctx, buyerKey, "funds")
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return 0, err
	}
	s, err := score.Result()
	if errors.Is(err, redis.Nil) {
		return outGone, nil
	}
	if err != nil {
		return 0, err
	}
	f, err := funds.Int64()
	if err != nil {
		return 0, err
	}
	price := int64(s)
	if price != seen {
		return outGone, nil
	}
	if f < price {
		return outNoFunds, nil
	}
	_, err = t.conn.TxPipelined(ctx, func(p redis.Pipeliner) error {
		t.buyWrites(ctx, p, buyer, item, seller, member, price)
		return nil
	})
	if err != nil {
		return 0, err
	}
	return outOK, nil
}

// buyWrites queues a purchase's writes: funds buyer→seller, the item into
// the buyer's inventory, the entry out of the market.
func (t *trader) buyWrites(ctx context.Context, p redis.Pipeliner, buyer int, item string, seller int, member string, price int64) {
	p.HIncrBy(ctx, userKey(seller), "funds", price)
	p.HIncrBy(ctx, userKey(buyer), "funds", -price)
	p.SAdd(ctx, inventoryKey(buyer), item)
	if t.fault != faultSkipZRem {
		p.ZRem(ctx, marketKey, member)
	}
}

// lockName is the name a variant locks for the market entry member: the
// whole market, or that one entry.
func (t *trader) lockName(member string) string {
	if t.spec.fine {
		return marketKey + member
	}
	return marketKey
}

// lockNames is what a variant locks for an operation on the market entry
// member: lockName, and with multi the users it touches as well.
func (t *trader) lockNames(member string, users ...int) []string {
	names := []string{t.lockName(member)}
	if t.spec.multi {
		for _, u := range users {
			names = append(names, userKey(u))
		}
	}
	return names
}

// errLockTimeout is the cause of a dlock wait cut short by lockTimeout.
var errLockTimeout = errors.New("market: lock wait timed out")

// lock acquires name with the variant's lock. On outOK the caller must call
// release exactly once; otherwise release is nil.
func (t *trader) lock(ctx context.Context, names ...string) (release func(context.Context) error, out outcome, err error) {
	start := time.Now()
	name := names[0]
	if t.spec.lock == lockFaithful {
		token, out, err := t.acquireFaithful(ctx, name)
		if err != nil || out != outOK {
			return nil, out, err
		}
		since := t.acquiredSince(start)
		return func(ctx context.Context) error {
			t.holdEnds(since)
			defer t.releaseTook(time.Now())
			ok, err := t.releaseFaithful(ctx, name, token)
			if err == nil && !ok {
				t.unlockFailures++
				if t.lockErr == nil {
					t.lockErr = fmt.Errorf("market: lock %q was no longer ours at release", name)
				}
			}
			return err
		}, outOK, nil
	}

	// The wait ends at the deadline (stop) or after lockTimeout.
	lctx, cancel := context.WithTimeoutCause(t.stop, lockTimeout, errLockTimeout)
	var unlock func(context.Context) error
	if len(names) > 1 {
		unlock, err = t.locker.(MultiLocker).LockAll(lctx, names)
		name = strings.Join(names, " ")
	} else {
		unlock, err = t.locker.Lock(lctx, name, t.spec.fair)
	}
	if err != nil {
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil, 0, ctx.Err()
		case errors.Is(context.Cause(lctx), errLockTimeout):
			return nil, outTimeout, nil
		case t.stopped():
			return nil, outStopped, nil
		}
		t.lockFailures++
		if t.lockErr == nil {
			t.lockErr = fmt.Errorf("market: Locker.Lock(%q): %w", name, err)
		}
		// A Locker that fails at once must not turn the worker into a busy
		// loop.
		time.Sleep(lockPoll)
		return nil, outLockFailed, nil
	}
	since := t.acquiredSince(start)
	return func(ctx context.Context) error {
		t.holdEnds(since)
		defer t.releaseTook(time.Now())
		// Cancel the wait context only after unlocking, in case the
		// Locker ties anything of the holding to it.
		defer cancel()
		if err := unlock(ctx); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			t.unlockFailures++
			if t.lockErr == nil {
				t.lockErr = fmt.Errorf("market: unlocking %q: %w", name, err)
			}
		}
		return nil
	}, outOK, nil
}

// acquireFaithful is the book's acquire_lock: SETNX lock:<name> with a
// random token until it succeeds, sleeping 1 ms between attempts, for up to
// 10 s. No expiry.
func (t *trader) acquireFaithful(ctx context.Context, name string) (string, outcome, error) {
	token := rand.Text()
	key := "lock:" + name
	end := time.Now().Add(lockTimeout)
	for {
		n, err := t.conn.Do(ctx, "SETNX", key, token).Int64()
		if err != nil {
			return "", 0, err
		}
		if n == 1 {
			return token, outOK, nil
		}
		t.lockFailures++
		if t.stopped() {
			return "", outStopped, nil
		}
		if !time.Now().Before(end) {
			return "", outTimeout, nil
		}
		time.Sleep(lockPoll)
	}
}

// releaseFaithful is the book's release_lock: WATCH the lock key, GET it,
// and if it still holds token, MULTI DEL EXEC; retry aborted EXECs. It
// reports false if the key no longer held token.
func (t *trader) releaseFaithful(ctx context.Context, name, token string) (bool, error) {
	key := "lock:" + name
	end := time.Now().Add(releaseTimeout)
	for {
		if err := t.conn.Do(ctx, "WATCH", key).Err(); err != nil {
			return false, err
		}
		v, err := t.conn.Get(ctx, key).Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return false, err
		}
		if v != token {
			return false, t.conn.Do(ctx, "UNWATCH").Err()
		}
		_, err = t.conn.TxPipelined(ctx, func(p redis.Pipeliner) error {
			p.Del(ctx, key)
			return nil
		})
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, redis.TxFailedErr) {
			return false, err
		}
		if !time.Now().Before(end) {
			return false, fmt.Errorf("market: releasing %s: transactions kept aborting for %v", key, releaseTimeout)
		}
	}
}

// pick reads the market the way policy says and returns the candidates.
func (t *trader) pick(ctx context.Context, policy string) ([]redis.Z, error) {
	switch policy {
	case PickCheapest:
		return t.conn.ZRangeWithScores(ctx, marketKey, 0, 0).Result()
	case PickRandom:
		return t.conn.ZRandMemberWithScores(ctx, marketKey, 1).Result()
	default:
		return t.conn.ZRangeWithScores(ctx, marketKey, 0, 9).Result()
	}
}
