package rueidisdlock

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/internal/wire"
	"github.com/redis/rueidis"
)

// slotMap is this driver's own copy of a Cluster's slot map, read with
// CLUSTER SLOTS: dlock places each subscription on the master of its
// channel's slot and sends WAIT to the master of a lock's slot, and rueidis
// does not export its map. rueidis follows MOVED and ASK for commands by
// itself, so a stale copy costs only a misplaced subscription (refused or
// moved by the hub) or a WAIT on the wrong master (counted as too few
// replicas), until the next reload.
type slotMap struct {
	c       rueidis.Client
	tbl     atomic.Pointer[[]slotRange] // sorted by start
	loading atomic.Bool
	mu      sync.Mutex
	last    time.Time // when the last reload started
}

type slotRange struct {
	start, end uint16
	addr       string
}

// reloadGap coalesces reloads asked for in a burst.
const reloadGap = 200 * time.Millisecond

func newSlotMap(c rueidis.Client) *slotMap { return &slotMap{c: c} }

// master returns the address of the master that serves key's slot.
func (s *slotMap) master(ctx context.Context, key string) (string, error) {
	t := s.tbl.Load()
	if t == nil {
		if err := s.load(ctx); err != nil {
			return "", err
		}
		t = s.tbl.Load()
	}
	slot := wire.Slot(key)
	i, _ := slices.BinarySearchFunc(*t, slot, func(r slotRange, slot uint16) int {
		switch {
		case r.end < slot:
			return -1
		case r.start > slot:
			return 1
		}
		return 0
	})
	if i < len(*t) && (*t)[i].start <= slot && slot <= (*t)[i].end {
		return (*t)[i].addr, nil
	}
	s.reload()
	return "", fmt.Errorf("rueidisdlock: slot %d is served by no master in the slot map", slot)
}

// masters returns every master's address.
func (s *slotMap) masters(ctx context.Context) ([]string, error) {
	if s.tbl.Load() == nil {
		if err := s.load(ctx); err != nil {
			return nil, err
		}
	}
	var out []string
	for _, r := range *s.tbl.Load() {
		if !slices.Contains(out, r.addr) {
			out = append(out, r.addr)
		}
	}
	return out, nil
}

// reload reads the map again in the background, unless a reload runs or
// started less than reloadGap ago.
func (s *slotMap) reload() {
	s.mu.Lock()
	if time.Since(s.last) < reloadGap || !s.loading.CompareAndSwap(false, true) {
		s.mu.Unlock()
		return
	}
	s.last = time.Now()
	s.mu.Unlock()
	go func() {
		defer s.loading.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.load(ctx)
	}()
}

// load reads CLUSTER SLOTS: {start, end, {ip, port, id, ...}, replicas...}
// per range.
func (s *slotMap) load(ctx context.Context) error {
	rows, err := s.c.Do(ctx, s.c.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		return wrap(err)
	}
	t := make([]slotRange, 0, len(rows))
	for _, row := range rows {
		v, err := row.ToArray()
		if err != nil || len(v) < 3 {
			continue
		}
		start, err1 := v[0].AsInt64()
		end, err2 := v[1].AsInt64()
		m, err3 := v[2].ToArray()
		if err1 != nil || err2 != nil || err3 != nil || len(m) < 2 {
			continue
		}
		ip, err1 := m[0].ToString()
		port, err2 := m[1].AsInt64()
		if err1 != nil || err2 != nil || ip == "" || ip == "?" {
			continue
		}
		t = append(t, slotRange{uint16(start), uint16(end), net.JoinHostPort(ip, strconv.FormatInt(port, 10))})
	}
	if len(t) == 0 {
		return errors.New("rueidisdlock: CLUSTER SLOTS listed no master")
	}
	slices.SortFunc(t, func(a, b slotRange) int { return int(a.start) - int(b.start) })
	s.tbl.Store(&t)
	return nil
}
