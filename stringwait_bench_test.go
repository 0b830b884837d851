package dlock_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
)

// compareAndDelete is how redsync, redis-py and node-redlock release.
var compareAndDelete = redis.NewScript(`if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0`)

// BenchmarkStringWake measures how soon a StringMutex waiter gets the lock
// after another library's process releases it (compare-and-delete): from
// the release being sent to Lock returning. Each iteration: the other side
// takes the key (SET NX PX), a Lock of it starts and waits 30 ms (off the
// clock: it looks, subscribes, sleeps), the other side releases.
//
//   - keyspace: notify-keyspace-events Kgx; the waiter hears the DEL;
//   - poll: notifications off; the waiter looks every 25-75 ms.
//
// For the two push mechanisms themselves, without dlock:
//
//   - raw-keyspace: a subscriber of __keyspace@0__:KEY, from the DEL sent
//     to its message;
//   - raw-tracking: client-side caching, a connection with CLIENT TRACKING
//     ON REDIRECT (to a subscriber of __redis__:invalidate) BCAST PREFIX
//     KEY, from the DEL sent to the invalidation message.
//
// Metrics: p50-µs, p90-µs and max-µs of the wake-up latency.
//
//	go test -run '^$' -bench BenchmarkStringWake -benchtime 200x .
func BenchmarkStringWake(b *testing.B) {
	for _, mode := range []string{"keyspace", "poll", "raw-keyspace", "raw-tracking"} {
		b.Run(mode, func(b *testing.B) {
			notify := "Kgx"
			if mode == "poll" {
				notify = ""
			}
			s := redistest.Start(b, redistest.Options{Args: []string{"--notify-keyspace-events", notify}})
			rdb := s.Client(b)
			ctx := context.Background()
			var wake func(release func()) time.Duration
			switch mode {
			case "keyspace", "poll":
				c := dlock.New(s.Client(b))
				b.Cleanup(func() { _ = c.Close() })
				m := c.StringMutex("wake")
				wake = func(release func()) time.Duration {
					got, done := make(chan time.Time, 1), make(chan struct{})
					go func() {
						defer close(done)
						l, err := m.Lock(ctx)
						got <- time.Now()
						if err != nil {
							b.Error(err)
							return
						}
						_ = l.Unlock(ctx)
					}()
					time.Sleep(30 * time.Millisecond)
					start := time.Now()
					release()
					at := <-got
					<-done // unlocked: the next round's SET NX finds the key free
					return at.Sub(start)
				}
			default:
				wake = rawWake(b, ctx, s, mode)
			}
			var lat []time.Duration
			for i := -3; i < b.N; i++ { // 3 rounds of warm-up
				value := "other-" + strconv.Itoa(i)
				if ok, err := rdb.SetNX(ctx, "wake", value, time.Minute).Result(); err != nil || !ok {
					b.Fatal("SET NX:", ok, err)
				}
				d := wake(func() { compareAndDelete.Run(ctx, rdb, []string{"wake"}, value) })
				if i >= 0 {
					lat = append(lat, d)
				}
			}
			slices.Sort(lat)
			us := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) }
			b.ReportMetric(us(0.5), "p50-µs")
			b.ReportMetric(us(0.9), "p90-µs")
			b.ReportMetric(us(1), "max-µs")
			b.ReportMetric(0, "ns/op")
		})
	}
}

// rawWake returns a wake for the raw-keyspace and raw-tracking modes: how
// long after the release starts its push message comes.
func rawWake(b *testing.B, ctx context.Context, s *redistest.Server, mode string) func(func()) time.Duration {
	sub := s.Client(b, func(o *redis.Options) { o.Protocol = 2 }) // invalidations as pub/sub messages
	var ps *redis.PubSub
	if mode == "raw-keyspace" {
		ps = sub.Subscribe(ctx, "__keyspace@0__:wake")
	} else {
		ps = sub.Subscribe(ctx, "__redis__:invalidate")
		if _, err := ps.Receive(ctx); err != nil {
			b.Fatal(err)
		}
		// The subscriber's id: the one connection of sub in pub/sub.
		var id int64
		for _, line := range strings.Split(sub.ClientList(ctx).Val(), "\n") {
			if f := field(line, "cmd"); f == "subscribe" {
				id, _ = strconv.ParseInt(field(line, "id"), 10, 64)
			}
		}
		tracker := s.Client(b, func(o *redis.Options) { o.PoolSize = 1 })
		if err := tracker.Do(ctx, "client", "tracking", "on", "redirect", id, "bcast", "prefix", "wake").Err(); err != nil {
			b.Fatal(err)
		}
	}
	if mode == "raw-keyspace" {
		if _, err := ps.Receive(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() { _ = ps.Close() })
	msgs := ps.Channel()
	return func(release func()) time.Duration {
		// Drain what the SET NX pushed (its invalidation; no "set" event
		// with Kgx).
		for len(msgs) > 0 {
			<-msgs
		}
		time.Sleep(5 * time.Millisecond)
		for len(msgs) > 0 {
			<-msgs
		}
		start := time.Now()
		release()
		<-msgs
		return time.Since(start)
	}
}

// field is the value of name= in a CLIENT LIST line.
func field(line, name string) string {
	for _, kv := range strings.Fields(line) {
		if k, v, ok := strings.Cut(kv, "="); ok && k == name {
			return v
		}
	}
	return ""
}
