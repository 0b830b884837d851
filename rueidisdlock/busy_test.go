package rueidisdlock_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

const (
	busyRoleEnv = "DLOCK_BUSY_CHILD"
	busyAddrEnv = "DLOCK_BUSY_ADDR"
)

// busyScript keeps the server in one script for ms milliseconds.
const busyScript = `local t = redis.call('TIME')
local s = t[1] * 1000000 + t[2]
while true do
  local n = redis.call('TIME')
  if n[1] * 1000000 + n[2] - s > tonumber(ARGV[1]) * 1000 then break end
end
return 1`

// busyProtocolBug is the panic of rueidis v1.0.79's reader (pipe.go) on a
// reply no command awaits.
const busyProtocolBug = "panic: protocol bug, message handled out of order"

// TestBusyUnsubscribePanics documents a limit of rueidis v1.0.79: after
// each UNSUBSCRIBE or SUNSUBSCRIBE it writes a PING, and takes a -BUSY
// reply to the unsubscribe as the PING's answer (isUnsubReply in pipe.go).
// A server in a script longer than busy-reply-threshold answers both with
// -BUSY: the first completes the unsubscribe, the second has no command
// waiting for it, and rueidis's reader panics, ending the process. A child
// process plays each case (a panic would end the test binary) and the test
// asserts it died of that panic: once rueidis no longer panics, it fails.
//
//   - rueidis: a dedicated rueidis connection subscribed to a channel
//     sends SUNSUBSCRIBE (or UNSUBSCRIBE) while another connection's
//     script runs;
//   - dlock: a Mutex waiter over rueidisdlock gives up (its ctx ends)
//     while the script runs, so its Client unsubscribes the lock's channel;
//   - goredis: the same waiter over go-redis, which survives (the
//     workaround docs/SAFETY.md names).
func TestBusyUnsubscribePanics(t *testing.T) {
	if role := os.Getenv(busyRoleEnv); role != "" {
		busyChild(t, role, os.Getenv(busyAddrEnv))
		return
	}
	for _, tc := range []struct {
		role  string
		plain bool // a server without sharded pub/sub: UNSUBSCRIBE
	}{
		{"rueidis", false},
		{"rueidis", true},
		{"dlock", false},
		{"dlock", true},
		{"goredis", false},
		{"goredis", true},
	} {
		name := tc.role + "/sharded"
		if tc.plain {
			name = tc.role + "/plain"
		}
		t.Run(name, func(t *testing.T) {
			s := redistest.Start(t, redistest.Options{
				Args:            []string{"--busy-reply-threshold", "100"},
				NoShardedPubSub: tc.plain,
			})
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestBusyUnsubscribePanics$", "-test.count=1")
			cmd.Env = append(os.Environ(), busyRoleEnv+"="+tc.role, busyAddrEnv+"="+s.Addr())
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			err := cmd.Run()
			if tc.role == "goredis" {
				// The workaround: the same waiter over go-redis survives.
				if err != nil || !strings.Contains(stdout.String(), "survived") {
					t.Fatalf("child over go-redis: %v, want it to survive\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
				}
				t.Logf("child over go-redis survived; stdout:\n%s", stdout.String())
				return
			}
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ctx.Err() != nil {
				t.Fatalf("child: %v (ctx %v), want it to exit with a panic\nstdout:\n%s\nstderr:\n%s", err, ctx.Err(), stdout.String(), stderr.String())
			}
			if !strings.Contains(stderr.String(), busyProtocolBug) {
				t.Fatalf("child exited (%v) without %q: rueidis may no longer panic on -BUSY after an unsubscribe; update the limit in docs/SAFETY.md and the package doc\nstdout:\n%s\nstderr:\n%s", err, busyProtocolBug, stdout.String(), stderr.String())
			}
			e := stderr.String()
			e = e[strings.Index(e, busyProtocolBug):]
			if lines := strings.SplitN(e, "\n", 8); len(lines) == 8 {
				e = strings.Join(lines[:7], "\n")
			}
			t.Logf("child: %v; stdout:\n%s\nstderr:\n%s", err, stdout.String(), e)
		})
	}
}

// busyChild plays role against addr, printing what it sees; returning
// means it survived.
func busyChild(t *testing.T, role, addr string) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rc := client(t, addr)
	other := client(t, addr)
	busy := func() <-chan error {
		done := make(chan error, 1)
		go func() {
			done <- other.Do(ctx, other.B().Eval().Script(busyScript).Numkeys(0).Arg("1500").Build()).Error()
		}()
		// Past busy-reply-threshold (100 ms): the server answers -BUSY.
		for {
			time.Sleep(20 * time.Millisecond)
			err := rc.Do(ctx, rc.B().Ping().Build()).Error()
			if err != nil && strings.HasPrefix(err.Error(), "BUSY") {
				fmt.Println("server busy:", err)
				return done
			}
			if ctx.Err() != nil {
				t.Fatal("the server never answered BUSY")
			}
		}
	}
	switch role {
	case "rueidis":
		dc, release := rc.Dedicate()
		defer release()
		dc.SetPubSubHooks(rueidis.PubSubHooks{
			OnMessage:      func(rueidis.PubSubMessage) {},
			OnSubscription: func(s rueidis.PubSubSubscription) { fmt.Println("hook:", s.Kind, s.Channel) },
		})
		sub, unsub := dc.B().Ssubscribe().Channel("busy").Build(), dc.B().Sunsubscribe().Channel("busy").Build()
		if err := dc.Do(ctx, sub).Error(); err != nil {
			fmt.Println("SSUBSCRIBE:", err, "; plain SUBSCRIBE")
			sub, unsub = dc.B().Subscribe().Channel("busy").Build(), dc.B().Unsubscribe().Channel("busy").Build()
			if err := dc.Do(ctx, sub).Error(); err != nil {
				t.Fatal(err)
			}
		}
		done := busy()
		fmt.Println("unsubscribe while busy:", dc.Do(ctx, unsub).Error())
		fmt.Println("script:", <-done)
		fmt.Println("PING after:", dc.Do(ctx, dc.B().Ping().Build()).Error())
	case "dlock", "goredis":
		holder := newDlock(t, client(t, addr))
		waiter := newDlock(t, rc)
		if role == "goredis" {
			rdb := redis.NewClient(&redis.Options{Addr: addr})
			defer rdb.Close()
			waiter = dlock.New(rdb)
			defer waiter.Close()
		}
		l, err := holder.Mutex("busy", dlock.TTL(time.Minute)).Lock(ctx)
		if err != nil {
			t.Fatal(err)
		}
		wctx, wcancel := context.WithCancel(ctx)
		got := make(chan error, 1)
		go func() {
			_, err := waiter.Mutex("busy", dlock.TTL(time.Minute)).Lock(wctx)
			got <- err
		}()
		// The waiter's Client subscribes to the lock's channel.
		for deadline := time.Now().Add(5 * time.Second); ; {
			shard, _ := other.Do(ctx, other.B().PubsubShardchannels().Build()).AsStrSlice()
			plain, _ := other.Do(ctx, other.B().PubsubChannels().Build()).AsStrSlice()
			if len(shard)+len(plain) > 0 {
				fmt.Println("waiter subscribed: sharded", shard, "plain", plain)
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the waiter never subscribed")
			}
			time.Sleep(10 * time.Millisecond)
		}
		done := busy()
		wcancel() // the waiter gives up while the script runs
		fmt.Println("waiter:", <-got)
		fmt.Println("script:", <-done)
		time.Sleep(300 * time.Millisecond)
		_ = l.Unlock(ctx)
	}
	fmt.Println("survived")
}
