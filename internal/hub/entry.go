package hub

import "time"

// An entry is one wanted channel and where its subscription stands, as far
// as the hub knows (all fields guarded by Hub.mu):
//
//	down:        on == nil; subscribed again once retry is due
//	subscribing: on != nil, seq != 0; the SSUBSCRIBE seq on on awaits its reply
//	up:          on != nil, seq == 0; confirmed, and ready is closed
//
// down → subscribing (the manager places it), subscribing → up (the reply),
// subscribing or up → down (a refusal, a lost connection, a server-side
// unsubscribe), up → subscribing (Suspect, or its slot moved).
type entry struct {
	refs  int
	ready chan struct{} // closed while up
	on    *conn
	seq   uint64

	gap     bool          // it failed or was in doubt since ready was last closed: call Gap when up
	verify  bool          // Suspect asked for it to be subscribed again
	retry   time.Time     // while down: not before
	backoff time.Duration // the last wait before a retry; 0 after a success
}

type state uint8

const (
	down state = iota
	subscribing
	up
)

func (e *entry) state() state {
	switch {
	case e.on == nil:
		return down
	case e.seq != 0:
		return subscribing
	default:
		return up
	}
}

// doubt notes that the subscription is no longer known to be up: Want's
// channel opens again and Gap is due at the next confirmation.
func (e *entry) doubt() {
	if e.state() == up {
		e.ready = make(chan struct{})
	}
	e.gap = true
}

// confirmed makes the entry up; it reports whether Gap is due.
func (e *entry) confirmed() (gap bool) {
	e.seq, e.backoff = 0, 0
	close(e.ready)
	gap, e.gap = e.gap, false
	return gap
}
