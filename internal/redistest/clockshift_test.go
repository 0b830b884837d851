package redistest

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// serverClock returns the server's TIME minus the real time now.
func serverClock(t *testing.T, c *redis.Client) time.Duration {
	t.Helper()
	st, err := c.Time(ctx(t)).Result()
	if err != nil {
		t.Fatal(err)
	}
	return time.Until(st)
}

// The shim moves what Redis reads as the time of day (TIME, in scripts too,
// and key expiry) while the server runs, and keeps the offset across a
// restart.
func TestClockShift(t *testing.T) {
	t.Parallel()
	s := Start(t, Options{ClockShift: true})
	c := s.Client(t)
	// The bounds are far from both the offset and zero: what is checked is
	// that the clock moved by the hour, not how fast TIME answers.
	near := func(got, want time.Duration) bool { return got > want-time.Minute && got < want+time.Minute }
	if d := serverClock(t, c); !near(d, 0) {
		t.Fatalf("server clock %v from real time before any shift", d)
	}
	if err := c.Set(ctx(t), "k", "v", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}

	s.SetClockOffset(t, -time.Hour)
	if d := serverClock(t, c); !near(d, -time.Hour) {
		t.Fatalf("server clock %v from real time, want -1h", d)
	}
	// In a script, TIME is the same call.
	sec, err := c.Eval(ctx(t), "return redis.call('TIME')[1]", nil).Int64()
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Until(time.Unix(sec, 0)); !near(d, -time.Hour) {
		t.Fatalf("TIME in a script %v from real time, want -1h", d)
	}
	// An expiry set before the jump is a point in time: the key now lives
	// the hour longer.
	if ttl := c.PTTL(ctx(t), "k").Val(); ttl <= time.Hour {
		t.Fatalf("PTTL after the clock went back an hour = %v, want over 1h", ttl)
	}

	s.Restart(t)
	if d := serverClock(t, c); !near(d, -time.Hour) {
		t.Fatalf("after Restart, server clock %v from real time, want -1h", d)
	}
	if err := c.Set(ctx(t), "k", "v", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	s.SetClockOffset(t, time.Hour)
	if d := serverClock(t, c); !near(d, time.Hour) {
		t.Fatalf("server clock %v from real time, want +1h", d)
	}
	// Forward past its expiry: gone at once.
	if n := c.Exists(ctx(t), "k").Val(); n != 0 {
		t.Fatal("a key with a minute to live survived the clock going two hours forward")
	}
}
