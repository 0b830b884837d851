package rueidisdlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/dlock-go/dlock/internal/driver"
	"github.com/redis/rueidis"
)

// conn is a driver.Conn over a rueidis client.
type conn struct {
	c      rueidis.Client
	traits driver.Traits
	slots  *slotMap // on a Cluster: where each slot's master is
	one    *node    // off Cluster: the one server
	batch  *batcher // off Cluster: Submit's pipeliner
	prim   *watch   // on Sentinel: which server is the primary (see watch)
}

var _ driver.Conn = (*conn)(nil)

func newConn(c rueidis.Client) *conn {
	k := &conn{c: c, prim: newWatch(c)}
	if c.Mode() == rueidis.ClientModeCluster {
		k.traits.Cluster, k.traits.Slots = true, true
		k.slots = newSlotMap(c)
	} else {
		k.one = &node{c: c, prim: k.prim}
		// Off Cluster every call goes to one server, so a batch waits on
		// nothing that its calls would not wait on alone. On a Cluster a
		// DoMulti waits for its slowest master: a paused one would hold
		// the calls for the others, so calls there stay apart.
		k.batch = &batcher{c: c, prim: k.prim}
		k.batch.flushFn = k.batch.flush
		k.traits.Pipelined, k.traits.EagerSubmit = true, true
	}
	// ContextAware false: calls are sent without the caller's
	// cancellation (see do) and dlock waits for them aside, so that a
	// reply that comes after ctx ended is still acted on. Resends false:
	// rueidis resends none of dlock's commands (see the package doc).
	return k
}

func (k *conn) Traits() driver.Traits { return k.traits }

// build turns a command line (see driver) into a rueidis command, with its
// keys marked so that a Cluster client routes it by their slot.
func build(b rueidis.Builder, line []any) rueidis.Completed {
	// The strings go into the command's own slice: a buffer on the stack
	// holds them until then (dlock's lines are short), saving an
	// allocation per call.
	var buf [12]string
	args := buf[:0]
	for _, a := range line {
		args = append(args, str(a))
	}
	nkeys, first := 0, 1
	switch args[0] {
	case "evalsha", "eval":
		nkeys, first = atoi(args[2]), 3
	case "exists", "spublish", "publish":
		nkeys = 1
	}
	args[0] = capitals(args[0])
	if nkeys == 0 || first+nkeys > len(args) {
		return b.Arbitrary(args...).Build()
	}
	return b.Arbitrary(args[:first]...).Keys(args[first : first+nkeys]...).Args(args[first+nkeys:]...).Build()
}

// capitals returns a command name of dlock's lines (see driver) in
// capitals, as a constant: rueidis upper-cases the name of every command
// built with Arbitrary to look at it, which costs an allocation per call
// unless the name is in capitals already. Redis reads a name in any case;
// one dlock does not send is left as it is.
func capitals(name string) string {
	switch name {
	case "evalsha":
		return "EVALSHA"
	case "eval":
		return "EVAL"
	case "exists":
		return "EXISTS"
	case "wait":
		return "WAIT"
	case "spublish":
		return "SPUBLISH"
	case "publish":
		return "PUBLISH"
	case "script":
		return "SCRIPT"
	}
	return name
}

func str(a any) string {
	switch v := a.(type) {
	case string:
		return v
	case *string:
		return *v
	case int:
		return strconv.Itoa(v)
	case int64:
		return strconv.FormatInt(v, 10)
	case uint64:
		return strconv.FormatUint(v, 10)
	case []byte:
		return string(v)
	}
	return fmt.Sprint(a)
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}

// Do implements driver.Conn. once needs nothing: rueidis resends no
// command built with Arbitrary (see the package doc). The caller's
// cancellation is dropped: dlock runs the call aside and takes the reply
// whenever it comes (driver.Traits.ContextAware is false).
func (k *conn) Do(ctx context.Context, line []any, once bool) (any, error) {
	if ctx.Done() != nil {
		ctx = context.WithoutCancel(ctx) // a ctx that cannot end needs no wrapper (it would cost an allocation)
	}
	m := k.prim.start()
	v, err := reply(k.c.Do(ctx, build(k.c.B(), line)))
	if k.prim.moved(m) {
		return nil, errReplaced
	}
	return v, err
}

// Pipe implements driver.Conn. Unlike Do it keeps ctx: dlock takes no late
// reply from a pipeline (renewals, a contended release), so a reply that
// ctx cut short is an unknown outcome either way.
func (k *conn) Pipe(ctx context.Context, lines [][]any, once bool) []driver.Reply {
	m := k.prim.start()
	return replaced(pipe(ctx, k.c, lines), k.prim.moved(m))
}

// replaced turns every reply of out into errReplaced if moved (see watch).
func replaced(out []driver.Reply, moved bool) []driver.Reply {
	if moved {
		for i := range out {
			out[i] = driver.Reply{Err: errReplaced}
		}
	}
	return out
}

func pipe(ctx context.Context, c rueidis.CoreClient, lines [][]any) []driver.Reply {
	cmds := make(rueidis.Commands, len(lines))
	for i, l := range lines {
		cmds[i] = build(c.B(), l)
	}
	out := make([]driver.Reply, len(lines))
	for i, r := range c.DoMulti(ctx, cmds...) {
		out[i].Val, out[i].Err = reply(r)
	}
	return out
}

// Submit implements driver.Conn through the batcher (off Cluster; Traits
// says so): the caller returns when ctx ends or stop is closed, and late
// gets the reply that comes after. rueidis resends no line built with
// Arbitrary, so every line is sent once. On a Cluster dlock never calls
// it; it then runs as Do.
func (k *conn) Submit(ctx context.Context, line []any, late func(any, error), goBg func(func()) bool, stop <-chan struct{}) (any, error) {
	if k.batch == nil {
		return k.Do(ctx, line, true)
	}
	return k.batch.do(ctx, build(k.c.B(), line), late, goBg, stop)
}

func (k *conn) Node(ctx context.Context, key string) (driver.Node, error) {
	if k.slots == nil {
		return k.one, nil
	}
	addr, err := k.slots.master(ctx, key)
	if err != nil {
		return nil, err
	}
	c, ok := k.c.Nodes()[addr]
	if !ok {
		k.slots.reload()
		return nil, fmt.Errorf("rueidisdlock: the client has no connection to %s, the master of %q's slot", addr, key)
	}
	return &node{c: c, addr: addr}, nil
}

// LoadScript loads src on the one server, or on every master of a Cluster.
func (k *conn) LoadScript(ctx context.Context, src string) error {
	if k.slots == nil {
		return k.c.Do(ctx, k.c.B().ScriptLoad().Script(src).Build()).Error()
	}
	masters, err := k.slots.masters(ctx)
	if err != nil {
		return err
	}
	nodes := k.c.Nodes()
	for _, addr := range masters {
		c, ok := nodes[addr]
		if !ok {
			return fmt.Errorf("rueidisdlock: the client has no connection to the master %s", addr)
		}
		if err := c.Do(ctx, c.B().ScriptLoad().Script(src).Build()).Error(); err != nil {
			return wrap(err)
		}
	}
	return nil
}

func (k *conn) ReloadSlots() {
	if k.slots != nil {
		k.slots.reload()
	}
}

// node is one primary; Pipe goes on one dedicated connection to it.
type node struct {
	c    rueidis.Client
	addr string
	prim *watch // on Sentinel (see watch)
}

func (n *node) Addr() string { return n.addr }

func (n *node) Pipe(ctx context.Context, lines [][]any, once bool) []driver.Reply {
	var out []driver.Reply
	m := n.prim.start()
	err := n.c.Dedicated(func(dc rueidis.DedicatedClient) error {
		out = pipe(context.WithoutCancel(ctx), dc, lines)
		return nil
	})
	if out == nil {
		out = make([]driver.Reply, len(lines))
		for i := range out {
			out[i].Err = cmpErr(err, errors.New("rueidisdlock: no dedicated connection"))
		}
	}
	return replaced(out, n.prim.moved(m))
}

func (n *node) PubSub(ctx context.Context) driver.PubSub { return newPubSub(n.c, n.prim) }

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// reply converts a rueidis result to the driver's shapes.
func reply(r rueidis.RedisResult) (any, error) {
	if err := r.Error(); err != nil {
		return nil, wrap(err)
	}
	v, err := r.ToAny()
	if err != nil {
		return nil, wrap(err)
	}
	if a, ok := v.([]any); ok {
		for i, e := range a {
			if re, ok := e.(*rueidis.RedisError); ok {
				a[i] = replyError{re}
			}
		}
	}
	return v, nil
}

// replyError is an error reply of the server (driver.ReplyError).
type replyError struct{ e *rueidis.RedisError }

// Error is the server's error line, as go-redis gives it: rueidis drops
// the code "ERR " from the front of every error, and dlock (as users who
// read its errors) matches lines as Redis sends them ("ERR unknown
// command", "ERR max number of clients"). Every error line begins with its
// code, a word in capitals, so a line that no longer does had "ERR ".
func (r replyError) Error() string {
	if r.e.IsNil() {
		return "redis: nil"
	}
	msg := r.e.Error()
	code, _, _ := strings.Cut(msg, " ")
	if code == "" || strings.TrimLeft(code, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != "" {
		return "ERR " + msg
	}
	return msg
}

func (replyError) RedisError() {}

func (r replyError) Unwrap() error { return r.e }

// wrap marks rueidis's error replies as driver.ReplyError; any other error
// is a failure to get a reply and stays as it is.
func wrap(err error) error {
	if re, ok := rueidis.IsRedisErr(err); ok {
		return replyError{re}
	}
	return err
}
