package main

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// locker is what every measured implementation is reduced to: take a lock by
// key, waiting with the implementation's own waiting settings until it is
// obtained or ctx ends, and release it.
//
// Adapters build whatever per-lock handle their library wants on every call
// (redsync.NewMutex, dlock's Client.Mutex, ...): real code locks a different
// name each time (one per order, per item), so handle construction is part of
// the cost measured.
type locker interface {
	Lock(ctx context.Context, key string) (held, error)
	// Close releases what Open created (not the shared go-redis client).
	Close() error
}

// held is one holding of a lock. Adapters return pointer-shaped values
// (a pointer, or a struct of one pointer or func) so that the conversion
// to the interface adds no allocation of its own.
type held interface {
	Unlock(ctx context.Context) error
}

// env is what an implementation is opened with: the same server, the same
// go-redis client and the same lease length for everyone.
type env struct {
	url   string        // redis:// URL of the server
	rdb   *redis.Client // the go-redis client shared by every go-redis implementation
	ttl   time.Duration // lease length for every implementation
	retry time.Duration // retry delay of the polling implementations (raw, redsync, redislock)
}

type impl struct {
	name string
	// order places the implementation in tables (raw floor first).
	order int
	// settings says, in one line, how the implementation is configured,
	// above all how it waits on a held lock.
	settings func(e *env) string
	// open opens it on the shared client (the uncontended and hot-key
	// scenarios); nil (settings too): it runs only in the quorum scenario.
	open func(e *env) (locker, error)
	// quorum opens it on several masters (the quorum scenario); nil: it
	// cannot.
	quorum *quorumImpl
}

var registry = map[string]*impl{}

func register(i *impl) {
	if _, dup := registry[i.name]; dup {
		panic("bench: implementation registered twice: " + i.name)
	}
	registry[i.name] = i
}

// runsIn reports whether im runs in the quorum scenario (quorum) or in
// the others.
func (im *impl) runsIn(quorum bool) bool {
	if quorum {
		return im.quorum != nil
	}
	return im.open != nil
}

// knownImpls lists the compiled-in implementations of the quorum scenario
// (quorum) or of the others, in table order.
func knownImpls(quorum bool) []string {
	var names []string
	for n, im := range registry {
		if im.runsIn(quorum) {
			names = append(names, n)
		}
	}
	sort.Slice(names, func(a, b int) bool {
		ia, ib := registry[names[a]], registry[names[b]]
		if ia.order != ib.order {
			return ia.order < ib.order
		}
		return ia.name < ib.name
	})
	return names
}

// parseImpls checks a comma-separated list against the registry: each must
// run in the quorum scenario (quorum) or in the others.
func parseImpls(list string, quorum bool) ([]*impl, error) {
	var out []*impl
	seen := map[string]bool{}
	for _, n := range strings.Split(list, ",") {
		n = strings.TrimSpace(n)
		if n == "" || seen[n] {
			continue
		}
		seen[n] = true
		i, ok := registry[n]
		if !ok {
			hint := ""
			if strings.HasPrefix(n, "dlock") {
				hint = " (built with -tags nodlock?)"
			}
			return nil, fmt.Errorf("unknown implementation %q%s; compiled in: %s", n, hint, strings.Join(knownImpls(quorum), ","))
		}
		if !i.runsIn(quorum) {
			where := "the uncontended and hot-key scenarios (-impls, -hot-impls)"
			if quorum {
				where = "the quorum scenario (-quorum-impls)"
			}
			return nil, fmt.Errorf("%s does not run in %s; those that do: %s", n, where, strings.Join(knownImpls(quorum), ","))
		}
		out = append(out, i)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no implementation selected")
	}
	return out, nil
}
