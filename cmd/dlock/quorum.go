// This file is quorum mode: given 3 or more --redis masters, dlock run takes
// its lock with the library's NewQuorum (on a majority of them), and
// status, list and unlock show or act on every master.

package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/wire"
)

// majority is how many of n masters a quorum lock needs, as NewQuorum
// counts.
func majority(n int) int { return n/2 + 1 }

// restartDelayVar defines --restart-delay on fs.
func restartDelayVar(fs *flag.FlagSet, d *time.Duration) {
	durationVar(fs, d, "restart-delay", dlock.DefaultRestartDelay, 0, 0, "30s",
		"quorum mode: how long a master whose data is new (restarted without persistence) does not vote, a `duration`; "+
			"every client of the quorum must use the same, at least the longest --ttl (the library's WithRestartDelay; 0 turns the check off)")
}

// dialMasters makes a client of each master and checks them all at once
// (PING within redisPingTimeout, as connect does). errs[i] is master i's
// failure; its client is made all the same, for a master that comes back.
func dialMasters(ctx context.Context, targets []*redisTarget) ([]redis.UniversalClient, []error) {
	rdbs := make([]redis.UniversalClient, len(targets))
	errs := make([]error, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		rdbs[i] = t.newClient()
		wg.Go(func() { errs[i] = t.checkServer(ctx, rdbs[i]) })
	}
	wg.Wait()
	return rdbs, errs
}

// closeClients closes every client of rdbs.
func closeClients(rdbs []redis.UniversalClient) error {
	for _, r := range rdbs {
		_ = r.Close()
	}
	return nil
}

// quorumErr is what errs, one per master (nil for a master that answered),
// make of the quorum: a master that refuses what its URL asks (a
// badTargetError, exit 64), else a quorumDownError if fewer than a
// majority answered, else nil.
func quorumErr(errs []error) error {
	down := 0
	for _, err := range errs {
		switch {
		case err == nil:
		case connectExitCode(err) == exitUsage:
			return err
		default:
			down++
		}
	}
	if len(errs)-down < majority(len(errs)) {
		return &quorumDownError{errs: errs}
	}
	return nil
}

// quorumDownError is a quorum of which fewer than a majority of the
// masters answered (exit 69).
type quorumDownError struct {
	errs []error // one per master, nil for one that answered
}

func (e *quorumDownError) Error() string {
	var down []string
	for _, err := range e.errs {
		if err != nil {
			down = append(down, err.Error())
		}
	}
	n := len(e.errs)
	return fmt.Sprintf("only %d of the quorum's %d masters answer, and a lock needs a majority (%d): %s",
		n-len(down), n, majority(n), strings.Join(down, "; "))
}

func (e *quorumDownError) Unwrap() []error {
	var out []error
	for _, err := range e.errs {
		if err != nil {
			out = append(out, err)
		}
	}
	return out
}

// onMasters runs f on every master whose errs entry is nil, all at once,
// each within inspectTimeout, and returns each master's result and error
// (a master skipped keeps its error).
func onMasters[T any](ctx context.Context, rdbs []redis.UniversalClient, errs []error, f func(ctx context.Context, rdb redis.UniversalClient) (T, error)) ([]T, []error) {
	out := make([]T, len(rdbs))
	errs = slices.Clone(errs)
	var wg sync.WaitGroup
	for i, rdb := range rdbs {
		if errs[i] != nil {
			continue
		}
		wg.Go(func() {
			ictx, cancel := context.WithTimeout(ctx, inspectTimeout)
			defer cancel()
			out[i], errs[i] = f(ictx, rdb)
		})
	}
	wg.Wait()
	return out, errs
}

// eachMaster connects to every master of targets and runs f on those that
// answer, as onMasters does. A master that refuses what its URL asks is a
// usage error: then err is set and nothing runs.
func eachMaster[T any](ctx context.Context, targets []*redisTarget, f func(ctx context.Context, rdb redis.UniversalClient) (T, error)) ([]T, []error, error) {
	rdbs, errs := dialMasters(ctx, targets)
	defer closeClients(rdbs)
	if err := quorumErr(errs); err != nil && connectExitCode(err) == exitUsage {
		return nil, nil, err
	}
	out, errs := onMasters(ctx, rdbs, errs, f)
	return out, errs, nil
}

// masterErrText is a master's error for a line or field that names the
// master already.
func masterErrText(err error) string {
	var ue *unreachableError
	if errors.As(err, &ue) {
		return "unreachable: " + ue.err.Error()
	}
	return err.Error()
}

// masterVote is whether a master votes in quorum mode: a master whose data
// is younger than the restart delay refuses to (dlock.WithRestartDelay).
type masterVote struct {
	Votes bool `json:"votes"`
	// EpochMillis is the start in the master's epoch key (PREFIX +
	// "epoch"): since when, server ms, its process has held its data.
	// Absent while the key is missing (the next lock call sets it from
	// the uptime) or names another process (it dates them from then).
	EpochMillis *int64 `json:"epoch_ms,omitempty"`
	// DataAgeMillis is how old the master's data is: since its epoch, or,
	// without an epoch key, its uptime (what a client will set it from).
	DataAgeMillis int64 `json:"data_age_ms"`
	// VotesInMillis is how long until it votes, when it does not yet.
	VotesInMillis int64 `json:"votes_in_ms,omitempty"`
}

// readVote reads whether the master rdb votes with restart delay delay:
// its clock, its epoch key and its uptime, in one round trip.
func readVote(ctx context.Context, rdb redis.Cmdable, epochKey string, delay time.Duration) (masterVote, error) {
	var v masterVote
	var clock *redis.TimeCmd
	var epoch, info *redis.StringCmd
	_, _ = rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		clock, epoch, info = p.Time(ctx), p.Get(ctx, epochKey), p.Info(ctx, "server")
		return nil
	})
	for _, c := range []redis.Cmder{clock, info} {
		if err := c.Err(); err != nil {
			return v, err
		}
	}
	now := clock.Val().UnixMilli()
	run, _ := infoField(info.Val(), "run_id")
	start, erun, parsed := parseEpoch(epoch.Val())
	switch {
	case errors.Is(epoch.Err(), redis.Nil):
		// The next lock call dates the data from the process's start,
		// a second late (uptime is counted in whole seconds).
		up, ok := infoInt(info.Val(), "uptime_in_seconds")
		if !ok {
			return v, errors.New("INFO server has no uptime_in_seconds (Redis 7 or later is needed)")
		}
		v.DataAgeMillis = max(0, up*1000-1000)
	case epoch.Err() != nil:
		return v, fmt.Errorf("reading the epoch key %q: %w", epochKey, epoch.Err())
	case !parsed || erun != run:
		// Another process's data (a restart from a snapshot or AOF, a
		// failover): the next lock call dates them from then.
		v.DataAgeMillis = 0
	default:
		v.EpochMillis = &start
		v.DataAgeMillis = now - start
	}
	v.Votes = v.DataAgeMillis >= delay.Milliseconds()
	if !v.Votes {
		v.VotesInMillis = delay.Milliseconds() - v.DataAgeMillis
	}
	return v, nil
}

// infoInt returns the integer field name of an INFO reply.
func infoInt(info, name string) (int64, bool) {
	v, ok := infoField(info, name)
	n, err := strconv.ParseInt(v, 10, 64)
	return n, ok && err == nil
}

// infoField returns the field name of an INFO reply.
func infoField(info, name string) (string, bool) {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v, true
		}
	}
	return "", false
}

// parseEpoch reads a master's epoch key, "START RUN_ID" (see
// quorum_acquire.lua): since when, in server ms, the process RUN_ID has
// held the master's data.
func parseEpoch(e string) (start int64, run string, ok bool) {
	s, run, found := strings.Cut(e, " ")
	start, err := strconv.ParseInt(s, 10, 64)
	return start, run, found && err == nil && run != ""
}

// voteText says whether a master votes, for a table cell.
func voteText(v masterVote) string {
	age := shortDuration(time.Duration(v.DataAgeMillis) * time.Millisecond / time.Second * time.Second)
	in := shortDuration(time.Duration(v.VotesInMillis) * time.Millisecond)
	switch {
	case v.EpochMillis == nil && v.Votes:
		return "yes, once a client sets its epoch key (up " + age + ")"
	case v.EpochMillis == nil:
		return "no: up " + age + ", votes in " + in + " (no epoch key yet)"
	case v.Votes:
		return "yes (data " + age + " old)"
	}
	return "no: data " + age + " old, votes in " + in
}

// lockServers is where dlock run takes its lock: one Redis deployment
// (one client) or the masters of a quorum.
type lockServers struct {
	targets []*redisTarget
	rdbs    []redis.UniversalClient
	// epochKey and delay: the quorum's epoch key and restart delay, to
	// tell whether its masters vote.
	epochKey string
	delay    time.Duration
}

func (s lockServers) quorum() bool { return len(s.rdbs) > 1 }

// where names the servers in a message: "Redis at URL", or "the quorum of
// N masters".
func (s lockServers) where() string {
	if s.quorum() {
		return fmt.Sprintf("the quorum of %d masters", len(s.rdbs))
	}
	return "Redis at " + s.targets[0].display
}

func (s lockServers) close() error { return closeClients(s.rdbs) }

// available says, within d, why no lock could be granted now: the server
// does not answer PING, or fewer than a majority of the masters answer and
// vote. nil: it could.
func (s lockServers) available(ctx context.Context, d time.Duration) error {
	if !s.quorum() {
		return pingWithin(ctx, s.rdbs[0], d)
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d)
	defer cancel()
	votes, errs := onMasters(actx, s.rdbs, make([]error, len(s.rdbs)), func(ctx context.Context, rdb redis.UniversalClient) (masterVote, error) {
		return readVote(ctx, rdb, s.epochKey, s.delay)
	})
	var why []string
	for i, v := range votes {
		switch {
		case errs[i] != nil:
			why = append(why, s.targets[i].display+": "+masterErrText(errs[i]))
		case !v.Votes:
			why = append(why, s.targets[i].display+": not voting: "+strings.TrimPrefix(voteText(v), "no: "))
		}
	}
	n := len(s.rdbs)
	if n-len(why) >= majority(n) {
		return nil
	}
	return fmt.Errorf("%d of %d masters answer and vote, and a lock needs %d: %s", n-len(why), n, majority(n), strings.Join(why, "; "))
}

// whatKeyIs is whatKeyIs on the masters: what the key of lock name holds
// on the first whose key is not a dlock mutex, else fallback.
func (s lockServers) whatKeyIs(ctx context.Context, prefix, name, fallback string) string {
	for i, rdb := range s.rdbs {
		if what := whatKeyIs(ctx, rdb, prefix, name, ""); what != "" {
			if s.quorum() {
				return "on master " + s.targets[i].display + ", " + what
			}
			return what
		}
	}
	return fallback
}

// connectRun connects to the servers of dlock run. A quorum needs a
// majority of its masters to answer; each one that does not is reported
// on stderr, and kept (the library counts it again once it answers).
func connectRun(ctx context.Context, f runFlags, stderr io.Writer) (lockServers, error) {
	s := lockServers{targets: f.targets, epochKey: wire.EpochKey(f.prefix), delay: f.restartDelay}
	if len(f.targets) == 1 {
		rdb, err := f.targets[0].connect(ctx)
		if err != nil {
			return s, err
		}
		s.rdbs = []redis.UniversalClient{rdb}
		return s, nil
	}
	rdbs, errs := dialMasters(ctx, f.targets)
	if err := quorumErr(errs); err != nil {
		_ = closeClients(rdbs)
		return s, err
	}
	s.rdbs = rdbs
	for i, err := range errs {
		if err != nil {
			fmt.Fprintf(stderr, "dlock run: master %s: %s; going on with the others (%d of %d needed)\n",
				f.targets[i].display, masterErrText(err), majority(len(errs)), len(errs))
		}
	}
	return s, nil
}

// checkQuorumRun refuses dlock run's flags that quorum mode cannot honour,
// and the quorum-only flags without a quorum.
func checkQuorumRun(fs *flag.FlagSet, f runFlags) error {
	if len(f.targets) == 1 {
		return quorumOnly(fs, f.targets, "node-timeout", "restart-delay")
	}
	switch {
	case f.fair:
		return errors.New("--fair does not work in quorum mode: independent masters have no one line to wait in (drop --fair, or use one server)")
	case f.replicaAck > 0:
		return fmt.Errorf("--replica-ack %d does not apply to quorum mode: a majority of independent masters stands in for replicas", f.replicaAck)
	case f.restartDelay > 0 && f.ttl > f.restartDelay:
		return fmt.Errorf("--ttl %s is above --restart-delay %s: a master that restarted could vote while such a lease is still valid; raise --restart-delay (the same on every client of the quorum) or shorten --ttl",
			shortDuration(f.ttl), shortDuration(f.restartDelay))
	case f.nodeTimeout >= f.ttl:
		return fmt.Errorf("--node-timeout %s is not below --ttl %s: a master's grant could expire before its answer counts",
			shortDuration(f.nodeTimeout), shortDuration(f.ttl))
	}
	return nil
}

// newQuorumClient makes the library's quorum Client over s's masters.
func newQuorumClient(s lockServers, f runFlags) (*dlock.Client, error) {
	return dlock.NewQuorum(s.rdbs, dlock.WithPrefix(f.prefix), dlock.WithNodeTimeout(f.nodeTimeout), dlock.WithRestartDelay(f.restartDelay))
}

// quorumInfo is what status and list show of a lock in quorum mode: what
// the masters hold together, and (status) each master's view.
type quorumInfo struct {
	Name string `json:"name"`
	Key  string `json:"key"`
	// Type is lockInfo's Type of the keys the masters hold ("none" if
	// none has one), or "mixed" when they differ.
	Type string `json:"type"`
	// State is "held" (a majority of the masters hold it for one owner),
	// "partial" (some hold it, but no majority for one owner: an acquire
	// under way, or one that failed, whose grants expire at their TTL),
	// "free", or "unknown" (a master's key is not a dlock mutex).
	State string `json:"state"`
	// Token is the owner that holds it on the most masters, HeldOn how
	// many.
	Token  string `json:"token,omitempty"`
	HeldOn int    `json:"held_on"`
	// Fence is Token's fence: the one a majority of its masters have (see
	// onMajority); without a holder, the largest fence any master granted.
	Fence uint64 `json:"fence,omitempty"`
	// TTLMillis is, while held, the lease left on a majority: at least
	// that long on Majority masters.
	TTLMillis int64 `json:"ttl_ms,omitempty"`
	Masters   int   `json:"masters"`
	Majority  int   `json:"majority"`
	// Answered counts the masters that answered.
	Answered int `json:"answered"`
	// WaitingClients: the most on any master (a quorum waiter listens on
	// every master).
	WaitingClients int64 `json:"waiting_clients"`
	// Voting and RestartDelayMillis (status only): the masters that vote,
	// by the restart delay given.
	Voting             *int   `json:"voting,omitempty"`
	RestartDelayMillis *int64 `json:"restart_delay_ms,omitempty"`
	// PerMaster (status only) is each master's view, in --redis order.
	PerMaster []masterView `json:"per_master,omitempty"`
}

// masterView is one master's view of a lock.
type masterView struct {
	Master string `json:"master"` // its URL, secrets replaced
	// Error is why the master could not be read; then Lock and Vote are
	// absent.
	Error string `json:"error,omitempty"`
	// Lock is what the master holds, as dlock status shows one server.
	Lock *lockInfo   `json:"lock,omitempty"`
	Vote *masterVote `json:"vote,omitempty"`
}

// summarize combines the masters' views of one lock (nil: the master did
// not answer).
func summarize(name, key string, locks []*lockInfo) quorumInfo {
	n := len(locks)
	q := quorumInfo{Name: name, Key: key, Type: "none", State: "free", Masters: n, Majority: majority(n)}
	count := map[string]int{}
	unknown := false
	var fence uint64
	for _, l := range locks {
		if l == nil {
			continue
		}
		q.Answered++
		q.WaitingClients = max(q.WaitingClients, l.WaitingClients)
		fence = max(fence, l.Fence)
		switch {
		case l.Type == "none":
		case q.Type == "none":
			q.Type = l.Type
		case q.Type != l.Type:
			q.Type = "mixed"
		}
		unknown = unknown || l.Type != wire.KindMutex && l.Type != "none"
		if l.Token != "" {
			count[l.Token]++
		}
	}
	for tok, c := range count {
		if c > q.HeldOn || c == q.HeldOn && tok < q.Token {
			q.Token, q.HeldOn = tok, c
		}
	}
	var ttls []int64
	var fences []uint64
	for _, l := range locks {
		if l != nil && q.Token != "" && l.Token == q.Token {
			fences = append(fences, l.Fence)
			ttls = append(ttls, l.TTLMillis)
		}
	}
	q.Fence = fence
	if q.Token != "" {
		q.Fence = onMajority(fences, q.Majority)
	}
	switch {
	case unknown:
		q.State = "unknown"
	case q.HeldOn >= q.Majority:
		q.State = "held"
		q.TTLMillis = onMajority(ttls, q.Majority)
	case q.HeldOn > 0:
		q.State = "partial"
	}
	return q
}

// onMajority is the value that at least maj of vals reach: the maj-th
// largest, or the largest if there are fewer. Of a holder's fences it is
// the lease's own: the majority that granted it first has it, while a
// master that granted later has a fence of its own clock, above or below.
func onMajority[T cmp.Ordered](vals []T, maj int) T {
	var zero T
	if len(vals) == 0 {
		return zero
	}
	s := slices.Sorted(slices.Values(vals))
	return s[max(len(s)-maj, 0)]
}

// stateText is the state line of a quorum lock: the state and the count
// that makes it.
func stateText(q quorumInfo) string {
	count := fmt.Sprintf("held on %d of %d masters; a majority is %d", q.HeldOn, q.Masters, q.Majority)
	switch q.State {
	case "partial":
		return "partial (" + count + ": an acquire under way, or grants of one that failed, which expire at their TTL)"
	case "unknown":
		return "unknown (a master's key is not a dlock mutex: see below)"
	}
	return q.State + " (" + count + ")"
}

// readMasterViews reads every master's view of the lock key: what it
// holds and whether it votes.
func readMasterViews(ctx context.Context, targets []*redisTarget, prefix, key string, delay time.Duration) ([]masterView, error) {
	type read struct {
		lock lockInfo
		vote masterVote
	}
	reads, errs, err := eachMaster(ctx, targets, func(ctx context.Context, rdb redis.UniversalClient) (read, error) {
		var r read
		infos, err := inspect(ctx, rdb, prefix, []string{key})
		if err != nil {
			return r, err
		}
		r.lock = infos[0]
		r.vote, err = readVote(ctx, rdb, wire.EpochKey(prefix), delay)
		return r, err
	})
	if err != nil {
		return nil, err
	}
	views := make([]masterView, len(targets))
	for i, t := range targets {
		views[i].Master = t.display
		if errs[i] != nil {
			views[i].Error = masterErrText(errs[i])
			continue
		}
		views[i].Lock, views[i].Vote = &reads[i].lock, &reads[i].vote
	}
	return views, nil
}

// statusQuorum is dlock status in quorum mode: the lock as the masters
// hold it together, then each master's view. It exits 69 when fewer than a
// majority of the masters answered, after showing what it could read.
func statusQuorum(ctx context.Context, targets []*redisTarget, fl inspectFlags, name string, delay time.Duration, stdout, stderr io.Writer) int {
	key := wire.HashKey(*fl.prefix, name)
	views, err := readMasterViews(ctx, targets, *fl.prefix, key, delay)
	if err != nil {
		return reportRedisErr(ctx, stderr, "dlock status", err)
	}
	locks := make([]*lockInfo, len(views))
	voting := 0
	for i, v := range views {
		locks[i] = v.Lock
		if v.Vote != nil && v.Vote.Votes {
			voting++
		}
	}
	q := summarize(name, key, locks)
	delayMs := delay.Milliseconds()
	q.Voting, q.RestartDelayMillis, q.PerMaster = &voting, &delayMs, views
	code := exitOK
	if *fl.json {
		code = writeJSON(stdout, stderr, "dlock status", q)
	} else {
		writeQuorumStatus(stdout, q, delay)
	}
	if q.Answered < q.Majority {
		if ctx.Err() != nil {
			return reportRedisErr(ctx, stderr, "dlock status", ctx.Err())
		}
		fmt.Fprintf(stderr, "dlock status: only %d of the quorum's %d masters answered, and a lock needs a majority (%d)\n", q.Answered, q.Masters, q.Majority)
		return exitUnavailable
	}
	return code
}

// writeQuorumStatus prints a quorum lock as "field value" lines, then a
// table of the masters' views.
func writeQuorumStatus(w io.Writer, q quorumInfo, delay time.Duration) {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "lock\t%s\n", textSafe(q.Name))
	fmt.Fprintf(tw, "key\t%s\n", textSafe(q.Key))
	fmt.Fprintf(tw, "type\t%s\n", q.Type)
	fmt.Fprintf(tw, "state\t%s\n", stateText(q))
	if q.Token != "" {
		fmt.Fprintf(tw, "token\t%s\n", textSafe(q.Token))
	}
	if q.Fence != 0 {
		fmt.Fprintf(tw, "fence\t%d\n", q.Fence)
	}
	if q.State == "held" {
		fmt.Fprintf(tw, "ttl\t%s (lease left on a majority)\n", formatTTL(q.TTLMillis))
	}
	fmt.Fprintf(tw, "voting\t%d of %d masters (restart delay %s)\n", *q.Voting, q.Masters, shortDuration(delay))
	fmt.Fprintf(tw, "waiting\t%s\n", waitingText(lockInfo{WaitingClients: q.WaitingClients}))
	_ = tw.Flush()
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "MASTER\tLOCK\tTOKEN\tFENCE\tTTL\tVOTES")
	for _, v := range q.PerMaster {
		if v.Lock == nil {
			fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t%s\n", v.Master, v.Error)
			continue
		}
		l := v.Lock
		state := l.State
		switch {
		case l.Type == "none":
			state = "none"
		case l.Type != wire.KindMutex:
			state = l.Type
			if l.Type == "foreign" {
				state = "foreign:" + l.RedisType
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", v.Master, state, cell(textSafe(tokenPrefix(l.Token))), fenceCell(l.Fence), formatTTL(l.TTLMillis), voteText(*v.Vote))
	}
	_ = tw.Flush()
}

// tokenPrefix is the first characters of an owner token, enough to tell
// holders apart in a table (the summary and --json show it whole).
func tokenPrefix(token string) string {
	if len(token) <= 8 {
		return token
	}
	return token[:8] + "…"
}

// listQuorum is dlock list in quorum mode: the names found on any master
// that answered, sorted, each summed up over the masters as status does.
// Without a majority answering it reports the error and returns no infos
// and the exit code.
func listQuorum(ctx context.Context, targets []*redisTarget, prefix, pattern string, limit int, stderr io.Writer) (infos []quorumInfo, more bool, code int) {
	type found struct {
		infos []lockInfo
		more  bool
	}
	lists, errs, err := eachMaster(ctx, targets, func(ctx context.Context, rdb redis.UniversalClient) (found, error) {
		infos, more, err := listLocks(ctx, rdb, prefix, pattern, limit)
		return found{infos, more}, err
	})
	if err == nil {
		err = quorumErr(errs)
	}
	if err != nil {
		return nil, false, reportRedisErr(ctx, stderr, "dlock list", err)
	}
	n := len(targets)
	byName := map[string][]*lockInfo{}
	for i, l := range lists {
		if errs[i] != nil {
			fmt.Fprintf(stderr, "dlock list: master %s left out: %s\n", targets[i].display, masterErrText(errs[i]))
			continue
		}
		more = more || l.more
		for _, info := range l.infos {
			if byName[info.Name] == nil {
				byName[info.Name] = make([]*lockInfo, n)
			}
			byName[info.Name][i] = &info
		}
	}
	infos = []quorumInfo{} // "[]" in JSON when nothing matches
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		locks := byName[name]
		key := ""
		for i, l := range locks {
			switch {
			case l != nil:
				key = l.Key
			case errs[i] == nil: // answered: it has no such key
				locks[i] = &lockInfo{Type: "none", State: "free", TTLMillis: -2}
			}
		}
		infos = append(infos, summarize(name, key, locks))
	}
	if limit > 0 && len(infos) > limit {
		infos, more = infos[:limit], true
	}
	return infos, more, exitOK
}

// writeQuorumList prints quorum locks as a table.
func writeQuorumList(w io.Writer, infos []quorumInfo) {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tTYPE\tSTATE\tHELD ON\tFENCE\tTTL\tCLIENTS WAITING\tTOKEN")
	for _, q := range infos {
		ttl := "-"
		if q.State == "held" {
			ttl = formatTTL(q.TTLMillis)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s\t%s\t%d\t%s\n", textSafe(q.Name), q.Type, q.State, q.HeldOn, q.Masters, fenceCell(q.Fence), ttl, q.WaitingClients, cell(textSafe(q.Token)))
	}
	_ = tw.Flush()
}

// masterUnlock is what dlock unlock --force did on one master.
type masterUnlock struct {
	Master  string `json:"master"`
	Removed bool   `json:"removed"`
	// Token and Fence: the holder removed, or left (another token than
	// --token).
	Token string `json:"token,omitempty"`
	Fence uint64 `json:"fence,omitempty"`
	Error string `json:"error,omitempty"`
}

// unlockQuorum is dlock unlock --force in quorum mode: the holder is
// removed on every master that answers, each reported. It exits 0 if it
// removed a holder somewhere and a majority answered (the holder then
// holds the lock on too few masters to keep it), 69 if fewer than a
// majority answered, 1 if nothing was removed.
func unlockQuorum(ctx context.Context, targets []*redisTarget, fl inspectFlags, name, token string, idle time.Duration, stdout, stderr io.Writer) int {
	type done struct {
		res    unlockResult
		status int64
	}
	dones, errs, err := eachMaster(ctx, targets, func(ctx context.Context, rdb redis.UniversalClient) (done, error) {
		res, status, err := forceUnlock(ctx, rdb, *fl.prefix, name, token, idle)
		if err != nil && isForeignReply(err) {
			err = errors.New(whatKeyIs(ctx, rdb, *fl.prefix, name, fmt.Sprintf("Redis key %q is not a dlock mutex", res.Key)) + "; left as it is")
		}
		return done{res, status}, err
	})
	if err != nil {
		return reportRedisErr(ctx, stderr, "dlock unlock", err)
	}
	res := unlockResult{Name: name, Key: wire.HashKey(*fl.prefix, name)}
	var per []masterUnlock
	var fences []uint64 // of the holder removed
	answered, removed := 0, 0
	tw := tabwriter.NewWriter(stdout, 0, 8, 2, ' ', 0)
	for i, d := range dones {
		m := masterUnlock{Master: targets[i].display, Token: d.res.Token, Fence: d.res.Fence}
		var what string
		switch {
		case errs[i] != nil:
			m.Token, m.Fence = "", 0
			m.Error = masterErrText(errs[i])
			what = m.Error
			if !redisDown(errs[i]) { // it answered: the key is not a mutex
				answered++
			}
		case d.status == unlockRemoved:
			answered++
			removed++
			m.Removed = true
			what = fmt.Sprintf("removed token %s, fence %d", textSafe(m.Token), m.Fence)
			if !res.Removed || res.Token == m.Token { // a holder of the token's
				res.Removed, res.Token = true, m.Token
				fences = append(fences, m.Fence)
			}
		case d.status == unlockOtherToken:
			answered++
			what = fmt.Sprintf("held by token %s (fence %d), not by --token; left as it is", textSafe(m.Token), m.Fence)
		default:
			answered++
			what = "not held"
		}
		per = append(per, m)
		if !*fl.json {
			fmt.Fprintf(tw, "%s\t%s\n", m.Master, what)
		}
	}
	_ = tw.Flush()
	res.Fence = onMajority(fences, majority(len(targets)))
	n := len(targets)
	code := exitOK
	switch {
	case answered < majority(n):
		code = exitUnavailable
		fmt.Fprintf(stderr, "dlock unlock: only %d of the quorum's %d masters answered (a majority is %d): the holder may keep lock %q on the others until its TTL\n", answered, n, majority(n), name)
	case removed == 0:
		code = exitFailed
		held := "held"
		if token != "" {
			held = "held by --token " + textSafe(token)
		}
		fmt.Fprintf(stderr, "dlock unlock: lock %q is not %s on any master; nothing removed\n", name, held)
	case !*fl.json:
		fmt.Fprintf(stdout, "removed the holder of lock %q on %d of %d masters; waiters notified\n", name, removed, n)
	}
	if *fl.json {
		out := struct {
			unlockResult
			PerMaster []masterUnlock `json:"per_master"`
		}{res, per}
		if c := writeJSON(stdout, stderr, "dlock unlock", out); c != exitOK {
			return c
		}
	}
	return code
}
