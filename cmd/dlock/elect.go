package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"time"

	"github.com/dlock-go/dlock"
)

func init() {
	register(command{
		name:    "elect",
		summary: "run a command while elected leader of NAME (waits its turn among the candidates)",
		run:     runElect,
	})
	register(command{
		name:    "leader",
		summary: "show the leader of an election (its value and term), or follow it with --watch",
		run:     runLeader,
	})
}

const electUsage = `Usage: dlock elect NAME [flags] -- COMMAND [ARGS...]

Campaigns in the election NAME (the library's Election) and runs COMMAND
once elected: candidates (dlock elect, and programs using the library's
Election.Campaign) lead one at a time, in the order they arrived. The
leader publishes --value, which dlock leader and Election.Observe show.

While COMMAND runs, leadership is handled as dlock run handles its lock:
the lease of --ttl is renewed every TTL/3, COMMAND gets DLOCK_NAME,
DLOCK_TOKEN and DLOCK_FENCE (the term: larger than every earlier leader's;
pass it to storage that can reject a deposed leader's writes), signals are
forwarded, and if leadership is lost (Redis unreachable past the TTL, the
key removed) COMMAND's group gets SIGTERM, then SIGKILL after --kill-grace,
and dlock exits 76. When COMMAND exits, dlock resigns: the next candidate
leads at once. If dlock dies, the next candidate leads once the lease runs
out, within --ttl.

dlock elect waits to be elected until it is signalled (SIGINT, SIGTERM,
SIGHUP: exit 130, 143, 129; COMMAND does not run).

Examples:

  dlock elect scheduler -- ./run-scheduler
  dlock elect --ttl 3s --value "$(hostname):8080" primary -- ./serve --primary

Exit codes: as dlock run's (see dlock run -h), but for 75: dlock elect
waits until elected.

Flags:
`

// parseElectFlags parses args as runFlags, the way dlock run's COMMAND is
// run; help true means -h was given and usage written.
func parseElectFlags(args []string, stdout io.Writer) (f runFlags, value string, help bool, err error) {
	f.cmd, f.wait, f.fair = "dlock elect", waitForever, true
	fs := flag.NewFlagSet("dlock elect", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var redisURLs []string
	fs.Var(urlsFlag{&redisURLs}, "redis", redisURLHelp)
	tlsFlags := addTLSFlags(fs)
	fs.StringVar(&f.prefix, "prefix", "dlock:", "key `prefix` of the locks (the library's WithPrefix)")
	fs.StringVar(&value, "value", defaultValue(), "the `value` the leader publishes (1 to "+strconv.Itoa(dlock.MaxValueLen)+" bytes)")
	durationVar(fs, &f.ttl, "ttl", dlock.DefaultTTL, time.Millisecond, dlock.MaxTTL, "10s", "lease length, a `duration`: how soon the next candidate leads after this dlock dies")
	durationVar(fs, &f.killGrace, "kill-grace", 5*time.Second, 0, 0, "5s", "`duration` between SIGTERM and SIGKILL to COMMAND's group, after leadership was lost or for what COMMAND leaves behind")
	fs.StringVar(&f.leftovers, "leftovers", leftoversKill, "what to do, when COMMAND exits, with what it left running in its process group: `kill|wait` (as dlock run's)")
	fs.BoolVar(&f.passRedisURL, "pass-redis-url", false, "pass $DLOCK_REDIS_URL to COMMAND even when it holds a password")
	// As dlock run's: flags, NAME, flags, then COMMAND (after "--", or
	// from its first word that is not a flag).
	if err := fs.Parse(args); err != nil {
		help, err := usageOrHelp(err, fs, electUsage, stdout)
		return f, value, help, err
	}
	if fs.NArg() == 0 {
		return f, value, false, errors.New("missing the election NAME")
	}
	f.name = fs.Arg(0)
	if err := fs.Parse(fs.Args()[1:]); err != nil {
		help, err := usageOrHelp(err, fs, electUsage, stdout)
		return f, value, help, err
	}
	if f.command = fs.Args(); len(f.command) == 0 {
		return f, value, false, errors.New("missing the COMMAND to run (dlock elect NAME [flags] -- COMMAND [ARGS...])")
	}
	if err := checkName(f.name); err != nil {
		return f, value, false, err
	}
	if f.leftovers != leftoversKill && f.leftovers != leftoversWait {
		return f, value, false, fmt.Errorf("--leftovers %q: want kill or wait", f.leftovers)
	}
	if f.leftovers == leftoversWait && !canAdoptOrphans {
		return f, value, false, errors.New("--leftovers wait needs Linux (a child subreaper) to know when the group has ended")
	}
	if f.targets, err = parseRedisTargets(resolveRedisURLs(redisURLs), tlsFlags); err != nil {
		return f, value, false, err
	}
	if len(f.targets) > 1 {
		return f, value, false, errors.New("an election needs one Redis server, Sentinel or Cluster: there is no one line across the masters of a quorum")
	}
	return f, value, false, nil
}

// defaultValue is --value's default: this host and process.
func defaultValue() string {
	host, err := os.Hostname()
	if err != nil {
		host = "unknown"
	}
	return host + ":" + strconv.Itoa(os.Getpid())
}

// runElect is "dlock elect": dlock run's code, with a Campaign where run
// takes the lock.
func runElect(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, notIgnored(runSignals...)...)
	defer signal.Stop(sigs)

	f, value, help, err := parseElectFlags(args, stdout)
	srv, code, ok := startRun(ctx, "dlock elect", f, help, err, stderr)
	if !ok {
		return code
	}
	client := dlock.New(srv.rdbs[0], dlock.WithPrefix(f.prefix))
	defer closeWithin(runCloseTimeout, client.Close, srv.close)
	e := client.Election(f.name, dlock.TTL(f.ttl))
	campaign := func(ctx context.Context) (*dlock.Lease, error) { return e.Campaign(ctx, value) }
	lease, code := acquireForRun(ctx, sigs, srv, campaign, nil, f, stderr)
	if lease == nil {
		return code
	}
	return superviseRun(ctx, sigs, lease, f, stdout, stderr)
}

const leaderUsage = `Usage: dlock leader NAME [flags]

Shows the leader of the election NAME (see dlock elect, and the library's
Election): the value it published and its term (fence), or that nobody
leads. With --watch it follows the election, a line (or, with --json, a
JSON object) for the leader at first and for every change of leader or
value, until it is signalled; changes are notified by Redis, not polled.

Examples:

  dlock leader scheduler
  dlock leader --json primary | jq -r .value
  dlock leader --watch primary

Exit codes: 0 ok (whether or not someone leads), 64 usage error, 69 Redis
unavailable, 130 interrupted (also how --watch ends), 1 any other error
(e.g. the key holds something that is not an election).

Flags:
`

// leaderInfo is what dlock leader --json prints.
type leaderInfo struct {
	Name   string `json:"name"`
	Leader bool   `json:"leader"` // someone leads: value and fence are its
	Value  string `json:"value,omitempty"`
	Fence  uint64 `json:"fence,omitempty"`
}

// runLeader is "dlock leader".
func runLeader(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, fl, usageErr := newInspect("dlock leader", stderr)
	watch := fs.Bool("watch", false, "follow the election: print the leader at every change, until signalled")
	pos, code, ok := parseInspect(fs, args, leaderUsage, stdout, usageErr)
	if !ok {
		return code
	}
	name, err := oneName(pos, "one election NAME")
	if err != nil {
		return usageErr(err)
	}
	targets, code := fl.targets(stderr, "dlock leader")
	if targets == nil {
		return code
	}
	if len(targets) > 1 {
		return usageErr(errors.New("an election lives on one Redis server, Sentinel or Cluster, not on a quorum of masters"))
	}
	rdb, code := connectOne(ctx, targets[0], stderr, "dlock leader")
	if rdb == nil {
		return code
	}
	client := dlock.New(rdb, dlock.WithPrefix(*fl.prefix))
	defer closeWithin(runCloseTimeout, client.Close, rdb.Close)
	e := client.Election(name)
	show := func(l dlock.Leader) int {
		info := leaderInfo{Name: name, Leader: l.Fence != 0, Value: l.Value, Fence: l.Fence}
		switch {
		case *fl.json && *watch: // one object a line
			if err := json.NewEncoder(stdout).Encode(info); err != nil {
				fmt.Fprintf(stderr, "dlock leader: writing JSON: %v\n", err)
				return exitFailed
			}
			return exitOK
		case *fl.json:
			return writeJSON(stdout, stderr, "dlock leader", info)
		}
		writeLeader(stdout, info)
		return exitOK
	}
	// One read first, also with --watch: it reports what keeps the
	// election from being read (Observe's channel would only close).
	rctx, cancel := context.WithTimeout(ctx, inspectTimeout)
	value, fence, err := e.Leader(rctx)
	cancel()
	switch {
	case errors.Is(err, dlock.ErrNoLeader):
	case errors.Is(err, dlock.ErrForeignKey):
		fmt.Fprintf(stderr, "dlock leader: %s\n", libText(err))
		return exitFailed
	case err != nil:
		return reportRedisErr(ctx, stderr, "dlock leader", err)
	}
	if !*watch {
		return show(dlock.Leader{Value: value, Fence: fence})
	}
	for l := range e.Observe(ctx) {
		if code := show(l); code != exitOK {
			return code
		}
	}
	if ctx.Err() != nil {
		return exitInterrupted
	}
	fmt.Fprintf(stderr, "dlock leader: stopped following election %q: it can no longer be read (see dlock status %s)\n", name, textSafe(name))
	return exitFailed
}

// writeLeader prints one line about the leader.
func writeLeader(w io.Writer, info leaderInfo) {
	if !info.Leader {
		fmt.Fprintf(w, "no leader\n")
		return
	}
	fmt.Fprintf(w, "leader %s (fence %d)\n", textSafe(info.Value), info.Fence)
}
