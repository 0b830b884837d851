package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"

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
// status; documented in runUsage and README-cli.md.
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
	// runSignalSettle is how long to wait for our own copy of a signal
	// that main's handler saw first, to report the right code.
	runSignalSettle = 100 * time.Millisecond
)

// runSignals are forwarded to COMMAND while it runs, and abort a wait for
// the lock.
var runSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP}

const runUsage = `Usage: dlock run NAME [flags] -- COMMAND [ARGS...]

Runs COMMAND while holding the lock NAME, like flock(1) but across machines:
every dlock run (and every program using the dlock library) with the same
NAME, prefix and Redis server excludes the others.

The lock is a lease of --ttl that dlock renews every TTL/3 while COMMAND
runs and releases when it exits. COMMAND gets three environment variables:

  DLOCK_NAME   the lock name
  DLOCK_TOKEN  this holding's owner token (see dlock status, dlock unlock)
  DLOCK_FENCE  the fencing token: larger than that of every earlier holder
               of NAME; pass it to storage that can reject stale writers

COMMAND runs in its own process group (on a terminal, the foreground
group). SIGINT, SIGTERM and SIGHUP sent to dlock are forwarded to that
group. If the lease is lost (deleted, force-unlocked, or Redis unreachable
for longer than the TTL) COMMAND is no longer protected: dlock sends its
group SIGTERM, then SIGKILL after --kill-grace, and exits 76. On Linux,
COMMAND is also killed if dlock itself dies.

--wait chooses what happens when NAME is held elsewhere: 0 (the default)
gives up at once, a duration such as 30s waits at most that long, forever
waits until the lock is free or dlock is signalled. Waiting is woken by the
holder's release, not polled. With --fair, waiters (dlock run --fair and
library callers using Fair) take a place in a line at Redis and the release
hands the lock to the first of them that is still alive, in arrival order.

Examples:

  dlock run nightly-backup -- ./backup.sh --full
  dlock run --wait 5m deploy-web -- make deploy
  dlock run --fair --wait forever queue-worker -- ./drain-one.sh
  dlock run --wait forever --ttl 30s migrate -- sh -c 'migrate --fence "$DLOCK_FENCE"'
  dlock run --conflict-exit-code 0 cron-report -- ./report   # skip silently when busy

Exit codes:

  COMMAND's status   when it ran and the lease held to the end
  128+N              COMMAND was killed by signal N (e.g. 143 for SIGTERM)
  64                 usage error
  69                 Redis cannot be reached
  75                 the lock is held elsewhere and was not obtained within
                     --wait (EX_TEMPFAIL; change with --conflict-exit-code)
  76                 the lease was lost while COMMAND ran
  126, 127           COMMAND could not be run, or was not found
  129, 130, 143      SIGHUP, SIGINT or SIGTERM arrived while waiting for the
                     lock (COMMAND did not run)
  1                  any other error (e.g. the key holds something that is
                     not a dlock mutex)

Flags:
`

// runFlags are the parsed arguments of "dlock run".
type runFlags struct {
	target       *redisTarget
	prefix       string
	name         string
	ttl          time.Duration
	wait         time.Duration // 0: one attempt; waitForever: no limit
	killGrace    time.Duration
	conflictCode int
	fair         bool
	command      []string
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
		return fmt.Errorf("want 0, a duration such as 30s, or forever")
	}
	*w.d = d
	return nil
}

// parseRunFlags parses args; help true means -h was given and usage written.
func parseRunFlags(args []string, stdout io.Writer) (f runFlags, help bool, err error) {
	fs := flag.NewFlagSet("dlock run", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	redisURL := fs.String("redis", "", redisURLHelp)
	fs.StringVar(&f.prefix, "prefix", "dlock:", "key `prefix` of the locks (the library's WithPrefix)")
	fs.DurationVar(&f.ttl, "ttl", dlock.DefaultTTL, "lease length: how long the lock outlives a dlock that stops renewing it")
	fs.Var(waitFlag{&f.wait}, "wait", "how long to wait for a held lock: 0, a `duration` such as 30s, or forever (default 0)")
	fs.DurationVar(&f.killGrace, "kill-grace", 5*time.Second, "after a lost lease, time between SIGTERM and SIGKILL to COMMAND's group")
	fs.IntVar(&f.conflictCode, "conflict-exit-code", exitNotObtained, "exit `code` when the lock is not obtained")
	fs.BoolVar(&f.fair, "fair", false, "first come, first served across all clients: wait in a line at Redis and be handed the lock in turn (the library's Fair)")
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
	switch {
	case len(f.command) == 0:
		return f, false, errors.New("missing the COMMAND to run (dlock run NAME [flags] -- COMMAND [ARGS...])")
	case f.ttl < time.Millisecond || f.ttl > dlock.MaxTTL:
		return f, false, fmt.Errorf("--ttl %v is outside 1ms..%v", f.ttl, dlock.MaxTTL)
	case f.killGrace < 0:
		return f, false, fmt.Errorf("--kill-grace %v is negative", f.killGrace)
	case f.conflictCode < 0 || f.conflictCode > 255:
		return f, false, fmt.Errorf("--conflict-exit-code %d is outside 0..255", f.conflictCode)
	}
	if err := checkName(f.name); err != nil {
		return f, false, err
	}
	f.target, err = parseRedisTarget(resolveRedisURL(*redisURL))
	return f, false, err
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
	return false, err
}

// checkName refuses lock names the library would refuse.
func checkName(name string) error { return wire.CheckName(name) }

// runRun is "dlock run".
func runRun(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	// Catch the signals before anything can block, so that none of them
	// kills dlock while it holds the lock or waits for it.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, runSignals...)
	defer signal.Stop(sigs)

	f, help, err := parseRunFlags(args, stdout)
	if help {
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "dlock run: %v (see dlock run -h)\n", err)
		return exitUsage
	}
	rdb, err := f.target.connect(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return exitInterrupted
		}
		fmt.Fprintf(stderr, "dlock run: %v\n", err)
		return exitUnavailable
	}
	defer rdb.Close()
	client := dlock.New(rdb, dlock.WithPrefix(f.prefix))
	defer client.Close()

	opts := []dlock.LockOption{dlock.TTL(f.ttl)}
	if f.fair {
		opts = append(opts, dlock.Fair())
	}
	lease, code := acquireForRun(ctx, sigs, client.Mutex(f.name, opts...), f, stderr)
	if lease == nil {
		return code
	}
	return superviseRun(ctx, sigs, lease, f, stdout, stderr)
}

// acquireForRun obtains the lock as --wait says. Without a lease it returns
// the exit code, having said why on stderr.
func acquireForRun(ctx context.Context, sigs <-chan os.Signal, m *dlock.Mutex, f runFlags, stderr io.Writer) (*dlock.Lease, int) {
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
	switch {
	case f.wait == 0:
		lease, err = m.TryLock(lctx)
	case f.wait == waitForever:
		lease, err = m.Lock(lctx)
	default:
		wctx, wcancel := context.WithTimeout(lctx, f.wait)
		lease, err = m.Lock(wctx)
		wcancel()
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
			releaseLease(ctx, lease)
		}
		code, why := exitInterrupted, "interrupted"
		if s, ok := sig.(syscall.Signal); ok {
			code, why = 128+int(s), "received "+sigName(s)
		}
		fmt.Fprintf(stderr, "dlock run: %s while waiting for lock %q; COMMAND not run\n", why, f.name)
		return nil, code
	}
	if err == nil {
		return lease, exitOK
	}
	switch {
	case errors.Is(err, dlock.ErrNotObtained):
		fmt.Fprintf(stderr, "dlock run: lock %q is held elsewhere; not obtained (see dlock status %s)\n", f.name, f.name)
		return nil, f.conflictCode
	case errors.Is(err, context.DeadlineExceeded):
		fmt.Fprintf(stderr, "dlock run: lock %q is held elsewhere; not obtained within %v (see dlock status %s)\n", f.name, f.wait, f.name)
		return nil, f.conflictCode
	case errors.Is(err, dlock.ErrInvalidArgument):
		fmt.Fprintf(stderr, "dlock run: %v (see dlock run -h)\n", err)
		return nil, exitUsage
	case redisDown(err):
		fmt.Fprintf(stderr, "dlock run: Redis at %s became unavailable: %v\n", f.target.url, err)
		return nil, exitUnavailable
	default:
		fmt.Fprintf(stderr, "dlock run: %v\n", err)
		return nil, exitFailed
	}
}

// superviseRun runs COMMAND under lease, forwards signals to it, stops it if
// the lease is lost, releases the lock and returns the exit code.
func superviseRun(ctx context.Context, sigs <-chan os.Signal, lease *dlock.Lease, f runFlags, stdout, stderr io.Writer) int {
	cmd := exec.Command(f.command[0], f.command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	cmd.Env = append(os.Environ(),
		"DLOCK_NAME="+f.name,
		"DLOCK_TOKEN="+lease.Token(),
		"DLOCK_FENCE="+strconv.FormatUint(lease.Fence(), 10))
	attr, restoreTTY := runChildAttr()
	cmd.SysProcAttr = attr
	if err := cmd.Start(); err != nil {
		releaseLease(ctx, lease)
		code := exitCannotRun
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
			code = exitNotFound
		}
		fmt.Fprintf(stderr, "dlock run: cannot run %s: %v\n", f.command[0], err)
		return code
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	leaseCtx := lease.Context()
	lost := leaseCtx.Done()
	var kill <-chan time.Time
	var killTimer *time.Timer
	leaseLost := false
	var waitErr error
wait:
	for {
		select {
		case waitErr = <-exited:
			break wait
		case s := <-sigs:
			if ss, ok := s.(syscall.Signal); ok {
				_ = signalGroup(cmd.Process, ss)
			}
		case <-lost:
			// Whatever ended the lease (lost, or the client closing), COMMAND
			// is no longer protected by the lock.
			lost, leaseLost = nil, true
			how := fmt.Sprintf("SIGTERM, then SIGKILL after %v", f.killGrace)
			if f.killGrace == 0 {
				how = "SIGKILL"
			}
			fmt.Fprintf(stderr, "dlock run: lost lock %q (fence %d): %v; stopping COMMAND (%s)\n",
				f.name, lease.Fence(), context.Cause(leaseCtx), how)
			if f.killGrace == 0 {
				_ = signalGroup(cmd.Process, syscall.SIGKILL)
			} else {
				_ = signalGroup(cmd.Process, syscall.SIGTERM)
				killTimer = time.NewTimer(f.killGrace)
				kill = killTimer.C
			}
		case <-kill:
			kill = nil
			_ = signalGroup(cmd.Process, syscall.SIGKILL)
		}
	}
	if killTimer != nil {
		killTimer.Stop()
	}
	restoreTTY()

	code := exitFailed
	if cmd.ProcessState != nil {
		code = exitStatus(cmd.ProcessState)
	} else if waitErr != nil {
		fmt.Fprintf(stderr, "dlock run: waiting for COMMAND: %v\n", waitErr)
	}
	if leaseLost {
		releaseLease(ctx, lease) // returns ErrLockLost; stops nothing else
		return exitLeaseLost
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), runReleaseTimeout)
	defer cancel()
	switch err := lease.Unlock(uctx); {
	case err == nil:
		return code
	case errors.Is(err, dlock.ErrLockLost):
		fmt.Fprintf(stderr, "dlock run: lock %q (fence %d) was lost before COMMAND exited with status %d: %v\n", f.name, lease.Fence(), code, err)
		return exitLeaseLost
	default:
		fmt.Fprintf(stderr, "dlock run: releasing lock %q failed (it expires within %v): %v\n", f.name, f.ttl, err)
		return code
	}
}

// releaseLease gives up a lease whose outcome no longer matters.
func releaseLease(ctx context.Context, lease *dlock.Lease) {
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), runReleaseTimeout)
	defer cancel()
	_ = lease.Unlock(uctx)
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
