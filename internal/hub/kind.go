package hub

import (
	"context"
	"errors"
	"strings"

	"github.com/dlock-go/dlock/internal/driver"
)

// Kind is which pub/sub a hub subscribes with. A subscriber hears only
// messages published with its own kind: SSUBSCRIBE hears SPUBLISH, and
// SUBSCRIBE hears PUBLISH.
type Kind uint8

const (
	// Sharded is SSUBSCRIBE and SPUBLISH: Redis 7.0 and later, and always on
	// a Cluster, where each channel lives on the master of its slot.
	Sharded Kind = iota + 1
	// Plain is SUBSCRIBE and PUBLISH, for a single server (or Sentinel)
	// without SPUBLISH: Redis before 7.0, miniredis, a server with the
	// command renamed away. Off Cluster a channel has one home either way,
	// the one server, so the hub behaves the same in both kinds.
	Plain
)

// String names the kind: "sharded", "plain" (or "unknown").
func (k Kind) String() string {
	switch k {
	case Sharded:
		return "sharded"
	case Plain:
		return "plain"
	}
	return "unknown"
}

// Detect finds out which kind of pub/sub drv's server offers. A Cluster is
// Sharded (see driver.Traits.Cluster); it is still sent the probe, so that a user
// refused it is told (NOPERM is returned), but no other reply or error
// changes the kind: the probe's slot being unreachable must not fail locks
// on every other slot. Otherwise it
// publishes one empty message with SPUBLISH on probe, a channel nobody
// subscribes to: a server that answers it does not know the command is
// Plain; any other reply shows that it knows SPUBLISH, so it is Sharded,
// except NOPERM, which is returned: a user whose ACL refuses the probe
// could not publish or subscribe on the locks' channels either. An error
// means it could not tell (the server did not answer, or refused): ask
// again later.
func Detect(ctx context.Context, drv driver.Conn, probe string) (Kind, error) {
	_, err := drv.Do(ctx, []any{"spublish", probe, ""}, false)
	if drv.Traits().Cluster {
		if err != nil && strings.HasPrefix(err.Error(), "NOPERM") {
			return 0, err
		}
		return Sharded, nil
	}
	var rerr driver.ReplyError
	switch {
	case err == nil:
		return Sharded, nil
	case !errors.As(err, &rerr):
		return 0, err
	case unknownCommand(err.Error()):
		return Plain, nil
	case strings.HasPrefix(err.Error(), "NOPERM"):
		return 0, err
	}
	return Sharded, nil
}

// unknownCommand reports whether a Redis error reply says that the command
// does not exist: "ERR unknown command 'spublish', with args beginning
// with: ..." (Redis quotes the name with ' and miniredis with `).
func unknownCommand(msg string) bool {
	return strings.HasPrefix(strings.ToLower(msg), "err unknown command")
}
