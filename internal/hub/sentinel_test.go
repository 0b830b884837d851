package hub_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/hub"
	"github.com/dlock-go/dlock/internal/redistest"
)

// A Sentinel failover: the failover client follows the new primary, and so
// do the subscriptions (the sentinels kill the demoted primary's clients);
// Gap comes for every channel.
func TestSentinelFailover(t *testing.T) {
	r := redistest.StartReplicated(t)
	rdb := r.Client(t)
	h, rec := start(t, rdb)
	wanted := names("lock:", 50)
	wantAll(t, h, wanted)
	delivered(t, hub.Sharded, rdb, rec, wanted)

	before := rec.gapsOf(wanted)
	r.Failover(t) // r.Primary is the promoted replica from here on
	gapsAtLeast(t, rec, wanted, before)
	subscribedOn(t, hub.Sharded, []*redistest.Server{r.Primary, r.Replica}, wanted, nil)
	delivered(t, hub.Sharded, rdb, rec, wanted)
}

// After a Sentinel failover and before the sentinels reconfigure the demoted
// primary (and kill its clients, seconds later), its subscribers hear
// nothing. A Suspect about one channel makes the connection again, on the
// new primary, with every channel on it: messages flow well before the
// sentinels' reconfiguration would have dropped the old connection.
func TestSentinelSuspectFollowsPrimary(t *testing.T) {
	r := redistest.StartReplicated(t)
	rdb := r.Client(t)
	h, rec := start(t, rdb)
	wanted := names("lock:", 20)
	wantAll(t, h, wanted)
	delivered(t, hub.Sharded, rdb, rec, wanted)
	time.Sleep(time.Second) // the connection is old enough to be made again (hub.recycleAfter)

	r.Failover(t) // r.Primary is the promoted replica from here on
	h.Suspect(wanted[0])
	eventually(t, "every channel subscribed on the new primary", func() (bool, string) {
		got := shardChannels(t, r.Primary)
		for _, ch := range wanted {
			if !got[ch] {
				return false, ch + " is not"
			}
		}
		return true, ""
	})
	// The repair came from Suspect, not from the sentinels: the demoted
	// primary has not been reconfigured yet (it does after a few seconds).
	old := redis.NewClient(&redis.Options{Addr: r.Replica.Addr()})
	defer old.Close()
	role, err := old.Do(context.Background(), "ROLE").Slice()
	if err != nil || len(role) == 0 || role[0] != "master" {
		t.Fatalf("the channels moved only once the sentinels reconfigured the old primary (ROLE %v, %v): Suspect did not repair", role, err)
	}
	delivered(t, hub.Sharded, rdb, rec, wanted)
}
