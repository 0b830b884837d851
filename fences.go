package dlock

import (
	"hash/maphash"
	"sync"
	"time"
)

// fenceMemo remembers, for the lock names a Client was granted lately,
// the highest fence it saw and when its reply came. A grant whose request
// was sent after that reply must carry a higher fence (the earlier grant
// happened at Redis before it); a lower one means the counter went
// backwards (a failover or restart lost it and the new server's clock is
// behind), and storage that checks fences will refuse the new holder's
// writes. That is reported (logged at Error level), not silently passed on.
//
// It is a small direct-mapped table: names that share a slot push each
// other out, so it notices regressions of names locked again soon, at the
// cost of one lock and a hash per grant.
type fenceMemo struct {
	mu    sync.Mutex
	seed  maphash.Seed
	slots [fenceSlots]fenceSlot
}

const fenceSlots = 4096

type fenceSlot struct {
	name  uint64 // the name's hash; 0: empty
	fence uint64
	at    time.Time // when the reply with fence came
}

func (m *fenceMemo) init() { m.seed = maphash.MakeSeed() }

// note records that key was granted fence by a request sent at sent. It
// returns the higher fence seen before, if fence went backwards.
func (m *fenceMemo) note(key string, fence uint64, sent time.Time) (prev uint64, regressed bool) {
	h := maphash.String(m.seed, key) | 1
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	s := &m.slots[h%fenceSlots]
	if s.name == h && fence <= s.fence && sent.After(s.at) {
		prev, regressed = s.fence, true
	}
	if s.name != h || fence > s.fence || regressed {
		*s = fenceSlot{name: h, fence: fence, at: now}
	}
	return prev, regressed
}

// ours reports whether fence is the last one this Client was granted (or
// passed) for key, as far as the table remembers: the holder a look found
// with that fence is then a holding of this Client (fences are unique per
// grant). False when it does not remember: the caller assumes another
// Client's.
func (m *fenceMemo) ours(key string, fence uint64) bool {
	h := maphash.String(m.seed, key) | 1
	m.mu.Lock()
	defer m.mu.Unlock()
	s := &m.slots[h%fenceSlots]
	return s.name == h && s.fence == fence
}

// noteFence checks a grant of h's lock with fence, made by a request sent
// at sent, against the fences this Client saw for the name before.
func (c *Client) noteFence(h *holding, fence uint64, sent time.Time) {
	if prev, back := c.fences.note(h.lk.hash, fence, sent); back {
		c.cfg.logger.Error("dlock: fence went backwards: the server lost the lock's counter (failover or restart) and its clock is behind; storage that checks fences will refuse this holder",
			"lock", h.lk.name, "fence", fence, "previous", prev)
	}
}
