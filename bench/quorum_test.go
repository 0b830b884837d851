package main

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestQuorumServersLatency: with a latency, every live master of every
// configuration is reached through a proxy that delays it (a PING takes at
// least the round trip), the blackholed ones still answer nothing, and the
// killed ones still refuse; without, the clients dial the masters.
// Only lower bounds on time are asserted: a slow machine cannot fail them.
func TestQuorumServersLatency(t *testing.T) {
	const latency = 25 * time.Millisecond
	s, err := startQuorumServers("redis-server", latency)
	if err != nil {
		t.Skipf("no redis-server: %v", err)
	}
	defer s.Close()
	ctx := context.Background()
	ping := func(addr string, timeout time.Duration) (time.Duration, error) {
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DisableIdentity: true, ReadTimeout: timeout, DialTimeout: timeout})
		defer c.Close()
		if err := c.Ping(ctx).Err(); err != nil { // the dial, and the handshake through the proxy
			return 0, err
		}
		t0 := time.Now()
		err := c.Ping(ctx).Err()
		return time.Since(t0), err
	}
	for _, c := range append(append([]quorumConfig{}, quorumSerialConfigs...), quorumTryConfigs...) {
		addrs := s.addrs(c)
		if len(addrs) != c.live+c.down {
			t.Fatalf("%s: %d addresses, want %d", c.name, len(addrs), c.live+c.down)
		}
		for i, a := range addrs {
			switch {
			case i < c.live:
				rtt, err := ping(a, 5*time.Second)
				if err != nil {
					t.Fatalf("%s: live master %d (%s): %v", c.name, i, a, err)
				}
				if rtt < 2*latency {
					t.Errorf("%s: live master %d (%s) answered a PING in %v, want at least %v (%v each way)", c.name, i, a, rtt, 2*latency, latency)
				}
			case c.killed:
				conn, err := net.DialTimeout("tcp", a, time.Second)
				if err == nil {
					conn.Close()
					t.Errorf("%s: killed master %d (%s) accepted a connection", c.name, i, a)
				}
			default:
				if _, err := ping(a, 200*time.Millisecond); !errors.Is(err, context.DeadlineExceeded) && !isTimeout(err) {
					t.Errorf("%s: blackholed master %d (%s): PING returned %v, want a timeout", c.name, i, a, err)
				}
			}
		}
	}

	plain, err := startQuorumServers("redis-server", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	for i, a := range plain.addrs(quorumSerialConfigs[1]) {
		if a != plain.live[i].Addr() {
			t.Errorf("no latency: master %d dialled at %s, want the server's own %s", i, a, plain.live[i].Addr())
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
