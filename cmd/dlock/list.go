package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/redis/go-redis/v9"
)

func init() {
	register(command{
		name:    "list",
		summary: "list locks whose names match a pattern, with holder, fence and TTL",
		run:     runList,
	})
}

// scanCount is the COUNT hint of each SCAN call, and so the size of each
// pipelined batch of per-key reads.
const scanCount = 500

const listUsage = `Usage: dlock list [PATTERN] [flags]

Lists the locks whose names match PATTERN (a Redis glob: * ? [abc] and \
to escape; default *), with the same fields as dlock status. It walks the
keyspace with SCAN (never KEYS, so it does not block the server) over keys
PREFIX{PATTERN}, and reads each batch of keys in one pipelined round trip.
On a Cluster it scans every master. The listing is not a snapshot: locks
taken or released during the scan may or may not appear.

Quorum mode (3 or more --redis masters): every name found on any master,
with the state the masters hold it in together (held, partial, free: see
dlock status -h) and on how many of them its owner holds it (HELD ON;
held_on in --json). A master that cannot be read is named on stderr and
left out. The masters' epoch keys (PREFIX + "epoch") are not locks and are
never listed.

Examples:

  dlock list
  dlock list 'deploy-*'
  dlock list --json | jq -r '.[] | select(.state == "held") | .name'
  dlock list --prefix jobs: --limit 50

Exit codes: 0 ok (also when nothing matches), 64 usage error, 69 Redis
unavailable (quorum mode: fewer than a majority of the masters answer), 1
any other error.

Flags:
`

// runList is "dlock list".
func runList(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs, fl, usageErr := newInspect("dlock list", stderr)
	limit := fs.Int("limit", 1000, "show at most `N` locks (0: no limit)")
	pos, code, ok := parseInspect(fs, args, listUsage, stdout, usageErr)
	if !ok {
		return code
	}
	pattern := "*"
	switch {
	case len(pos) > 1:
		return usageErr(fmt.Errorf("unexpected argument %q (one PATTERN; quote it so the shell leaves it alone)", pos[1]))
	case len(pos) == 1:
		pattern = pos[0]
	}
	if pattern == "" {
		return usageErr(errors.New("PATTERN is empty"))
	}
	if *limit < 0 {
		return usageErr(fmt.Errorf("--limit %d is negative", *limit))
	}
	targets, code := fl.targets(stderr, "dlock list")
	if targets == nil {
		return code
	}
	if len(targets) > 1 {
		infos, more, code := listQuorum(ctx, targets, *fl.prefix, pattern, *limit, stderr)
		if infos == nil {
			return code
		}
		return writeListed(stdout, stderr, infos, more, *limit, *fl.json, writeQuorumList)
	}
	rdb, code := connectOne(ctx, targets[0], stderr, "dlock list")
	if rdb == nil {
		return code
	}
	defer rdb.Close()

	infos, more, err := listLocks(ctx, rdb, *fl.prefix, pattern, *limit)
	if err != nil {
		return reportRedisErr(ctx, stderr, "dlock list", err)
	}
	slices.SortFunc(infos, func(a, b lockInfo) int { return strings.Compare(a.Name, b.Name) })
	return writeListed(stdout, stderr, infos, more, *limit, *fl.json, writeList)
}

// writeListed prints what list found, a note on stderr first when there
// may be more than limit: JSON, or the table that table writes (a line
// saying so when nothing matched).
func writeListed[T any](stdout, stderr io.Writer, infos []T, more bool, limit int, asJSON bool, table func(io.Writer, []T)) int {
	if more {
		fmt.Fprintf(stderr, "dlock list: showing the first %d matches; there may be more (--limit)\n", limit)
	}
	switch {
	case asJSON:
		return writeJSON(stdout, stderr, "dlock list", infos)
	case len(infos) == 0:
		fmt.Fprintln(stdout, "no locks match")
	default:
		table(stdout, infos)
	}
	return exitOK
}

// listLocks scans every master for prefix{pattern} and inspects what it
// finds. It stops after limit locks (0: no limit) and then reports more.
func listLocks(ctx context.Context, rdb redis.UniversalClient, prefix, pattern string, limit int) (infos []lockInfo, more bool, err error) {
	match := globEscape(prefix) + "{" + pattern + "}"
	var mu sync.Mutex
	infos = []lockInfo{} // "[]" in JSON when nothing matches
	// full reports whether limit is reached; called with mu held.
	full := func() bool { return limit > 0 && len(infos) >= limit }
	scanNode := func(ctx context.Context, node redis.Cmdable) error {
		var cursor uint64
		// SCAN ends when the cursor comes back to 0; each call is bounded
		// by COUNT and by inspectTimeout.
		for {
			sctx, cancel := context.WithTimeout(ctx, inspectTimeout)
			keys, next, err := node.Scan(sctx, cursor, match, scanCount).Result()
			if err == nil && len(keys) > 0 {
				var batch []lockInfo
				batch, err = inspect(sctx, node, prefix, keys)
				mu.Lock()
				for _, i := range batch {
					if full() {
						more = true
						break
					}
					infos = append(infos, i)
				}
				mu.Unlock()
			}
			cancel()
			if err != nil {
				return err
			}
			mu.Lock()
			if full() && next != 0 {
				more = true // possibly: the rest of the scan may match nothing
			}
			stop := more
			mu.Unlock()
			if next == 0 || stop {
				return nil
			}
			cursor = next
		}
	}
	if c, ok := rdb.(*redis.ClusterClient); ok {
		err = c.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			return scanNode(ctx, node)
		})
	} else {
		err = scanNode(ctx, rdb)
	}
	if err != nil {
		return nil, false, err
	}
	return infos, more, nil
}

// globEscape quotes the characters that are special in Redis's MATCH glob.
func globEscape(s string) string {
	var b strings.Builder
	for _, r := range s {
		if strings.ContainsRune(`*?[]\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// writeList prints locks as a table.
func writeList(w io.Writer, infos []lockInfo) {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tTYPE\tSTATE\tFENCE\tTTL\tCLIENTS WAITING\tIN LINE\tTOKEN")
	for _, i := range infos {
		typ := i.Type
		if i.Type == "foreign" {
			typ = "foreign:" + i.RedisType
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\n", textSafe(i.Name), typ, i.State, fenceCell(i.Fence), formatTTL(i.TTLMillis), i.WaitingClients, i.InLine, cell(textSafe(i.Token)))
	}
	_ = tw.Flush()
}

// fenceCell is a fence for a table: "-" for none.
func fenceCell(f uint64) string {
	if f == 0 {
		return "-"
	}
	return strconv.FormatUint(f, 10)
}

// cell is s for a table: "-" when empty.
func cell(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
