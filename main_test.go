package dlock_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/dlock-go/dlock/internal/redisproc"
	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// A re-executed test binary plays one worker process of a multi-process test.
	if role := os.Getenv(childRoleEnv); role != "" {
		os.Exit(runChild(role))
	}
	// The examples run against a private server of their own.
	s, err := redisproc.Start(context.Background(), redisproc.Config{TempPrefix: "dlock-examples-"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting redis-server for the examples:", err)
		os.Exit(1)
	}
	addr = s.Addr()
	masters, err := exampleMasters(3)
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting redis-servers for the quorum example:", err)
		os.Exit(1)
	}
	code := m.Run()
	_ = s.Close()
	for _, p := range masters {
		_ = p.Close()
	}
	if code == 0 {
		// redisproc keeps one OS thread for starting servers (so they die with it).
		ignore := []goleak.Option{goleak.IgnoreAnyFunction("github.com/dlock-go/dlock/internal/redisproc.spawnLoop")}
		if onRueidis() {
			// A rueidis cluster client closes the connections a slot-map
			// refresh replaced 5 s later, on a goroutine of its own that
			// outlives the client's Close.
			ignore = append(ignore, goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient)._refresh.func2"))
			// A rueidis client whose connection broke (a server a test
			// stopped or paused) tries again after a backoff of up to a
			// second, on a goroutine that sleeps through the client's
			// Close and then finds it closed.
			ignore = append(ignore, goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*call).DelayDo.func1"))
			// A MOVED that names the node the command went to (its slot
			// migrated away and back, TestInterleavingsCluster) makes a
			// rueidis cluster client dial that node anew and close the
			// old connection 5 s later, on a goroutine of its own.
			ignore = append(ignore, goleak.IgnoreAnyFunction("github.com/redis/rueidis.(*clusterClient).redirectOrNew.func1"))
		}
		if err := goleak.Find(ignore...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// exampleMasters starts the quorum example's masters, and sets their epoch
// keys to long ago: they are new, so no lease of theirs can be lost, and
// they may vote at once instead of after the restart delay.
func exampleMasters(n int) ([]*redisproc.Server, error) {
	var out []*redisproc.Server
	for range n {
		p, err := redisproc.Start(context.Background(), redisproc.Config{TempPrefix: "dlock-examples-"})
		if err != nil {
			return out, err
		}
		out = append(out, p)
		rdb := redis.NewClient(&redis.Options{Addr: p.Addr(), DisableIdentity: true})
		var info string
		if info, err = rdb.Info(context.Background(), "server").Result(); err == nil {
			_, run, _ := strings.Cut(info, "run_id:")
			run, _, _ = strings.Cut(run, "\r\n")
			err = rdb.Set(context.Background(), "dlock:epoch", "0 "+run, 0).Err() // see redistest.SetOldEpoch
		}
		_ = rdb.Close()
		if err != nil {
			return out, err
		}
		quorumAddrs = append(quorumAddrs, p.Addr())
	}
	return out, nil
}
