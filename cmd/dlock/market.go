package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/market"
)

func init() {
	register(command{
		name:    "market",
		summary: "run the marketplace experiment (Redis in Action ch. 6): WATCH vs locks",
		run:     runMarket,
	})
}

// newLocker builds the Locker for the dlock-* rows from a pooled client of
// the server under test, and returns the function that closes it. It is set
// by locker.go when the lock core is compiled in; while nil, those rows are
// skipped.
var newLocker func(rdb redis.UniversalClient) (market.Locker, func() error)

// The demo "dlock market" runs without flags: one load, the rows that tell
// the story, a few seconds each, so that it ends in about 20 s on 2 cores.
const (
	demoLoads    = "5/5"
	demoDuration = 3 * time.Second
)

// demoVariants are the demo's rows: the book's three, the dlock locks that
// replace its lock, and the Lua floor.
var demoVariants = []string{market.VariantWatch, market.VariantCoarse, market.VariantFine,
	market.VariantDlockCoarse, market.VariantDlockFine, market.VariantLua}

// fullLoads are the book's loads, run by --full.
const fullLoads = "1/1,5/1,5/5"

const marketUsage = `Usage: dlock market [flags]

Runs the marketplace experiment of Redis in Action, chapter 6: sellers list
items, buyers buy them, and each purchase is kept safe one of several ways:
optimistic WATCH transactions, the book's lock on the whole market (coarse)
or on each item (fine), dlock's Mutex in their place, or one Lua script per
purchase. After every row it checks that no money or item was created or
lost, and it ends with what the run shows, each claim marked ✓ or ✗.

Without flags it is a demo of about 20 s on 2 cores: 5 sellers and 5
buyers, 3s per row, rows watch, coarse, fine, dlock-coarse, dlock-fine, lua,
and a short table with every column explained. --full runs the book's whole
experiment instead (loads 1/1, 5/1 and 5/5, every variant, 60s per row:
about 22 minutes) and prints every column; --loads, --variants and --duration
change either. On a machine whose load comes and goes, one row says little
about another that ran seconds later: --rounds N runs the table N times and
compares the rows round by round.

Without --redis (or DLOCK_REDIS_URL / REDIS_URL) it starts a private
redis-server on a free loopback port, or an in-process server if
redis-server is not installed. A server given with --redis is flushed before
every row; a non-empty database needs --flush.

Examples:

  dlock market                                   # the demo, about 20 s
  dlock market --full --chart market.svg         # the book's experiment, 22 minutes
  dlock market --loads 1/1,5/5 --duration 10s    # two loads, 10 s per row
  dlock market --variants fine,dlock-fine --pick cheapest --wide
  dlock market --variants fine,dlock-fine --duration 5s --rounds 5
  dlock market --redis redis://127.0.0.1:6379/15 --json > market.json

Exit codes: 0 ok, 1 a conservation check failed, 64 usage error,
69 Redis unavailable, 130 interrupted.

Flags:
`

// marketFlags are the parsed flags of "dlock market".
type marketFlags struct {
	redisURL string
	duration time.Duration
	loads    []market.Load
	variants []string
	pick     string
	seed     int64
	rounds   int
	json     bool
	wide     bool
	chart    string
	quiet    bool
	flush    bool
	// cpuProfile is the file --cpuprofile names ("": none).
	cpuProfile string
	// variantsSet is true when --variants was given.
	variantsSet bool
}

// parseMarketFlags parses args; a nil error with help true means -h.
func parseMarketFlags(args []string, stdout io.Writer) (f marketFlags, help bool, err error) {
	fs := flag.NewFlagSet("dlock market", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.StringVar(&f.redisURL, "redis", "", "Redis `URL` (redis://, rediss://, unix://); default $DLOCK_REDIS_URL, $REDIS_URL, else a private server")
	full := fs.Bool("full", false, "run the book's whole experiment: loads "+fullLoads+", every variant, 60s per row, every column")
	durationVar(fs, &f.duration, "duration", demoDuration, time.Millisecond, 0, "3s", "`duration` of each row (60s with --full)")
	loads := fs.String("loads", demoLoads, "comma-separated `listers/buyers` loads ("+fullLoads+" with --full)")
	variants := fs.String("variants", "", "comma-separated variants (default "+strings.Join(demoVariants, ",")+"; every one with --full: "+strings.Join(market.Variants(), ",")+")")
	fs.StringVar(&f.pick, "pick", market.DefaultPick, "buyers' item choice: cheapest10, cheapest or random")
	fs.Int64Var(&f.seed, "seed", 1, "seed for prices and picks")
	fs.IntVar(&f.rounds, "rounds", 1, "run the whole table `N` times, round after round; each row shows its median round, and the claims compare the rows of each round and take the median (1 to "+strconv.Itoa(market.MaxRounds)+")")
	fs.BoolVar(&f.json, "json", false, "print JSON (every measure of every row) instead of a table")
	fs.BoolVar(&f.wide, "wide", false, "print every column (the default with --full)")
	fs.StringVar(&f.chart, "chart", "", "write an SVG chart to `FILE.svg`")
	fs.BoolVar(&f.quiet, "quiet", false, "no progress lines on stderr")
	fs.BoolVar(&f.flush, "flush", false, "allow flushing a non-empty database given with --redis")
	fs.StringVar(&f.cpuProfile, "cpuprofile", "", "write a CPU profile of the rows (this process only, not Redis) to `FILE` for go tool pprof")
	if err := fs.Parse(args); err != nil {
		help, err := usageOrHelp(err, fs, marketUsage, stdout)
		return f, help, err
	}
	if fs.NArg() > 0 {
		return f, false, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	if *full {
		f.wide = true
		if !set["duration"] {
			f.duration = market.DefaultDuration
		}
		if !set["loads"] {
			*loads = fullLoads
		}
		if !set["variants"] {
			*variants = strings.Join(market.Variants(), ",")
		}
	} else if !set["variants"] {
		*variants = strings.Join(demoVariants, ",")
	}
	if f.loads, err = market.ParseLoads(*loads); err != nil {
		return f, false, err
	}
	f.variantsSet = set["variants"]
	for _, v := range strings.Split(*variants, ",") {
		if v = strings.TrimSpace(v); v != "" {
			f.variants = append(f.variants, v)
		}
	}
	if f.variantsSet && len(f.variants) == 0 {
		return f, false, errors.New("--variants is empty")
	}
	if f.rounds < 1 || f.rounds > market.MaxRounds {
		return f, false, fmt.Errorf("--rounds %d: want 1 to %d", f.rounds, market.MaxRounds)
	}
	if f.redisURL == "" {
		f.redisURL = os.Getenv("DLOCK_REDIS_URL")
	}
	if f.redisURL == "" {
		f.redisURL = os.Getenv("REDIS_URL")
	}
	return f, false, nil
}

// runMarket is "dlock market".
func runMarket(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	usageErr := func(err error) int {
		msg := strings.TrimPrefix(err.Error(), market.ErrInvalidConfig.Error()+": ")
		fmt.Fprintf(stderr, "dlock market: %s (see dlock market -h)\n", msg)
		return exitUsage
	}
	f, help, err := parseMarketFlags(args, stdout)
	if help {
		return exitOK
	}
	if err != nil {
		return usageErr(err)
	}
	say := func(format string, args ...any) {
		if !f.quiet {
			fmt.Fprintf(stderr, "dlock market: "+format+"\n", args...)
		}
	}

	cfg := market.Config{
		Duration: f.duration,
		Loads:    f.loads,
		Variants: f.variants,
		Pick:     f.pick,
		Seed:     f.seed,
		Rounds:   f.rounds,
	}
	if !f.quiet {
		cfg.Progress = stderr
	}

	// Check everything the user typed before starting or touching a server.
	var opts *redis.Options
	var target *redisTarget
	if f.redisURL != "" {
		if urls := splitURLs(f.redisURL); len(urls) > 1 {
			return usageErr(fmt.Errorf("--redis %q: the market needs one server, not %d (quorum mode is for dlock run, status, list and unlock)", redactURL(f.redisURL), len(urls)))
		}
		if target, err = parseRedisTarget(f.redisURL); err != nil {
			return usageErr(err)
		}
		if opts = target.single; opts == nil {
			return usageErr(fmt.Errorf("--redis %q: the market needs one server (redis://, rediss:// or unix://), not a Cluster or Sentinel", target.display))
		}
	}
	cfg.NewClient = func() redis.UniversalClient { return nil }
	if err := cfg.Validate(); err != nil {
		return usageErr(err)
	}

	var srv *embeddedServer
	if opts == nil {
		srv, err = startEmbedded(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return exitInterrupted
			}
			fmt.Fprintf(stderr, "dlock market: cannot start a private Redis server: %v\n", err)
			return exitUnavailable
		}
		defer srv.stop()
		opts = &redis.Options{Addr: srv.addr}
		say("using %s", srv.describe)
		if srv.miniredis && !f.variantsSet {
			cfg.Variants = slices.DeleteFunc(cfg.Variants, func(v string) bool { return v == market.VariantWatch })
			say("skipping the watch row: miniredis does not abort a WATCH transaction when another client ZREMs from the watched set, so WATCH purchases would double-sell and fail the check (pass --variants to run it anyway)")
		}
	}
	opts.DisableIdentity = true // Redis before 7.2 rejects CLIENT SETINFO
	newClient := func(poolSize int) *redis.Client {
		o := *opts
		o.PoolSize = poolSize
		return redis.NewClient(&o)
	}
	cfg.NewClient = func() redis.UniversalClient { return newClient(1) }

	admin := newClient(2)
	defer admin.Close()
	if srv == nil {
		if err := target.checkServer(ctx, admin); err != nil {
			return reportRedisErr(ctx, stderr, "dlock market", err)
		}
		pctx, cancel := context.WithTimeout(ctx, redisPingTimeout)
		size, err := admin.DBSize(pctx).Result()
		cancel()
		if err != nil {
			return reportRedisErr(ctx, stderr, "dlock market", err)
		}
		if size > 0 && !f.flush {
			return usageErr(fmt.Errorf("database %d at %s holds %d keys and the experiment flushes it; pass --flush or use an empty database (e.g. redis://%s/15)", opts.DB, opts.Addr, size, opts.Addr))
		}
		say("using Redis at %s, database %d", opts.Addr, opts.DB)
	}

	if newLocker != nil {
		// go-redis's default pool size, and ContextTimeoutEnabled as the
		// README advises: go-redis then bounds each call by its ctx, so
		// dlock need not run every lock and unlock call with a
		// cancelable ctx on a helper goroutine (a goroutine hop each:
		// docs/MARKET.md, "Where the time goes").
		lo := *opts
		lo.PoolSize, lo.ContextTimeoutEnabled = 0, true
		lockRDB := redis.NewClient(&lo)
		locker, closeLocker := newLocker(lockRDB)
		defer lockRDB.Close()
		defer closeLocker()
		if err := probeLocker(ctx, locker); err != nil {
			cfg.NoLocker = "dlock cannot lock on this server: " + probeProblem(err)
		} else {
			cfg.Locker = locker
		}
	} else {
		cfg.NoLocker = "this binary was built without the lock core"
	}
	if cfg.NoLocker != "" {
		say("the dlock-* rows are skipped: %s", cfg.NoLocker)
	}

	rows := 0
	for _, v := range cfg.Variants {
		if cfg.Locker != nil || !strings.HasPrefix(v, "dlock-") {
			rows += len(cfg.Loads)
		}
	}
	rows *= cfg.Rounds
	say("%d rows of %v each, about %v in all%s", rows, cfg.Duration, estimate(rows, cfg.Duration), fullHint(f))
	stopProfile, err := startCPUProfile(f.cpuProfile)
	if err != nil {
		fmt.Fprintf(stderr, "dlock market: --cpuprofile: %v\n", err)
		return exitFailed
	}
	results, runErr := market.Run(ctx, cfg)
	if err := stopProfile(); err != nil {
		fmt.Fprintf(stderr, "dlock market: --cpuprofile: %v\n", err)
		return exitFailed
	} else if f.cpuProfile != "" {
		say("CPU profile written to %s", f.cpuProfile)
	}

	if len(results) > 0 {
		if f.json {
			if err := market.WriteJSON(stdout, results); err != nil {
				fmt.Fprintf(stderr, "dlock market: writing JSON: %v\n", err)
				return exitFailed
			}
		} else if f.wide {
			market.WriteTable(stdout, results)
		} else {
			market.WriteSummary(stdout, results)
		}
		if f.chart != "" {
			if err := writeChart(f.chart, results); err != nil {
				fmt.Fprintf(stderr, "dlock market: writing the chart: %v\n", err)
				return exitFailed
			}
			say("chart written to %s", f.chart)
		}
	}

	var checkErr *market.CheckError
	switch {
	case runErr == nil:
		return exitOK
	case ctx.Err() != nil:
		fmt.Fprintf(stderr, "dlock market: interrupted\n")
		return exitInterrupted
	case errors.As(runErr, &checkErr):
		fmt.Fprintf(stderr, "dlock market: %v\n", runErr)
		return exitFailed
	case errors.Is(runErr, market.ErrInvalidConfig):
		return usageErr(runErr)
	case isUnavailable(runErr):
		fmt.Fprintf(stderr, "dlock market: Redis became unavailable: %v\n", runErr)
		return exitUnavailable
	default:
		fmt.Fprintf(stderr, "dlock market: %v\n", runErr)
		return exitFailed
	}
}

// estimate is about how long rows of d take: each row also fills the
// sellers' inventories (sized for d) and checks the market afterwards, a
// tenth of a second plus 5% of d on 2 cores.
func estimate(rows int, d time.Duration) time.Duration {
	return (time.Duration(rows) * (d + d/20 + 100*time.Millisecond)).Round(time.Second)
}

// fullHint points the demo's user to the whole experiment.
func fullHint(f marketFlags) string {
	if f.wide {
		return ""
	}
	return " (--full runs the book's whole experiment)"
}

// probeLocker takes and releases one lock, so that a server the lock core
// cannot work with (the in-process fallback lacks some commands) skips the
// dlock-* rows with a reason instead of filling them with errors.
func probeLocker(ctx context.Context, l market.Locker) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	unlock, err := l.Lock(ctx, "dlock-market-probe", false)
	if err != nil {
		return err
	}
	return unlock(ctx)
}

// probeProblem is the gist of probeLocker's error: a server that lacks a
// command the lock's scripts call answers with a compile error and a Lua
// stack trace, which says no more than that.
func probeProblem(err error) string {
	msg := strings.TrimPrefix(err.Error(), "dlock: ")
	if strings.Contains(msg, "Unknown Redis command") {
		return "it lacks a command dlock's scripts call"
	}
	return msg
}

// isUnavailable reports whether err looks like a lost or refused
// connection.
func isUnavailable(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, redis.ErrClosed)
}

// writeChart writes the SVG chart to path.
func writeChart(path string, results []market.Result) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := market.WriteSVG(f, results); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// startCPUProfile starts a CPU profile into path ("": none) and returns the
// function that stops it and closes the file.
func startCPUProfile(path string) (stop func() error, err error) {
	if path == "" {
		return func() error { return nil }, nil
	}
	out, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(out); err != nil {
		out.Close()
		return nil, err
	}
	return func() error {
		pprof.StopCPUProfile()
		return out.Close()
	}, nil
}
