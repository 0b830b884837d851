package dlock_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faults"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/rueidisdlock"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// driverEnv names the driver the tests run dlock over: unset (go-redis,
// dlock.New) or "rueidis" (rueidisdlock.New over a rueidis client to the
// same servers). make test runs the package once with each.
const driverEnv = "DLOCK_DRIVER"

func onRueidis() bool { return os.Getenv(driverEnv) == "rueidis" }

// newDlock returns a Client over rdb's servers through the driver
// DLOCK_DRIVER names: dlock.New(rdb) by default; with rueidis, a rueidis
// client made from rdb's options (its address, or its cluster's, or its
// sentinels' and master's; its dialer, which may lead through a fault
// proxy; its name, credentials, TLS and read timeout), closed when the
// test ends. The caller closes the Client, as after dlock.New.
func newDlock(t testing.TB, rdb redis.UniversalClient, opts ...dlock.Option) *dlock.Client {
	t.Helper()
	c, err := newDlockOrErr(t, rdb, opts...)
	if err != nil {
		t.Fatalf("%s=rueidis: a rueidis client for %T: %v", driverEnv, rdb, err)
	}
	return c
}

// newDlockOrErr is newDlock for a test of a server that refuses the client
// (a wrong password, an untrusted certificate): go-redis meets the refusal
// at the first call, rueidis already in rueidis.NewClient, whose error is
// returned (a rueidis user sees it there, before dlock is involved).
func newDlockOrErr(t testing.TB, rdb redis.UniversalClient, opts ...dlock.Option) (*dlock.Client, error) {
	t.Helper()
	if !onRueidis() {
		return dlock.New(rdb, opts...), nil
	}
	rc, err := newRueidis(t, rdb)
	if err != nil {
		return nil, err
	}
	c, err := rueidisdlock.New(rc, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c, nil
}

// newRueidis returns a rueidis client to rdb's servers, made as newDlock
// says (with the Injector that injectFaults gave rdb), closed when the
// test ends. Like rueidis.NewClient, it returns the client with the error
// when it has one: a client of one server (ForceSingleClient) that could
// not reach it yet, which dials again at each call.
func newRueidis(t testing.TB, rdb redis.UniversalClient) (rueidis.Client, error) {
	t.Helper()
	newClient := rueidis.NewClient
	if in, ok := rueidisFaults.Load(rdb); ok {
		newClient = in.(*faults.Injector).NewRueidis
	}
	rc, err := newClient(rueidisOptions(t, rdb))
	if rc != nil {
		t.Cleanup(rc.Close)
	}
	return rc, err
}

// rueidisFaults holds, over rueidis, the Injector that injectFaults gave
// each go-redis client, for newDlock.
var rueidisFaults sync.Map // redis.UniversalClient → *faults.Injector

// injectFaults makes in inject its faults into the script calls and
// subscriptions of the dlock Client that newDlock makes over rdb, whichever
// the driver: with go-redis it hooks rdb; with rueidis, newDlock makes its
// rueidis client with in.NewRueidis, and rdb is left as it is. Call it
// before newDlock, and before rdb's first command.
//
// A go-redis ClusterClient gets in on each of its nodes' clients
// (OnNewNode) rather than on itself: its own hooks see each command before
// it is routed, but it dials nothing (its nodes' clients do), so Cut,
// DelayWrite and the subscription faults, which act on the connections,
// would never fire. On a node's client in sees every command sent to that
// node (one redirected by MOVED or ASK again at the node it goes to), its
// pipelines' and autopipelined batches' per node, and every connection it
// dials, its sharded PubSubs' included. A rueidis cluster client is
// wrapped whole (faults.NewRueidis): a command once, wherever rueidis
// routes it, and every node connection dialed through the wrapped dialer.
func injectFaults(t testing.TB, rdb redis.UniversalClient, in *faults.Injector) {
	t.Helper()
	if !onRueidis() {
		if cc, ok := rdb.(*redis.ClusterClient); ok {
			cc.OnNewNode(func(node *redis.Client) { node.AddHook(in) })
			return
		}
		rdb.AddHook(in)
		return
	}
	if _, dup := rueidisFaults.LoadOrStore(rdb, in); dup {
		t.Fatalf("%s=rueidis: a second Injector for one client", driverEnv)
	}
	t.Cleanup(func() { rueidisFaults.Delete(rdb) })
}

// driverPrefix is what a replay command starts with to run over the
// driver this test does: "DLOCK_DRIVER=rueidis " or nothing.
func driverPrefix() string {
	if onRueidis() {
		return driverEnv + "=rueidis "
	}
	return ""
}

// rueidisOneConn holds the go-redis clients whose rueidis counterparts
// pipeline on one connection (see oneConnOnRueidis).
var rueidisOneConn sync.Map // redis.UniversalClient → struct{}

// oneConnOnRueidis makes the rueidis client that newRueidis makes for each
// of rdbs send every command on one connection (PipelineMultiplex -1),
// rather than on one of several picked at random for each command (two on
// a 2-core machine), each dialled on its first use: for a test that opens
// its connections, then holds, drops or refuses what comes after, and
// counts on no call needing a new connection (whose handshake would wait
// behind the fault), as a go-redis client reuses its one idle connection.
func oneConnOnRueidis(t testing.TB, rdbs ...redis.UniversalClient) {
	t.Helper()
	for _, rdb := range rdbs {
		rueidisOneConn.Store(rdb, struct{}{})
		t.Cleanup(func() { rueidisOneConn.Delete(rdb) })
	}
}

// passShare returns how many of n seeded runs (a chaos test's rounds)
// a long randomized test makes in this pass. make test runs the root
// package twice, under -race and over rueidis, and sets DLOCK_SPLIT to one
// number for both passes: the -race pass then makes n/2 of the runs,
// rounded up or down by that number's lowest bit, and the rueidis pass the
// rest, so that between them they make each run once. Without DLOCK_SPLIT
// (a plain go test), over go-redis every run is made, over rueidis half of
// them, rounded by a coin. With DLOCK_CHAOS_ROUNDS (make chaos) or
// DLOCK_SEED (a replay), always n. The engine is the same over both
// drivers; only the driver differs, and make test has little time.
func passShare(n int) int {
	if os.Getenv("DLOCK_CHAOS_ROUNDS") != "" || os.Getenv("DLOCK_SEED") != "" {
		return n
	}
	split, ok := envSplit()
	if !ok {
		if !onRueidis() {
			return n
		}
		return n/2 + n%2*rand.IntN(2)
	}
	first := n/2 + n%2*int(split&1) // the -race pass's
	if onRueidis() {
		return n - first
	}
	return first
}

// shareOf returns the items (a chaos test's primitives) this pass runs.
// With DLOCK_SPLIT (make test), the -race pass takes the first half of
// them and the rueidis pass the others, in an order drawn from the split
// and test (the name of the test), which also rounds an odd count up or
// down for the -race pass: the two passes run each one once, every make
// test shares them out anew, and tests of one primitive each fall to
// either pass. Otherwise as many as passShare says, drawn at random.
func shareOf(test string, items []string) []string {
	split, ok := envSplit()
	if !ok || os.Getenv("DLOCK_CHAOS_ROUNDS") != "" || os.Getenv("DLOCK_SEED") != "" {
		n := passShare(len(items))
		if n == len(items) {
			return items
		}
		out := slices.Clone(items)
		rand.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
		return out[:n]
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(test))
	r := rand.New(rand.NewPCG(split, h.Sum64()))
	out := slices.Clone(items)
	r.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	first := len(out)/2 + len(out)%2*int(r.Uint64()&1) // the -race pass's
	if onRueidis() {
		return out[first:]
	}
	return out[:first]
}

// envSplit reads DLOCK_SPLIT (see passShare).
func envSplit() (uint64, bool) {
	v := os.Getenv("DLOCK_SPLIT")
	if v == "" {
		return 0, false
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		panic(fmt.Sprintf("DLOCK_SPLIT=%q: want a number", v))
	}
	return n, true
}

// skipOnRueidis skips a test that cannot run over rueidis, saying why.
func skipOnRueidis(t testing.TB, why string) {
	t.Helper()
	if onRueidis() {
		t.Skipf("%s=rueidis: %s", driverEnv, why)
	}
}

// rueidisOptions reads what a rueidis client needs from a go-redis one.
func rueidisOptions(t testing.TB, rdb redis.UniversalClient) rueidis.ClientOption {
	t.Helper()
	o := rueidis.ClientOption{
		// dlock never uses client-side caching; tracking would cost every
		// connection a CLIENT TRACKING.
		DisableCache: true,
	}
	if _, ok := rueidisOneConn.Load(rdb); ok {
		o.PipelineMultiplex = -1
	}
	dialer := func(d func(ctx context.Context, network, addr string) (net.Conn, error)) {
		if d != nil {
			o.DialCtxFn = func(ctx context.Context, addr string, _ *net.Dialer, _ *tls.Config) (net.Conn, error) {
				return d(ctx, "tcp", addr)
			}
		}
	}
	switch r := rdb.(type) {
	case *redis.Client:
		if fo, ok := redistest.FailoverOptionsOf(r); ok {
			o.InitAddress = fo.SentinelAddrs
			o.Sentinel = rueidis.SentinelOption{MasterSet: fo.MasterName, Username: fo.SentinelUsername, Password: fo.SentinelPassword}
			o.Username, o.Password, o.ClientName, o.TLSConfig, o.SelectDB = fo.Username, fo.Password, fo.ClientName, fo.TLSConfig, fo.DB
			dialer(fo.Dialer)
			setTimeouts(&o, fo.DialTimeout, fo.ReadTimeout)
			return o
		}
		ro := r.Options()
		if ro.Addr == "FailoverClient" {
			t.Fatalf("%s=rueidis: a failover client not made by redistest.NewFailoverClient: its sentinels are unknown", driverEnv)
		}
		o.InitAddress, o.ForceSingleClient = []string{ro.Addr}, true
		o.Username, o.Password, o.ClientName, o.TLSConfig, o.SelectDB = ro.Username, ro.Password, ro.ClientName, ro.TLSConfig, ro.DB
		dialer(ro.Dialer)
		setTimeouts(&o, ro.DialTimeout, ro.ReadTimeout)
	case *redis.ClusterClient:
		co := r.Options()
		if co.ClusterSlots != nil {
			t.Skipf("%s=rueidis: a ClusterClient given its slots (ClusterSlots) has no rueidis counterpart", driverEnv)
		}
		o.InitAddress = co.Addrs
		o.Username, o.Password, o.ClientName, o.TLSConfig = co.Username, co.Password, co.ClientName, co.TLSConfig
		dialer(co.Dialer)
		setTimeouts(&o, co.DialTimeout, co.ReadTimeout)
	default:
		t.Skipf("%s=rueidis: a %T has no rueidis counterpart", driverEnv, rdb)
	}
	return o
}

// setTimeouts gives rueidis the go-redis client's read timeout (0: go-redis's
// default, 3s) as the bound on a connection that stops answering
// (ConnWriteTimeout also times its keep-alive PING): the fault tests pause
// servers and count on go-redis's bound. A dial timeout set bounds a new
// connection's dial and handshake (Dialer.Timeout; both 5s by default).
func setTimeouts(o *rueidis.ClientOption, dial, read time.Duration) {
	if dial > 0 {
		o.Dialer.Timeout = dial
	}
	switch {
	case read == 0:
		o.ConnWriteTimeout = 3 * time.Second
	case read > 0:
		o.ConnWriteTimeout = read
	}
}

// TestGoRedisBuildHasNoRueidis: a program that uses dlock with go-redis
// never compiles rueidis; only rueidisdlock imports it.
func TestGoRedisBuildHasNoRueidis(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "github.com/redis/rueidis") {
			t.Fatalf("package dlock depends on %s", pkg)
		}
	}
	if !strings.Contains(string(out), "github.com/redis/go-redis/v9") {
		t.Fatal("go list -deps does not list go-redis either: the check sees nothing")
	}
}
