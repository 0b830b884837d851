// Package interop tests dlock's StringMutex against the lock libraries it
// shares keys with, each in an OS process of its own: redsync (Go, this
// test binary run again as a child), redis-py's Lock (Debian's
// python3-redis, run by /usr/bin/python3) and node-redlock 4.2.0 over
// ioredis (interop/node, installed with npm ci). It is a module of its own
// so that redsync stays out of dlock's go.mod. A library that is not
// installed is skipped, saying how to install it; make test installs them.
package interop

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/go-redsync/redsync/v4"
	"github.com/go-redsync/redsync/v4/redis/goredis/v9"
	"github.com/redis/go-redis/v9"
)

// roleEnv makes the test binary a redsync child (see runRedsync).
const roleEnv = "DLOCK_INTEROP_ROLE"

func TestMain(m *testing.M) {
	if os.Getenv(roleEnv) == "redsync" {
		if err := runRedsync(os.Args[len(os.Args)-9:]); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// The contention of every test: each side takes the key this many times,
// holds it this long (GET, sleep, SET of the counter) and pauses this long
// between turns, as a service doing work outside the lock would.
const (
	turns = 20
	hold  = 2 * time.Millisecond
	pause = 5 * time.Millisecond
)

// args are the arguments of every child: HOST PORT KEY COUNTER LOG SIDE N
// HOLD_MS PAUSE_MS.
func args(addr, key, side string) []string {
	host, port, _ := strings.Cut(addr, ":")
	return []string{host, port, key, key + ":counter", key + ":log", side,
		strconv.Itoa(turns), strconv.Itoa(int(hold.Milliseconds())), strconv.Itoa(int(pause.Milliseconds()))}
}

// runRedsync is the redsync child: the same loop as python/contend.py.
func runRedsync(a []string) error {
	key, counter, log, side := a[2], a[3], a[4], a[5]
	n, _ := strconv.Atoi(a[6])
	holdMs, _ := strconv.Atoi(a[7])
	pauseMs, _ := strconv.Atoi(a[8])
	rdb := redis.NewClient(&redis.Options{Addr: a[0] + ":" + a[1]})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return err
	}
	fmt.Println("ready")
	rs := redsync.New(goredis.NewPool(rdb))
	for i := 0; i < n; i++ {
		// Tries: until ctx ends (its default gives up after 32); the
		// delay between them: 10ms (its default is a random 50-250ms).
		m := rs.NewMutex(key, redsync.WithExpiry(10*time.Second), redsync.WithTries(math.MaxInt32),
			redsync.WithRetryDelay(10*time.Millisecond))
		if err := m.LockContext(ctx); err != nil {
			return err
		}
		v, _ := rdb.Get(ctx, counter).Int()
		time.Sleep(time.Duration(holdMs) * time.Millisecond)
		if err := rdb.Set(ctx, counter, v+1, 0).Err(); err != nil {
			return err
		}
		rdb.RPush(ctx, log, side)
		if ok, err := m.UnlockContext(ctx); !ok || err != nil {
			return fmt.Errorf("redsync unlock: %v, %v", ok, err)
		}
		time.Sleep(time.Duration(pauseMs) * time.Millisecond)
	}
	fmt.Println("done", n)
	return nil
}

// child is another library's process.
type child struct {
	cmd   *exec.Cmd
	ready chan struct{}
	done  chan error
	out   strings.Builder // stderr, for the failure message
}

// start starts cmd and returns once it printed "ready".
func start(t *testing.T, cmd *exec.Cmd) *child {
	t.Helper()
	c := &child{cmd: cmd, ready: make(chan struct{}), done: make(chan error, 1)}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = &c.out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if sc.Text() == "ready" {
				once.Do(func() { close(c.ready) })
			}
		}
		once.Do(func() { close(c.ready) })
		c.done <- cmd.Wait()
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	select {
	case <-c.ready:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s did not start: %s", cmd.Path, c.out.String())
	}
	return c
}

// contend runs the other library's child (already started) against two
// dlock Clients in this process, one worker each, on the same key, and
// checks the counter (no lost update) and the log of turns (both sides
// held the key while the other was still at work: each waited for the
// other).
func contend(t *testing.T, s *redistest.Server, key string, other *child, side string) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rdb := s.Client(t)
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for i := 0; i < 2; i++ {
		c := dlock.New(rdb)
		t.Cleanup(func() { _ = c.Close() })
		wg.Add(1)
		go func() {
			defer wg.Done()
			m := c.StringMutex(key)
			for j := 0; j < turns; j++ {
				l, err := m.Lock(ctx)
				if err != nil {
					errs <- err
					return
				}
				v, _ := rdb.Get(ctx, key+":counter").Int()
				time.Sleep(hold)
				rdb.Set(ctx, key+":counter", v+1, 0)
				rdb.RPush(ctx, key+":log", "dlock")
				if err := l.Unlock(ctx); err != nil {
					errs <- err
					return
				}
				time.Sleep(pause)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	select {
	case err := <-other.done:
		if err != nil {
			t.Fatalf("%s: %v: %s", side, err, other.out.String())
		}
	case <-ctx.Done():
		t.Fatalf("%s did not finish: %s", side, other.out.String())
	}
	want := 3 * turns
	if v, _ := rdb.Get(ctx, key+":counter").Int(); v != want {
		t.Fatalf("counter = %d, want %d: lost updates between dlock and %s", v, want, side)
	}
	log := rdb.LRange(ctx, key+":log", 0, -1).Val()
	switches := 0
	for i := 1; i < len(log); i++ {
		if log[i] != log[i-1] {
			switches++
		}
	}
	t.Logf("turns, in order: %s", strings.Join(log, " "))
	// Each side waited for the other at least once: a turn of the other
	// library's between two of dlock's, and one of dlock's between two of
	// the other's (three changes of side at least). More is not owed: the
	// other library polls (node-redlock every 10±5 ms) and can miss a run
	// of the short gaps between dlock's turns on a loaded machine.
	if switches < 3 {
		t.Fatalf("the key changed sides %d times in %d turns: one side did not get turns while the other worked", switches, len(log))
	}
	if n := rdb.Exists(ctx, key).Val(); n != 0 {
		t.Fatal("the key is still held after both sides finished")
	}
}

func TestRedsync(t *testing.T) {
	s := redistest.Start(t)
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, append([]string{"-test.run=^$", "--"}, args(s.Addr(), "mixed:redsync", "redsync")...)...)
	cmd.Env = append(os.Environ(), roleEnv+"=redsync")
	contend(t, s, "mixed:redsync", start(t, cmd), "redsync")
}

// python is Debian's python3, which python3-redis installs into (not a
// pyenv python3 that may come first on PATH).
const python = "/usr/bin/python3"

func TestRedisPy(t *testing.T) {
	if err := exec.Command(python, "-c", "import redis.lock").Run(); err != nil {
		t.Skipf("redis-py is not installed for %s (%v): apt-get install -y python3-redis (make test does)", python, err)
	}
	s := redistest.Start(t)
	cmd := exec.Command(python, append([]string{filepath.Join("python", "contend.py")}, args(s.Addr(), "mixed:redis-py", "redis-py")...)...)
	contend(t, s, "mixed:redis-py", start(t, cmd), "redis-py")
}

func TestNodeRedlock(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed: apt-get install -y nodejs npm (make test does)")
	}
	if _, err := os.Stat(filepath.Join("node", "node_modules", "redlock")); err != nil {
		t.Skip("node-redlock is not installed: cd interop/node && npm ci (make test does)")
	}
	s := redistest.Start(t)
	cmd := exec.Command(node, append([]string{filepath.Join("node", "contend.js")}, args(s.Addr(), "mixed:node-redlock", "node-redlock")...)...)
	contend(t, s, "mixed:node-redlock", start(t, cmd), "node-redlock")
}
