package faults

import (
	"bytes"
	"strconv"
	"time"
)

// SubFaults decides faults on the sharded subscriptions (SSUBSCRIBE) a
// client makes, at the connection: whatever goes through the client's
// dialer (go-redis's PubSub connections do) is seen, whoever wrote it.
// Each chance is drawn per SSUBSCRIBE written (Unsubscribe: per write on a
// connection that has subscribed something), from the Injector's seeded
// source. The server does the rest for real: a refused command is answered
// with an error, an unsubscribe ends the subscription at the server.
type SubFaults struct {
	// Delay: the SSUBSCRIBE is written late, so it is confirmed late.
	Delay float64
	// MaxDelay bounds Delay's wait (uniform from 0). Default 200ms; capped
	// by Config.MaxDelay.
	MaxDelay time.Duration
	// Refuse: the SSUBSCRIBE is written with a command name the server does
	// not know, so the server answers it with an error and subscribes
	// nothing.
	Refuse float64
	// Unsubscribe: after a write, the connection also writes an SUNSUBSCRIBE
	// of one of the channels it subscribed: the server ends that
	// subscription and says so, as a Cluster node does on its own when it
	// stops serving a slot.
	Unsubscribe float64
	// Drop: the connection is closed right after the SSUBSCRIBE is written.
	Drop float64
}

func (f SubFaults) any() bool { return f.Delay+f.Refuse+f.Unsubscribe+f.Drop > 0 }

// subFault is what happens to one write on a subscription connection.
type subFault struct {
	delay   time.Duration
	refuse  bool
	drop    bool
	unsub   string // a channel to unsubscribe after the write ("" none)
	counted string // the statistic it counts as
}

// ssubscribe is how go-redis writes the command name (RESP bulk string).
var ssubscribe = []byte("$10\r\nssubscribe\r\n")

// sunsubscribeName is the same for SUNSUBSCRIBE.
var sunsubscribeName = []byte("$12\r\nsunsubscribe\r\n")

// subscribedChannel returns the channel of an SSUBSCRIBE command in b, if b
// is one (go-redis writes each PubSub command on its own).
func subscribedChannel(b []byte) (string, bool) { return channelOf(b, ssubscribe) }

// unsubscribedChannel is subscribedChannel for SUNSUBSCRIBE.
func unsubscribedChannel(b []byte) (string, bool) { return channelOf(b, sunsubscribeName) }

// channelOf returns the first argument of the command named name in b.
func channelOf(b, name []byte) (string, bool) {
	i := bytes.Index(bytes.ToLower(b), name)
	if i < 0 {
		return "", false
	}
	rest := b[i+len(name):]
	if len(rest) == 0 || rest[0] != '$' {
		return "", false
	}
	nl := bytes.Index(rest, []byte("\r\n"))
	if nl < 0 {
		return "", false
	}
	n, err := strconv.Atoi(string(rest[1:nl]))
	if err != nil || n < 0 || len(rest) < nl+2+n {
		return "", false
	}
	return string(rest[nl+2 : nl+2+n]), true
}

// decideSub draws the faults of one write on a connection that has
// subscribed known (channel names, nil if none); sub is the channel b
// subscribes to, if it is an SSUBSCRIBE.
func (in *Injector) decideSub(sub string, isSub bool, known []string) subFault {
	f := in.sub
	if !in.enabled.Load() || !f.any() {
		return subFault{}
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	var out subFault
	if isSub {
		switch r := in.rng.Float64(); {
		case r < f.Refuse:
			out.refuse, out.counted = true, "sub refuse"
		case r < f.Refuse+f.Drop:
			out.drop, out.counted = true, "sub drop"
		case r < f.Refuse+f.Drop+f.Delay:
			maxD := min(f.MaxDelay, in.maxDelay)
			if maxD <= 0 {
				maxD = min(200*time.Millisecond, in.maxDelay)
			}
			out.delay, out.counted = time.Duration(in.rng.Int64N(int64(maxD)+1)), "sub delay"
		}
	}
	if len(known) > 0 && out.counted == "" && in.rng.Float64() < f.Unsubscribe {
		out.unsub, out.counted = known[in.rng.IntN(len(known))], "sub unsubscribe"
	}
	if out.counted != "" {
		in.stats[out.counted]++
		e := Event{At: time.Since(in.epoch), Delay: out.delay, Call: Call{Script: out.counted, Args: []string{sub, out.unsub}}, Batch: 1}
		if len(in.events) < cap(in.events) {
			in.events = append(in.events, e)
		} else {
			in.events[in.nEvents%cap(in.events)] = e
		}
		in.nEvents++
	}
	return out
}

// refused rewrites an SSUBSCRIBE into a command of the same length that no
// server knows.
func refused(b []byte) []byte {
	out := bytes.Clone(b)
	i := bytes.Index(bytes.ToLower(out), ssubscribe)
	copy(out[i+len(ssubscribe)-3:], "x")
	return out
}

// sunsubscribe encodes SUNSUBSCRIBE channel.
func sunsubscribe(channel string) []byte {
	b := []byte("*2\r\n$12\r\nsunsubscribe\r\n$")
	b = strconv.AppendInt(b, int64(len(channel)), 10)
	b = append(b, "\r\n"...)
	b = append(b, channel...)
	return append(b, "\r\n"...)
}
