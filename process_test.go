package dlock_test

// Tests that run several OS processes: the test binary re-executes itself
// with DLOCK_TEST_CHILD set to a role (see TestMain).

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/childproc"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

const (
	childRoleEnv = "DLOCK_TEST_CHILD"
	childAddrEnv = "DLOCK_TEST_ADDR"
	childArgEnv  = "DLOCK_TEST_ARG"
)

// event is one operation of a worker, as recorded for the history check.
type event struct {
	Client  int    `json:"client"`
	Op      string `json:"op"` // "acquire" or "release"
	Call    int64  `json:"call"`
	Return  int64  `json:"return"`
	Fence   uint64 `json:"fence"`
	OK      bool   `json:"ok"`
	Unknown bool   `json:"unknown,omitempty"` // outcome could not be known
	Counter int    `json:"counter"`           // value read inside the critical section
}

func startChild(t *testing.T, role, addr, arg string) (*exec.Cmd, io.WriteCloser, *bufio.Scanner) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	stdin, sc := launchChild(t, cmd, cmd, role, addr, arg)
	return cmd, stdin, sc
}

// launchChild starts cmd (through p: cmd, or a wallclock.Cmd around it) as
// a child playing role, and returns its stdin and a scanner of its stdout.
// The child is killed when the test ends.
func launchChild(t *testing.T, p childproc.Proc, cmd *exec.Cmd, role, addr, arg string) (io.WriteCloser, *bufio.Scanner) {
	t.Helper()
	return childproc.Start(t, p, cmd, childRoleEnv+"="+role, childAddrEnv+"="+addr, childArgEnv+"="+arg)
}

// expectLine reads child output lines until one starts with prefix.
func expectLine(t *testing.T, sc *bufio.Scanner, prefix string) string {
	t.Helper()
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, prefix) {
			return strings.TrimSpace(strings.TrimPrefix(line, prefix))
		}
	}
	t.Fatalf("child ended before printing %q: %v", prefix, sc.Err())
	return ""
}

func runChild(role string) int {
	uc := childRedis(os.Getenv(childAddrEnv))
	defer uc.Close()
	c := dlock.New(uc)
	defer c.Close()
	arg := os.Getenv(childArgEnv)
	rdb, one := uc.(*redis.Client) // one server: every role; else "hold" only
	var err error
	switch {
	case role == "hold":
		err = childHold(c, uc, arg)
	case siteRoles[role] != nil:
		err = siteRoles[role](c, uc, arg)
	case !one:
		err = fmt.Errorf("role %q runs on one server only, not on %s", role, os.Getenv(childAddrEnv))
	case role == "counter":
		err = childCounter(c, rdb, arg)
	case role == "fair":
		err = childFair(c, rdb)
	case familyRoles[role] != nil:
		err = familyRoles[role](c, rdb, arg)
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "child:", err)
		return 1
	}
	return 0
}

// childCounter: "base,goroutines,iterations". Each goroutine locks, reads
// the counter, writes it back plus one, unlocks; it prints every operation.
func childCounter(c *dlock.Client, rdb *redis.Client, arg string) error {
	var base, gs, iters int
	if _, err := fmt.Sscanf(arg, "%d,%d,%d", &base, &gs, &iters); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var mu sync.Mutex
	enc := json.NewEncoder(os.Stdout)
	emit := func(e event) {
		mu.Lock()
		_ = enc.Encode(e)
		mu.Unlock()
	}
	var wg sync.WaitGroup
	errs := make(chan error, gs)
	for g := 0; g < gs; g++ {
		wg.Add(1)
		go func(id int) {
			defer wg.Done()
			m := c.Mutex("shared-counter", dlock.TTL(5*time.Second))
			for i := 0; i < iters; i++ {
				call := time.Now().UnixNano()
				l, err := m.Lock(ctx)
				if err != nil {
					errs <- err
					return
				}
				e := event{Client: id, Op: "acquire", Call: call, Return: time.Now().UnixNano(), Fence: l.Fence(), OK: true}
				v, _ := rdb.Get(ctx, "counter").Int()
				if err := rdb.Set(ctx, "counter", v+1, 0).Err(); err != nil {
					errs <- err
					return
				}
				e.Counter = v
				emit(e)
				call = time.Now().UnixNano()
				uerr := l.Unlock(ctx)
				emit(event{Client: id, Op: "release", Call: call, Return: time.Now().UnixNano(), Fence: l.Fence(), OK: uerr == nil, Unknown: uerr != nil && !errors.Is(uerr, dlock.ErrLockLost)})
			}
		}(base + g)
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// childHold: "ttl". Take the lock "held", print "locked FENCE", then on each
// stdin line "check" print the lease state, and exit on EOF.
func childHold(c *dlock.Client, rdb redis.UniversalClient, arg string) error {
	ttl, err := time.ParseDuration(arg)
	if err != nil {
		return err
	}
	ctx := context.Background()
	l, err := c.Mutex("held", dlock.TTL(ttl)).Lock(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("locked %d\n", l.Fence())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		// The very first look after resuming must already see the end.
		ctxErr := l.Context().Err()
		cause := context.Cause(l.Context())
		// A careless holder writes anyway: the fenced register must refuse.
		accepted := writeFenced(ctx, rdb, l.Fence(), "paused holder")
		eerr := l.Extend(ctx, time.Minute)
		uerr := l.Unlock(ctx)
		fmt.Printf("state ctxErr=%v causeLost=%v writeAccepted=%v extendLost=%v unlockLost=%v\n", ctxErr != nil,
			errors.Is(cause, dlock.ErrLockLost), accepted, errors.Is(eerr, dlock.ErrLockLost), errors.Is(uerr, dlock.ErrLockLost))
	}
	return nil
}

// lockModel is the sequential specification of one lock: an acquire may
// succeed only when the lock is free and its fence exceeds every earlier
// one; a release succeeds only by the holder.
var lockModel = porcupine.Model{
	Init: func() any { return lockState{holder: -1} },
	Step: func(state, input, output any) (bool, any) {
		s := state.(lockState)
		in := input.(event)
		ok := output.(bool)
		switch in.Op {
		case "acquire":
			if !ok {
				return true, s
			}
			if s.holder != -1 || in.Fence <= s.fence {
				return false, s
			}
			return true, lockState{holder: in.Client, fence: in.Fence}
		default:
			if !ok {
				return s.holder != in.Client, s
			}
			if s.holder != in.Client {
				return false, s
			}
			return true, lockState{holder: -1, fence: s.fence}
		}
	},
	Equal: func(a, b any) bool { return a == b },
}

type lockState struct {
	holder int
	fence  uint64
}

func checkHistory(events []event) porcupine.CheckResult {
	ops := make([]porcupine.Operation, 0, len(events))
	for _, e := range events {
		if e.Unknown {
			continue
		}
		ops = append(ops, porcupine.Operation{ClientId: e.Client, Input: e, Call: e.Call, Output: e.OK, Return: e.Return})
	}
	res, _ := porcupine.CheckOperationsVerbose(lockModel, ops, 60*time.Second)
	return res
}

func TestHistoryCheckerSeesDoubleGrant(t *testing.T) {
	// Negative control: two overlapping grants must be rejected.
	h := []event{
		{Client: 1, Op: "acquire", Call: 0, Return: 10, Fence: 1, OK: true},
		{Client: 2, Op: "acquire", Call: 20, Return: 30, Fence: 2, OK: true},
		{Client: 1, Op: "release", Call: 40, Return: 50, OK: true},
		{Client: 2, Op: "release", Call: 60, Return: 70, OK: true},
	}
	if checkHistory(h) != porcupine.Illegal {
		t.Fatal("checker accepted a double grant")
	}
	h[1].Call, h[1].Return = 55, 58 // after the release: legal
	if checkHistory(h) != porcupine.Ok {
		t.Fatal("checker rejected a legal history")
	}
	h[1].Fence = 1 // a fence that did not increase
	if checkHistory(h) != porcupine.Illegal {
		t.Fatal("checker accepted a repeated fence")
	}
}

func TestMutualExclusionAcrossProcesses(t *testing.T) {
	s := redistest.Start(t)
	const procs, gs, iters = 4, 8, 25
	var all []event
	var mu sync.Mutex
	var wg sync.WaitGroup
	for p := 0; p < procs; p++ {
		_, stdin, sc := startChild(t, "counter", s.Addr(), fmt.Sprintf("%d,%d,%d", p*100, gs, iters))
		_ = stdin.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			for sc.Scan() {
				var e event
				if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
					t.Errorf("bad child line %q", sc.Text())
					continue
				}
				mu.Lock()
				all = append(all, e)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	total := procs * gs * iters
	ctx := ctxT(t, 10*time.Second)
	rdb := s.Client(t)
	if v, _ := rdb.Get(ctx, "counter").Int(); v != total {
		t.Fatalf("counter = %d, want %d: lost updates", v, total)
	}
	var grants []event
	for _, e := range all {
		if e.Op == "acquire" && e.OK {
			grants = append(grants, e)
		}
	}
	if len(grants) != total {
		t.Fatalf("%d grants recorded, want %d", len(grants), total)
	}
	// The counter value read inside each critical section is the grant order.
	sort.Slice(grants, func(i, j int) bool { return grants[i].Counter < grants[j].Counter })
	passes := 0
	for i := 1; i < len(grants); i++ {
		if grants[i].Counter != i {
			t.Fatalf("grant %d read counter %d: two holders read the same value", i, grants[i].Counter)
		}
		if grants[i].Fence <= grants[i-1].Fence {
			t.Fatalf("fence not increasing in grant order: %d then %d", grants[i-1].Fence, grants[i].Fence)
		}
		if grants[i].Fence == grants[i-1].Fence+1 {
			passes++ // passed within a process (see pass.go)
		}
	}
	t.Logf("%d grants, %d passed within a process", len(grants), passes)
	if passes == 0 {
		t.Fatal("no grant was passed within a process: the run did not exercise passes")
	}
	if res := checkHistory(all); res != porcupine.Ok {
		t.Fatalf("history of %d operations is not linearizable: %v", len(all), res)
	}
}

func TestKilledHolderFreesAtTTL(t *testing.T) {
	s := redistest.Start(t)
	cmd, _, sc := startChild(t, "hold", s.Addr(), "1s")
	expectLine(t, sc, "locked ")
	c, _ := newClient(t, s)
	ctx := ctxT(t, 20*time.Second)
	if _, err := c.Mutex("held").TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("lock not held by the child: %v", err)
	}
	killed := time.Now()
	_ = cmd.Process.Kill()
	l, err := c.Mutex("held").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The child renewed at most TTL/3 before it died: free within TTL + margin.
	if d := time.Since(killed); d > 2500*time.Millisecond {
		t.Fatalf("obtained %v after the holder was killed, TTL 1s", d)
	}
	_ = l.Unlock(ctx)
}

// TestPausedHolderLosesLease is faults 1 and 2: a holder process paused
// (SIGSTOP) past its TTL. On R and C too (siteChecks: the child dials the
// topology as the test does).
func TestPausedHolderLosesLease(t *testing.T) { pausedHolderLosesLease(t, startS(t)) }

func pausedHolderLosesLease(t *testing.T, site *site) {
	cmd, stdin, sc := startChild(t, "hold", site.child, "500ms")
	childFence, _ := strconv.ParseUint(expectLine(t, sc, "locked "), 10, 64)
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	c, rdb := site.client(t)
	ctx := ctxT(t, 20*time.Second)
	l, err := c.Mutex("held").Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if l.Fence() <= childFence {
		t.Fatalf("new holder's fence %d not above the paused holder's %d", l.Fence(), childFence)
	}
	if !writeFenced(ctx, rdb, l.Fence(), "new holder") {
		t.Fatal("new holder's fenced write refused")
	}
	// It stays paused on past its deadline (a time property: that the lease
	// ended while the holder was paused is what is tested).
	time.Sleep(200 * time.Millisecond)
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if _, err := io.WriteString(stdin, "check\n"); err != nil {
		t.Fatal(err)
	}
	state := expectLine(t, sc, "state ")
	// Faults 1 and 2: the lease context had ended when the holder resumed,
	// its write is refused by fence, and extend and unlock report the loss.
	if state != "ctxErr=true causeLost=true writeAccepted=false extendLost=true unlockLost=true" {
		t.Fatalf("resumed holder saw %q", state)
	}
	// The new holder is untouched.
	if v := rdb.HGet(ctx, "register", "value").Val(); v != "new holder" {
		t.Fatalf("register = %q", v)
	}
	if o := owner(ctx, rdb, "held"); o != l.Token() {
		t.Fatalf("owner is %q, want the new holder", o)
	}
	if _, err := l.TTL(ctx); err != nil {
		t.Fatalf("new holder's lease: %v", err)
	}
	_ = l.Unlock(ctx)
}
