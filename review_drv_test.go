package dlock_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
)

// TestReviewManyChannelsResubscribedAfterReset: a Client waits for many
// locks, each on a wake-up channel of its own, all on one subscription
// connection; the connection is reset, and the hub places every channel
// again at once, in one batch of SSUBSCRIBEs on one new connection. Every
// waiter must still be woken by its holder's release: here all the
// holders release well before their 60s TTL, and each waiter must obtain
// its lock within 20s.
func TestReviewManyChannelsResubscribedAfterReset(t *testing.T) {
	const n = 100
	ctx := ctxT(t, 60*time.Second)
	site := startS(t)
	holder, rdb := site.client(t)
	waiter, p := site.proxied(t, "")

	names := make([]string, n)
	leases := make([]*dlock.Lease, n)
	for i := range names {
		names[i] = fmt.Sprintf("many-%d", i)
		l, err := holder.Mutex(names[i], dlock.TTL(60*time.Second)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		leases[i] = l
	}
	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	got := make([]func() (*dlock.Lease, error), n)
	for i, name := range names {
		got[i] = async(t, wctx, waiter.Mutex(name, dlock.TTL(60*time.Second)).Lock)
	}
	channels := func() int {
		v, _ := rdb.Do(ctx, "PUBSUB", "SHARDCHANNELS", "*many-*").Slice()
		return len(v)
	}
	waitFor(t, ctx, "a waiter's channel subscribed", func() bool { return channels() > 0 })
	time.Sleep(500 * time.Millisecond) // let the rest come: the count is taken as the whole
	all := channels()
	if all < n {
		t.Fatalf("%d channels subscribed for %d waiters", all, n)
	}
	subscribed := func() bool { return channels() == all }
	gaps := dlock.SubscriptionsRepaired(waiter)
	p.ResetAll()
	// The hub sees the reset and subscribes every channel again.
	waitFor(t, ctx, "the subscriptions dropped by the reset", func() bool {
		return channels() < all
	})
	waitWithin(t, ctx, 15*time.Second, "every channel subscribed again", subscribed)
	t.Logf("%d channels, %d repaired", all, dlock.SubscriptionsRepaired(waiter)-gaps)
	for _, l := range leases {
		if err := l.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for i := range got {
		l, err := got[i]()
		if err != nil {
			t.Fatalf("waiter %d of %d after the reset: %v", i, n, err)
		}
		_ = l.Unlock(ctx)
	}
}
