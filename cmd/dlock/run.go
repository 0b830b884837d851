package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/wire"
)

func init() {
	register(command{
		name:    "run",
		summary: "run a command while holding a lock (like flock(1), across machines)",
		run:     runRun,
	})
}

// Exit codes of "dlock run" besides the shared ones and the child's own
// status; documented in runUsage and the README.
const (
	// exitNotObtained is EX_TEMPFAIL: the lock is held elsewhere and was
	// not obtained within --wait. --conflict-exit-code replaces it.
	exitNotObtained = 75
	// exitLeaseLost: the lease was lost while COMMAND ran (expired,
	// deleted, force-unlocked, or Redis unreachable past the TTL); COMMAND
	// was terminated, or had exited while no longer protected.
	exitLeaseLost = 76
	// exitCannotRun and exitNotFound follow env(1) and timeout(1).
	exitCannotRun = 126
	exitNotFound  = 127
)

const (
	// runReleaseTimeout bounds the release at exit; a lock that cannot be
	// released in time expires at its TTL.
	runReleaseTimeout = 5 * time.Second
	// runLostReleaseTimeout bounds the release after a lost lease: it only
	// gives back a key that may still be ours, and nothing waits for it.
	runLostReleaseTimeout = time.Second
	// runCloseTimeout bounds the wait for the client's Close at exit, which
	// waits for background releases: with Redis down they only run out
	// their own bounds, and the lock expires at its TTL anyway.
	runCloseTimeout = 500 * time.Millisecond
	// runOutageCheckTimeout bounds the PING that tells, when --wait runs
	// out, a lock held elsewhere from a server that stopped answering.
	runOutageCheckTimeout = 2 * time.Second
	// runSignalSettle is how long to wait for our own copy of a signal
	// that main's handler saw first, to report the right code.
	runSignalSettle = 100 * time.Millisecond
)

// runSignals are forwarded to COMMAND while it runs, and abort a wait for
// the lock, unless dlock was started ignoring them (startIgnored).
var runSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP}

const runUsage = `Usage: dlock run NAME [flags] -- COMMAND [ARGS...]

Runs COMMAND while holding the lock NAME, like flock(1) but across machines:
every dlock run (and every program using the dlock library) with the same
NAME, prefix and Redis server (or quorum of masters) excludes the others.

The lock is a lease of --ttl that dlock renews every TTL/3 while COMMAND
runs and releases once nothing COMMAND started runs any more. COMMAND gets
three environment variables:

  DLOCK_NAME   the lock name
  DLOCK_TOKEN  this holding's owner token (see dlock status, dlock unlock)
  DLOCK_FENCE  the fencing token: larger than that of every earlier holder
               of NAME; pass it to storage that can reject stale writers

and a DLOCK_REDIS_URL that holds a password with the password replaced
by xxxxx (--pass-redis-url passes it as it is).

The lock covers COMMAND's process group, which a small dlock process leads
(dlock __run-guard in ps). When COMMAND exits, what it left running in the
group is stopped (SIGTERM, then SIGKILL after --kill-grace) before the lock
is released; with --leftovers wait (Linux) the lock is kept until all of the
group has exited, as flock(1) does. If the lease is lost (deleted,
force-unlocked, or Redis unreachable for longer than the TTL) the whole
group gets SIGTERM, then SIGKILL after --kill-grace, and dlock exits 76. If
dlock itself dies, even of SIGKILL, the group is killed at once. A process
that leaves the group (setsid, a shell's job control) is neither waited for
nor stopped: it runs without the lock.

SIGINT, SIGTERM and SIGHUP sent to dlock are forwarded to the group, then
SIGCONT. If COMMAND dies of one of them, dlock releases the lock and dies of
the same signal, so that a calling shell stops as it would for COMMAND.
SIGINT or SIGHUP that dlock was started ignoring (a script's background
job, nohup) stays ignored, for COMMAND too. On a terminal, the group is
made the foreground group (Linux).

--wait chooses what happens when NAME is held elsewhere: 0 (the default)
gives up after one attempt, a duration such as 30s waits at most that long,
forever waits until the lock is free or dlock is signalled. Waiting is woken
by the holder's release, not polled. With --fair, waiters (dlock run --fair
and library callers using Fair) take a place in a line at Redis and the
release hands the lock to the first of them that is still alive, in arrival
order.

On Redis with replicas (Sentinel, Cluster), --replica-ack N makes dlock
start COMMAND only once N replicas have confirmed the grant (Redis WAIT,
for at most --replica-ack-timeout), and count a renewal only once they have
confirmed it: a failover right after the grant then cannot hand the lock to
someone else while COMMAND runs (the library's WithReplicaAck). Without the
confirmation dlock exits 69 and COMMAND does not run; renewals that keep
going unconfirmed end the lease (exit 76).

Quorum mode: given 3 or more independent Redis masters (--redis once per
master, or one comma-separated list, also in $DLOCK_REDIS_URL), dlock takes
the lock on a majority of them (the library's NewQuorum, the Redlock
algorithm), asking all at once and giving each --node-timeout to answer.
The lock then outlives any minority of masters down; a run that cannot
reach a majority exits 69 before COMMAND, and a lease that can no longer be
renewed on a majority is lost (exit 76). A master whose data is younger than
--restart-delay (it restarted without persistence) does not vote until then:
every client of the quorum must use the same --restart-delay, at least the
longest --ttl. Two masters are refused (a majority of 2 is both), and so are
--fair and --replica-ack (there is no one line, and no replica, across
independent masters). An odd number of masters, such as 5, is the sensible
choice.

Examples:

  dlock run nightly-backup -- ./backup.sh --full
  dlock run --wait 5m deploy-web -- make deploy
  dlock run --fair --wait forever queue-worker -- ./drain-one.sh
  dlock run --wait forever --ttl 30s migrate -- sh -c 'migrate --fence "$DLOCK_FENCE"'
  dlock run --conflict-exit-code 0 cron-report -- ./report   # skip silently when busy
  dlock run --quiet --wait 1m sync -- ./sync.sh              # exit 75 when busy, no message
  dlock run --leftovers wait build -- make -j8               # keep the lock for stragglers
  dlock run --replica-ack 1 --redis redis+sentinel://s1:26379?master_name=main job -- ./job
  dlock run --redis redis://r1:6379 --redis redis://r2:6379 --redis redis://r3:6379 job -- ./job
  DLOCK_REDIS_URL=redis://r1:6379,redis://r2:6379,redis://r3:6379 dlock run job -- ./job

Exit codes:

  COMMAND's status   when it ran and the lease held to the end
  128+N              COMMAND was killed by signal N (e.g. 137 for SIGKILL);
                     for SIGINT, SIGTERM, SIGHUP dlock dies of N itself
  64                 usage error
  69                 Redis cannot be reached (also when it stopped
                     answering while --wait ran out), or fewer than
                     --replica-ack replicas confirmed the grant; in quorum
                     mode, fewer than a majority of the masters answer and
                     vote
  75                 the lock is held elsewhere and was not obtained within
                     --wait (EX_TEMPFAIL; change with --conflict-exit-code;
                     with 0, or with --quiet, nothing is written to stderr)
  76                 the lease was lost while COMMAND's group ran
  126, 127           COMMAND could not be run, or was not found
  129, 130, 143      dlock died of SIGHUP, SIGINT or SIGTERM while waiting
                     for the lock (COMMAND did not run) or releasing it
  1                  any other error (e.g. the key holds something that is
                     not a dlock mutex)

Flags:
`

// runFlags are the parsed arguments of "dlock run".
type runFlags struct {
	targets      []*redisTarget // one server, or a quorum's masters
	prefix       string
	name         string
	ttl          time.Duration
	wait         time.Duration // 0: one attempt; waitForever: no limit
	killGrace    time.Duration
	conflictCode int
	// quiet: nothing on stderr when the lock is not obtained (also
	// implied by --conflict-exit-code 0).
	quiet        bool
	fair         bool
	leftovers    string // leftoversKill or leftoversWait
	passRedisURL bool
	replicaAck   int           // --replica-ack: replicas that must confirm a grant; 0: none
	ackTimeout   time.Duration // --replica-ack-timeout
	nodeTimeout  time.Duration // --node-timeout (quorum mode)
	restartDelay time.Duration // --restart-delay (quorum mode)
	command      []string
	// cmd names the command in messages: "dlock run" when empty (dlock
	// elect runs COMMAND with the same code).
	cmd string
}

// says is the command's name, which its messages begin with.
func (f runFlags) says() string {
	if f.cmd == "" {
		return "dlock run"
	}
	return f.cmd
}

// waitForever is --wait forever.
const waitForever time.Duration = -1

// waitFlag is --wait: 0, a duration, or "forever".
type waitFlag struct{ d *time.Duration }

func (w waitFlag) String() string {
	switch {
	case w.d == nil || *w.d == 0:
		return "0"
	case *w.d == waitForever:
		return "forever"
	}
	return w.d.String()
}

func (w waitFlag) Set(s string) error {
	if s == "forever" {
		*w.d = waitForever
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return errors.New("want 0, a duration such as 30s, or forever")
	}
	*w.d = d
	return nil
}

// parseRunFlags parses args; help true means -h was given and usage written.
func parseRunFlags(args []string, stdout io.Writer) (f runFlags, help bool, err error) {
	fs := flag.NewFlagSet("dlock run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var redisURLs []string
	fs.Var(urlsFlag{&redisURLs}, "redis", redisURLHelp)
	tlsFlags := addTLSFlags(fs)
	fs.StringVar(&f.prefix, "prefix", "dlock:", "key `prefix` of the locks (the library's WithPrefix)")
	durationVar(fs, &f.ttl, "ttl", dlock.DefaultTTL, time.Millisecond, dlock.MaxTTL, "10s", "lease length, a `duration` (1ms.."+shortDuration(dlock.MaxTTL)+"): how long the lock outlives a dlock that stops renewing it")
	fs.Var(waitFlag{&f.wait}, "wait", "how long to wait for a held lock: 0, a `duration` such as 30s, or forever (default 0)")
	durationVar(fs, &f.killGrace, "kill-grace", 5*time.Second, 0, 0, "5s", "`duration` between SIGTERM and SIGKILL to COMMAND's group, after a lost lease or for what COMMAND leaves behind")
	fs.IntVar(&f.conflictCode, "conflict-exit-code", exitNotObtained, "exit `code` when the lock is held elsewhere and not obtained; 0 skips COMMAND silently")
	fs.BoolVar(&f.quiet, "quiet", false, "say nothing when the lock is held elsewhere and not obtained, whatever --conflict-exit-code")
	fs.BoolVar(&f.fair, "fair", false, "first come, first served across all clients: wait in a line at Redis and be handed the lock in turn (the library's Fair)")
	fs.StringVar(&f.leftovers, "leftovers", leftoversKill, "what to do, when COMMAND exits, with what it left running in its process group: `kill|wait` (kill: SIGTERM, then SIGKILL after --kill-grace; wait: keep the lock until it has exited, Linux)")
	fs.BoolVar(&f.passRedisURL, "pass-redis-url", false, "pass $DLOCK_REDIS_URL to COMMAND even when it holds a password")
	fs.IntVar(&f.replicaAck, "replica-ack", 0, "`replicas` that must confirm the grant and every renewal before they count (the library's WithReplicaAck); 0: none")
	durationVar(fs, &f.ackTimeout, "replica-ack-timeout", time.Second, time.Millisecond, 2*time.Second, "500ms", "how long a grant or renewal waits for --replica-ack replicas, a `duration` (1ms..2s; at most half the Redis client's read timeout, which read_timeout= in --redis sets)")
	durationVar(fs, &f.nodeTimeout, "node-timeout", dlock.DefaultNodeTimeout, time.Millisecond, 0, "50ms", "quorum mode: how long each master has to answer a request, a `duration` (at least 1ms, below --ttl); one that answers later counts as not granting (the library's WithNodeTimeout)")
	restartDelayVar(fs, &f.restartDelay)
	if err := fs.Parse(args); err != nil {
		help, err := usageOrHelp(err, fs, runUsage, stdout)
		return f, help, err
	}
	rest := fs.Args()
	if len(rest) == 0 {
		return f, false, errors.New("missing the lock NAME")
	}
	f.name = rest[0]
	if err := fs.Parse(rest[1:]); err != nil {
		help, err := usageOrHelp(err, fs, runUsage, stdout)
		return f, help, err
	}
	f.command = fs.Args()
	ackTimeoutSet := false
	fs.Visit(func(fl *flag.Flag) { ackTimeoutSet = ackTimeoutSet || fl.Name == "replica-ack-timeout" })
	switch {
	case len(f.command) == 0:
		return f, false, errors.New("missing the COMMAND to run (dlock run NAME [flags] -- COMMAND [ARGS...])")
	case f.replicaAck < 0:
		return f, false, fmt.Errorf("--replica-ack %d: want 0 (none) or a number of replicas", f.replicaAck)
	case ackTimeoutSet && f.replicaAck == 0:
		// Alone it would do nothing: no grant would wait for replicas.
		return f, false, fmt.Errorf("--replica-ack-timeout %s without --replica-ack N: no replica would be waited for", shortDuration(f.ackTimeout))
	case f.conflictCode < 0 || f.conflictCode > 255:
		return f, false, fmt.Errorf("--conflict-exit-code %d is outside 0..255", f.conflictCode)
	case f.leftovers != leftoversKill && f.leftovers != leftoversWait:
		return f, false, fmt.Errorf("--leftovers %q: want kill or wait", f.leftovers)
	case f.leftovers == leftoversWait && !canAdoptOrphans:
		return f, false, errors.New("--leftovers wait needs Linux (a child subreaper) to know when the group has ended")
	}
	if err := checkName(f.name); err != nil {
		return f, false, err
	}
	if err := wire.CheckPrefix(f.prefix); err != nil {
		return f, false, err
	}
	if f.targets, err = parseRedisTargets(resolveRedisURLs(redisURLs), tlsFlags); err != nil {
		return f, false, err
	}
	return f, false, checkQuorumRun(fs, f)
}

// usageOrHelp turns a flag parse error into (help, err): -h writes usage
// and the flag list to stdout.
func usageOrHelp(err error, fs *flag.FlagSet, usage string, stdout io.Writer) (bool, error) {
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(stdout, usage)
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		return true, nil
	}
	return false, flagError(err)
}

// checkName refuses lock names the library would refuse.
func checkName(name string) error { return wire.CheckName(name) }

// startRun ends a command of dlock run's kind (run, elect) at -h or a
// usage error from its flags' parsing, and otherwise connects to the
// servers its flags name; ok false: exit with code.
func startRun(ctx context.Context, cmd string, f runFlags, help bool, err error, stderr io.Writer) (srv lockServers, code int, ok bool) {
	if help {
		return srv, exitOK, false
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v (see %s -h)\n", cmd, err, cmd)
		return srv, exitUsage, false
	}
	srv, err = connectRun(ctx, f, stderr)
	if err != nil {
		if ctx.Err() != nil {
			return srv, exitInterrupted, false
		}
		fmt.Fprintf(stderr, "%s: %v\n", cmd, err)
		return srv, connectExitCode(err), false
	}
	return srv, 0, true
}

// runRun is "dlock run".
func runRun(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	// Catch the signals before anything can block, so that none of them
	// kills dlock while it holds the lock or waits for it.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, notIgnored(runSignals...)...)
	defer signal.Stop(sigs)

	f, help, err := parseRunFlags(args, stdout)
	srv, code, ok := startRun(ctx, "dlock run", f, help, err, stderr)
	if !ok {
		return code
	}
	var client *dlock.Client
	if srv.quorum() {
		client, err = newQuorumClient(srv, f)
	} else if err = checkAckTimeout(srv.rdbs[0], f); err == nil {
		copts := []dlock.Option{dlock.WithPrefix(f.prefix)}
		if f.replicaAck > 0 {
			copts = append(copts, dlock.WithReplicaAck(f.replicaAck, f.ackTimeout))
		}
		client = dlock.New(srv.rdbs[0], copts...)
	}
	if err != nil {
		_ = srv.close()
		fmt.Fprintf(stderr, "dlock run: %s (see dlock run -h)\n", libText(err))
		return exitUsage
	}
	defer closeWithin(runCloseTimeout, client.Close, srv.close)

	opts := []dlock.LockOption{dlock.TTL(f.ttl)}
	if f.fair {
		opts = append(opts, dlock.Fair())
	}
	m := client.Mutex(f.name, opts...)
	lease, code := acquireForRun(ctx, sigs, srv, m.Lock, m.TryLock, f, stderr)
	if lease == nil {
		return code
	}
	return superviseRun(ctx, sigs, lease, f, stdout, stderr)
}

// checkAckTimeout refuses a --replica-ack-timeout above half the read
// timeout of rdb (from --redis's read_timeout, else go-redis's default), as
// WithReplicaAck does, but naming the flag and the URL parameter that set
// the bound: the library's error names neither.
func checkAckTimeout(rdb redis.UniversalClient, f runFlags) error {
	var read time.Duration
	switch r := rdb.(type) {
	case *redis.Client: // also a Sentinel (failover) client
		read = r.Options().ReadTimeout
	case *redis.ClusterClient:
		read = r.Options().ReadTimeout
	}
	if f.replicaAck == 0 || read <= 0 || f.ackTimeout <= read/2 {
		return nil
	}
	return fmt.Errorf("--replica-ack-timeout %s: must be at most %s, half the Redis client's read timeout (%s; read_timeout= in --redis sets it): WAIT would outlast the read",
		shortDuration(f.ackTimeout), shortDuration(read/2), shortDuration(read))
}

// acquireForRun obtains the lock as --wait says. Without a lease it returns
// the exit code, having said why on stderr.
//
// lock waits for the lock; try makes one attempt (nil: --wait is forever).
func acquireForRun(ctx context.Context, sigs <-chan os.Signal, srv lockServers, lock, try func(context.Context) (*dlock.Lease, error), f runFlags, stderr io.Writer) (*dlock.Lease, int) {
	lctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var sig os.Signal
	stop, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case sig = <-sigs:
			cancel(errors.New("received " + sigName(sig)))
		case <-stop:
		}
	}()

	var lease *dlock.Lease
	var err error
	if f.wait == waitForever || try == nil {
		lease, err = lock(lctx)
	} else {
		// The first attempt is not bounded by --wait, or a --wait shorter
		// than one round trip would fail even on a free lock.
		deadline := time.Now().Add(f.wait)
		lease, err = try(lctx)
		if errors.Is(err, dlock.ErrNotObtained) && f.wait > 0 {
			wctx, wcancel := context.WithDeadline(lctx, deadline)
			lease, err = lock(wctx)
			wcancel()
		}
	}
	close(stop)
	<-watched
	if sig == nil && ctx.Err() != nil {
		// main's handler saw the signal first; ours has it too.
		select {
		case sig = <-sigs:
		case <-time.After(runSignalSettle):
		}
	}
	if sig != nil || ctx.Err() != nil {
		// Even if the lock came at the same moment, the user asked to stop
		// before COMMAND started.
		if lease != nil {
			if again, _ := releaseForRun(ctx, sigs, lease, runReleaseTimeout, f, stderr); again != nil {
				sig = again
			}
		}
		if sig == nil {
			fmt.Fprintf(stderr, "%s: interrupted while waiting for lock %q; COMMAND not run\n", f.says(), f.name)
			return nil, exitInterrupted
		}
		fmt.Fprintf(stderr, "%s: received %s while waiting for lock %q; COMMAND not run\n", f.says(), sigName(sig), f.name)
		return nil, dieOf(sig, exitInterrupted)
	}
	if err == nil {
		return lease, exitOK
	}
	// Not obtained: said on stderr unless asked to be silent (cron mails
	// whatever a job writes there).
	conflict := func(format string, args ...any) (*dlock.Lease, int) {
		if !f.quiet && f.conflictCode != 0 {
			fmt.Fprintf(stderr, format, args...)
		}
		return nil, f.conflictCode
	}
	switch {
	case errors.Is(err, dlock.ErrNotObtained):
		return conflict("%s: lock %q is held elsewhere; not obtained (see dlock status %s)\n", f.says(), f.name, textSafe(f.name))
	case errors.Is(err, context.DeadlineExceeded):
		// The library waits through a Redis outage; it must not pass for a
		// lock held elsewhere (which --conflict-exit-code 0 would hide).
		if perr := srv.available(ctx, runOutageCheckTimeout); perr != nil {
			fmt.Fprintf(stderr, "%s: %s is unavailable; lock %q not obtained within %v: %v\n", f.says(), srv.where(), f.name, f.wait, perr)
			return nil, exitUnavailable
		}
		return conflict("%s: lock %q is held elsewhere; not obtained within %v (see dlock status %s)\n", f.says(), f.name, f.wait, textSafe(f.name))
	case errors.Is(err, dlock.ErrInvalidArgument):
		fmt.Fprintf(stderr, "%s: %s (see %s -h)\n", f.says(), libText(err), f.says())
		return nil, exitUsage
	case errors.Is(err, dlock.ErrNotReplicated):
		fmt.Fprintf(stderr, "%s: %s; COMMAND not run\n", f.says(), libText(err))
		return nil, exitUnavailable
	case errors.Is(err, dlock.ErrForeignKey):
		fmt.Fprintf(stderr, "%s: lock %q: %s\n", f.says(), f.name, srv.whatKeyIs(ctx, f.prefix, f.name, aboutLock(err, f.name)))
		return nil, exitFailed
	case redisDown(err):
		fmt.Fprintf(stderr, "%s: %s became unavailable while taking lock %q: %s\n", f.says(), srv.where(), f.name, aboutLock(err, f.name))
		return nil, exitUnavailable
	case srv.quorum():
		// Too few masters granted, none of them for another holder: some
		// do not vote yet, or did not answer in --node-timeout.
		fmt.Fprintf(stderr, "%s: %s could not grant lock %q: %s\n", f.says(), srv.where(), f.name, aboutLock(err, f.name))
		return nil, exitUnavailable
	default:
		fmt.Fprintf(stderr, "%s: %s\n", f.says(), libText(err))
		return nil, exitFailed
	}
}

// job is COMMAND running under dlock run: on Unix a guard process leads
// COMMAND's process group (runguard_unix.go).
type job interface {
	// signal forwards sig to everything COMMAND started that is still in
	// its group, followed by SIGCONT.
	signal(sig syscall.Signal)
	// stop ends everything COMMAND started: SIGTERM, then SIGKILL after
	// --kill-grace.
	stop()
	// done is closed once nothing COMMAND started is left to wait for.
	done() <-chan struct{}
	// wait, once done, returns how COMMAND ended.
	wait() jobResult
}

// jobResult is how COMMAND ended: its status, or why it could not run.
type jobResult struct {
	code int            // the shell's view: exit status, or 128 + signal
	sig  syscall.Signal // the signal that killed COMMAND, or 0
	// startCode (126 or 127) and startErr: COMMAND could not be run.
	startCode int
	startErr  string
}

// Values of --leftovers.
const (
	leftoversKill = "kill"
	leftoversWait = "wait"
)

// superviseRun runs COMMAND under lease, forwards signals to it, stops it if
// the lease is lost, releases the lock once nothing COMMAND started runs
// any more, and returns the exit code.
func superviseRun(ctx context.Context, sigs <-chan os.Signal, lease *dlock.Lease, f runFlags, stdout, stderr io.Writer) int {
	defer ignoreWhileRunning()()

	tty, restoreTTY := foregroundTerminal()
	j, err := startJob(f, commandEnv(f, lease), stdout, stderr, tty)
	if err != nil {
		restoreTTY()
		fmt.Fprintf(stderr, "%s: cannot start %s: %v\n", f.says(), f.command[0], err)
		sig, _ := releaseForRun(ctx, sigs, lease, runReleaseTimeout, f, stderr)
		return orSignal(exitCannotRun, sig)
	}

	lost := lease.Context().Done()
	leaseLost := false
	var late os.Signal // a signal after the lease was lost: do not wait for the release
	sentINT := false   // dlock forwarded a SIGINT: the keyboard's did not go to the group alone
wait:
	for {
		select {
		case <-j.done():
			break wait
		case s := <-sigs:
			if ss, ok := s.(syscall.Signal); ok {
				j.signal(ss)
			}
			sentINT = sentINT || s == syscall.SIGINT
			if leaseLost {
				late = s
			}
		case <-lost:
			// Whatever ended the lease (lost, or the client closing), COMMAND
			// is no longer protected by the lock. Stop it first: the line
			// below may fail or block.
			lost, leaseLost = nil, true
			j.stop()
			how := fmt.Sprintf("SIGTERM, then SIGKILL after %v", f.killGrace)
			if f.killGrace == 0 {
				how = "SIGKILL"
			}
			fmt.Fprintf(stderr, "%s: lost lock %q (fence %d): %s; stopping COMMAND and what it started (%s)\n", f.says(),
				f.name, lease.Fence(), whyLost(context.Cause(lease.Context()), f.name), how)
		}
	}
	res := j.wait()
	restoreTTY()

	if res.startCode != 0 {
		fmt.Fprintf(stderr, "%s: cannot run %s: %s\n", f.says(), f.command[0], res.startErr)
		sig, _ := releaseForRun(ctx, sigs, lease, runReleaseTimeout, f, stderr)
		return orSignal(res.startCode, sig)
	}
	if leaseLost {
		if late != nil {
			return dieOf(late, exitLeaseLost)
		}
		// Nothing is protected any more; the release only gives back a key
		// that may still be ours, so it is not worth a long wait.
		sig, _ := releaseForRun(ctx, sigs, lease, runLostReleaseTimeout, f, stderr)
		return orSignal(exitLeaseLost, sig)
	}
	sig, err := releaseForRun(ctx, sigs, lease, runReleaseTimeout, f, stderr)
	switch {
	case sig != nil:
		return dieOf(sig, res.code)
	case errors.Is(err, dlock.ErrLockLost):
		fmt.Fprintf(stderr, "%s: lock %q (fence %d) was lost before COMMAND ended with status %d: %s\n", f.says(), f.name, lease.Fence(), res.code, whyLost(err, f.name))
		return exitLeaseLost
	case err != nil:
		fmt.Fprintf(stderr, "%s: releasing lock %q failed (it expires within %v): %s\n", f.says(), f.name, f.ttl, aboutLock(err, f.name))
	}
	if res.sig == syscall.SIGINT || res.sig == syscall.SIGTERM || res.sig == syscall.SIGHUP {
		// COMMAND was interrupted: end the same way, so that a calling
		// shell acts on it as it would on COMMAND's own end (bash leaves a
		// loop only when its child died of SIGINT). The terminal's Ctrl-C
		// went to COMMAND's group alone if dlock had handed it the
		// terminal: pass it on to the group that had it (a calling script
		// without job control, a pipeline), as the keyboard would have.
		// Not a SIGINT sent to dlock alone and forwarded: nobody else in
		// dlock's group got that one.
		dieWithGroup = tty >= 0 && res.sig == syscall.SIGINT && !sentINT
		return dieOf(res.sig, res.code)
	}
	return res.code
}

// commandEnv is COMMAND's environment: dlock's, with DLOCK_NAME,
// DLOCK_TOKEN and DLOCK_FENCE, and a DLOCK_REDIS_URL that holds a password
// with the password replaced (unless --pass-redis-url): COMMAND is not told
// secrets it was not given. It is replaced, not removed, so that a dlock
// inside COMMAND fails to log in instead of taking its locks on the server
// of $REDIS_URL or the default one, where they would exclude nobody.
func commandEnv(f runFlags, lease *dlock.Lease) []string {
	env := make([]string, 0, len(os.Environ())+3)
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		if k == "DLOCK_REDIS_URL" && !f.passRedisURL && hasSecret(v) {
			kv = k + "=" + redactURL(v)
		}
		env = append(env, kv)
	}
	return append(env,
		"DLOCK_NAME="+f.name,
		"DLOCK_TOKEN="+lease.Token(),
		"DLOCK_FENCE="+strconv.FormatUint(lease.Fence(), 10))
}

// releaseForRun releases the lock within bound and returns the release's
// error. A signal ends the wait (the lock then expires within its TTL) and
// is returned first.
func releaseForRun(ctx context.Context, sigs <-chan os.Signal, lease *dlock.Lease, bound time.Duration, f runFlags, stderr io.Writer) (os.Signal, error) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), bound)
	defer cancel()
	released := make(chan error, 1)
	go func() { released <- lease.Unlock(uctx) }()
	select {
	case err := <-released:
		return nil, err
	case sig := <-sigs:
		fmt.Fprintf(stderr, "%s: received %s while releasing lock %q; not waiting (it expires within %v)\n", f.says(), sigName(sig), f.name, f.ttl)
		return sig, nil
	}
}

// libText is the message of an error of the library, for a line that
// begins with the command's own name: without the library's "dlock: ".
func libText(err error) string { return strings.TrimPrefix(err.Error(), "dlock: ") }

// aboutLock is libText for a line that already names the lock: without
// the library's `lock "NAME": ` either.
func aboutLock(err error, name string) string {
	return strings.TrimPrefix(libText(err), "lock "+strconv.Quote(name)+": ")
}

// whyLost is what a lost lease's error or context cause says beyond "lock
// lost", for a line that says so already.
func whyLost(err error, name string) string {
	why := aboutLock(err, name)
	if s, ok := strings.CutPrefix(why, "lock lost: "); ok {
		return s
	}
	return why
}

// closeWithin calls each of closers in turn, waiting for them at most d.
func closeWithin(d time.Duration, closers ...func() error) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, c := range closers {
			_ = c()
		}
	}()
	select {
	case <-done:
	case <-time.After(d):
	}
}

// orSignal returns code, unless sig (a signal that ended the release) is
// set: dlock then dies of it.
func orSignal(code int, sig os.Signal) int {
	if sig != nil {
		return dieOf(sig, code)
	}
	return code
}

// sigName names the signals dlock run handles the way kill(1) does.
func sigName(s os.Signal) string {
	switch s {
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGHUP:
		return "SIGHUP"
	}
	return s.String()
}
