package market

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Variant names, in the order the table prints them. The first three are
// the book's rows; the others are improved rows, labelled as such.
const (
	VariantWatch         = "watch"
	VariantCoarse        = "coarse"
	VariantFine          = "fine"
	VariantDlockCoarse   = "dlock-coarse"
	VariantDlockFine     = "dlock-fine"
	VariantDlockFairFine = "dlock-fair-fine"
	VariantDlockMulti    = "dlock-multi"
	VariantLua           = "lua"
)

// Item selection policies for buyers (Config.Pick).
const (
	// PickCheapest10 reads the 10 cheapest entries (ZRANGE 0 9 WITHSCORES)
	// and picks one of them at random. The default.
	PickCheapest10 = "cheapest10"
	// PickCheapest always takes the cheapest entry, so every buyer chases
	// the same item: the most collisions.
	PickCheapest = "cheapest"
	// PickRandom takes a uniformly random entry (ZRANDMEMBER 1 WITHSCORES):
	// the fewest collisions.
	PickRandom = "random"
)

// Defaults used for zero fields of Config.
const (
	DefaultDuration = 60 * time.Second
	DefaultPick     = PickCheapest10
	// MaxRounds bounds Config.Rounds.
	MaxRounds = 100
)

// ErrInvalidConfig is wrapped by every error Run returns for a Config it
// cannot run (unknown variant or pick, empty load, missing NewClient), before
// it touches Redis.
var ErrInvalidConfig = errors.New("market: invalid config")

// Variants returns the names of all variants in table order.
func Variants() []string {
	out := make([]string, len(variantSpecs))
	for i, v := range variantSpecs {
		out[i] = v.name
	}
	return out
}

// DefaultLoads returns the book's three loads: 1/1, 5/1 and 5/5.
func DefaultLoads() []Load {
	return []Load{{1, 1}, {5, 1}, {5, 5}}
}

// Load is one cell's number of concurrent listers (sellers) and buyers.
type Load struct {
	Listers int `json:"listers"`
	Buyers  int `json:"buyers"`
}

// String formats the load as the book does, "listers/buyers".
func (l Load) String() string { return fmt.Sprintf("%d/%d", l.Listers, l.Buyers) }

// ParseLoads parses a comma-separated list of "listers/buyers" pairs such as
// "1/1,5/1,5/5". Each count must be between 1 and 1000.
func ParseLoads(s string) ([]Load, error) {
	var loads []Load
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		ls, bs, ok := strings.Cut(part, "/")
		l, err1 := strconv.Atoi(strings.TrimSpace(ls))
		b, err2 := strconv.Atoi(strings.TrimSpace(bs))
		if !ok || err1 != nil || err2 != nil {
			return nil, fmt.Errorf("%w: load %q is not listers/buyers (e.g. 5/5)", ErrInvalidConfig, part)
		}
		ld := Load{Listers: l, Buyers: b}
		if err := ld.validate(); err != nil {
			return nil, err
		}
		loads = append(loads, ld)
	}
	if len(loads) == 0 {
		return nil, fmt.Errorf("%w: no loads in %q", ErrInvalidConfig, s)
	}
	return loads, nil
}

// maxWorkers bounds each side of a load: every worker holds its own
// connection.
const maxWorkers = 1000

func (l Load) validate() error {
	if l.Listers < 1 || l.Buyers < 1 || l.Listers > maxWorkers || l.Buyers > maxWorkers {
		return fmt.Errorf("%w: load %s: listers and buyers must each be 1..%d", ErrInvalidConfig, l, maxWorkers)
	}
	return nil
}

// Locker is what the dlock-* rows need: lock a name and get back the function
// that unlocks it. Lock waits until it holds the lock or ctx ends; when ctx
// ends first it returns an error (the market treats a lock wait cut short by
// its own 10 s timeout as a timeout, and one cut short by the end of the run
// as in flight). The unlock function is called exactly once, with a context
// that is not cancelled at the deadline; an error from it is reported as a
// failed check, since it means the lock may have been lost while held.
//
// The market does not import the lock library; cmd/dlock adapts a
// dlock.Client to this interface. fair asks for strict FIFO hand-off
// (dlock's Fair option).
type Locker interface {
	Lock(ctx context.Context, name string, fair bool) (unlock func(context.Context) error, err error)
}

// MultiLocker is a Locker that can also hold several names as one (dlock's
// MultiLock), as a bank transfer locks both accounts: the dlock-multi row
// needs one (with a Locker that is not, the row is skipped). LockAll waits
// as Lock does, until it holds every name or ctx ends, and never holds some
// of them when it returns an error.
type MultiLocker interface {
	Locker
	LockAll(ctx context.Context, names []string) (unlock func(context.Context) error, err error)
}

// Config describes one experiment: every load in Loads runs with every
// variant in Variants for Duration. The zero value of each field selects its
// default; NewClient is required.
type Config struct {
	// Duration of each cell (default 60s).
	Duration time.Duration
	// Loads to run (default 1/1, 5/1, 5/5).
	Loads []Load
	// Variants to run, by name (default all, see Variants).
	Variants []string
	// Pick is the buyers' item selection policy (default PickCheapest10).
	Pick string
	// Seed seeds the listers' prices and the buyers' picks; runs with the
	// same seed make the same choices given the same market.
	Seed int64
	// Rounds runs the whole table this many times, one round after the
	// other (default 1, at most MaxRounds): on a machine whose load changes
	// while the rows run one by one, a single row says little, and the
	// rows of one round ran close together. Run returns every round's
	// cells (Result.Round); the tables show each row's median round and the
	// claims compare the rows round by round, taking the median.
	Rounds int
	// Progress receives one line per finished cell and a ticking line
	// during long cells (nil: none).
	Progress io.Writer
	// NewClient returns a new client to the server under test. Run calls it
	// once per worker (each worker needs its own connection: WATCH state is
	// per connection) and once for setup and checks, and closes every client
	// it made. It must return a single-server client (*redis.Client, also
	// what redis.NewFailoverClient returns).
	NewClient func() redis.UniversalClient
	// Locker provides the dlock-* rows. If nil, those rows are skipped and
	// reported as skipped, for the reason NoLocker gives (default "no
	// Locker configured").
	Locker   Locker
	NoLocker string

	// fault breaks the experiment on purpose, to prove the checks can fail
	// (tests only).
	fault fault
	// inventory, if set, replaces the calibrated inventory size (tests
	// only).
	inventory int
}

// fault is a deliberate bug injected by tests.
type fault int

const (
	faultNone     fault = iota
	faultSkipZRem       // a purchase leaves the item in the market
)

// withDefaults returns c with zero fields replaced by defaults, and checks it.
func (c Config) withDefaults() (Config, error) {
	if c.Duration == 0 {
		c.Duration = DefaultDuration
	}
	if c.Duration < 0 {
		return c, fmt.Errorf("%w: negative duration %v", ErrInvalidConfig, c.Duration)
	}
	if c.Rounds == 0 {
		c.Rounds = 1
	}
	if c.Rounds < 0 || c.Rounds > MaxRounds {
		return c, fmt.Errorf("%w: rounds %d (want 1 to %d)", ErrInvalidConfig, c.Rounds, MaxRounds)
	}
	if len(c.Loads) == 0 {
		c.Loads = DefaultLoads()
	}
	for _, l := range c.Loads {
		if err := l.validate(); err != nil {
			return c, err
		}
	}
	if len(c.Variants) == 0 {
		c.Variants = Variants()
	}
	seen := map[string]bool{}
	for _, v := range c.Variants {
		if specFor(v) == nil {
			return c, fmt.Errorf("%w: unknown variant %q (want one of %s)", ErrInvalidConfig, v, strings.Join(Variants(), ", "))
		}
		if seen[v] {
			return c, fmt.Errorf("%w: variant %q listed twice", ErrInvalidConfig, v)
		}
		seen[v] = true
	}
	if c.Pick == "" {
		c.Pick = DefaultPick
	}
	if !slices.Contains([]string{PickCheapest10, PickCheapest, PickRandom}, c.Pick) {
		return c, fmt.Errorf("%w: unknown pick %q (want %s, %s or %s)", ErrInvalidConfig, c.Pick, PickCheapest10, PickCheapest, PickRandom)
	}
	if c.NewClient == nil {
		return c, fmt.Errorf("%w: NewClient is nil", ErrInvalidConfig)
	}
	return c, nil
}

// Validate reports whether Run would accept c (after defaults), without
// touching Redis. The error wraps ErrInvalidConfig.
func (c Config) Validate() error {
	_, err := c.withDefaults()
	return err
}
