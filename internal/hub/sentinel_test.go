package hub_test

import (
	"testing"

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
	delivered(t, rdb, rec, wanted)

	before := rec.gapsOf(wanted)
	r.Failover(t) // r.Primary is the promoted replica from here on
	gapsAtLeast(t, rec, wanted, before)
	subscribedOn(t, []*redistest.Server{r.Primary, r.Replica}, wanted, nil)
	delivered(t, rdb, rec, wanted)
}
