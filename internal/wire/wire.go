// Package wire is dlock's format at Redis, in one place: every key, hash
// field, channel, message, waiter entry, script and script reply code. The
// library and cmd/dlock both use it, so neither re-encodes the layout
// (docs/PROTOCOL.md describes the same for other languages).
package wire

import (
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// DefaultPrefix is the key prefix of a Client without WithPrefix.
const DefaultPrefix = "dlock:"

// MaxNameLen is the longest lock name, in bytes.
const MaxNameLen = 1024

// CheckName reports why name cannot be a lock name, or nil. Any bytes are
// allowed except that a name may not be empty, longer than MaxNameLen, or
// begin with '}': the key PREFIX{}... would have an empty hash tag, and the
// keys of one lock would land in different Cluster slots.
func CheckName(name string) error {
	switch {
	case name == "":
		return errors.New("lock name is empty")
	case len(name) > MaxNameLen:
		return fmt.Errorf("lock name is %d bytes, longer than MaxNameLen (%d)", len(name), MaxNameLen)
	case name[0] == '}':
		return fmt.Errorf("lock name %q begins with '}': its Redis keys would not share a Cluster slot", name)
	}
	return nil
}

// CheckPrefix reports why prefix cannot be a key prefix, or nil: if its
// first '{' is followed at once by '}', every key PREFIX{NAME}... would
// have an empty hash tag, and the keys of one lock would land in different
// Cluster slots. (Any other prefix keeps the keys of a name together: its
// hash tag ends before the suffixes, which follow the name's own '}'.)
func CheckPrefix(prefix string) error {
	if i := strings.IndexByte(prefix, '{'); i >= 0 && strings.HasPrefix(prefix[i+1:], "}") {
		return fmt.Errorf("key prefix %q holds an empty hash tag \"{}\": the Redis keys of a lock would not share a Cluster slot", prefix)
	}
	return nil
}

// Keys are the Redis keys of one lock name. Every one of them, and every
// channel of the lock, has NAME as its hash tag, so they share a slot.
type Keys struct {
	Hash    string // PREFIX{NAME}: the lock itself; also its wake-up channel
	Line    string // PREFIX{NAME}:q: tokens waiting in line, in arrival order
	Waiters string // PREFIX{NAME}:w: token -> waiter entry (see Waiter)
	Holders string // PREFIX{NAME}:h: a semaphore's holders, token -> lease deadline (ms)
}

// Key suffixes beside the lock hash.
const (
	SuffixLine    = ":q"
	SuffixWaiters = ":w"
	SuffixHolders = ":h"
	InfixHandOver = ":c:" // PREFIX{NAME}:c:CLIENT
)

// HashKey is the key of the lock called name.
func HashKey(prefix, name string) string { return prefix + "{" + name + "}" }

// KeysOf returns the keys of the lock called name.
func KeysOf(prefix, name string) Keys {
	k, _ := KeysAndHandOver(prefix, name, "")
	return k
}

// HandOverChannel is the channel on which a release tells a client's waiter
// that it was handed the lock: PREFIX{NAME}:c:CLIENT.
func HandOverChannel(prefix, name, client string) string {
	return HashKey(prefix, name) + InfixHandOver + client
}

// KeysAndHandOver returns the keys of the lock called name and client's
// hand-over channel for it, cut from one string (one allocation: a lock
// made per call stays cheap).
func KeysAndHandOver(prefix, name, client string) (Keys, string) {
	h := len(prefix) + len(name) + 2
	all := prefix + "{" + name + "}" + SuffixLine + prefix + "{" + name + "}" + SuffixWaiters +
		prefix + "{" + name + "}" + SuffixHolders + prefix + "{" + name + "}" + InfixHandOver + client
	k := Keys{Hash: all[:h], Line: all[:h+2]}
	off := h + 2
	k.Waiters = all[off : off+h+2]
	off += h + 2
	k.Holders = all[off : off+h+2]
	off += h + 2
	return k, all[off:]
}

// Role says which of a lock's keys a key is.
type Role uint8

// The roles of a lock's keys.
const (
	RoleHash Role = iota + 1
	RoleLine
	RoleWaiters
	RoleHolders
)

// ParseKey finds the lock name of a key under prefix and which of the
// lock's keys it is. A lock hash is the only key that ends in '}', so a name
// that itself contains "}:q" is still read back exactly.
func ParseKey(prefix, key string) (name string, role Role, ok bool) {
	s, found := strings.CutPrefix(key, prefix+"{")
	if !found {
		return "", 0, false
	}
	role = RoleHash
	for suffix, r := range map[string]Role{SuffixLine: RoleLine, SuffixWaiters: RoleWaiters, SuffixHolders: RoleHolders} {
		if t, cut := strings.CutSuffix(s, suffix); cut {
			s, role = t, r
			break
		}
	}
	name, found = strings.CutSuffix(s, "}")
	if !found || CheckName(name) != nil {
		return "", 0, false
	}
	return name, role, true
}

// Fields of a mutex's hash.
const (
	FieldOwner      = "o" // the owner's token; absent while free
	FieldFence      = "f" // the last fence granted
	FieldHandedFrom = "p" // the fence of the holder that last handed the lock over
	FieldInLine     = "w" // "1" while someone may wait in line
)

// Fields of an election's hash: a Fair mutex's, and the leader's value.
// The value is the leader's only while FieldOwner is set and
// FieldValueFence equals FieldFence (see ReadLeader).
const (
	FieldValue      = "v"  // the value last published
	FieldValueFence = "vf" // the fence (term) it was published for
	FieldValueSeq   = "vn" // how many values were published under the key
)

// MaxValueLen is the longest election value, in bytes.
const MaxValueLen = 64 << 10

// CheckValue reports why value cannot be an election value, or nil.
func CheckValue(value string) error {
	switch {
	case value == "":
		return errors.New("election value is empty")
	case len(value) > MaxValueLen:
		return fmt.Errorf("election value is %d bytes, longer than MaxValueLen (%d)", len(value), MaxValueLen)
	}
	return nil
}

// ElectionChannel is the channel on which proclaim.lua publishes every
// value of the election called name: PREFIX{NAME}:e.
func ElectionChannel(prefix, name string) string { return HashKey(prefix, name) + SuffixElection }

// SuffixElection makes an election's channel from its lock hash.
const SuffixElection = ":e"

// LeaderFields are the fields a reader of an election asks for, in the
// order ReadLeader takes them: HMGET PREFIX{NAME} o f vf v vn k.
var LeaderFields = []string{FieldOwner, FieldFence, FieldValueFence, FieldValue, FieldValueSeq, FieldKind}

// LeaderState is an election as one HMGET of LeaderFields shows it.
type LeaderState struct {
	Exists  bool   // the key exists (it holds a fence)
	Owned   bool   // someone holds the lock
	Elected bool   // the holder published its value for its term: Value and Fence are the leader's
	Fence   uint64 // the last fence granted
	Seq     uint64 // values published under the key
	Value   string
	Kind    string // another primitive's kind (FieldKind), if the key is one
}

// ReadLeader reads the reply of HMGET key LeaderFields (nil for absent
// fields), or of leader.lua (the same, then the key's PTTL, which it
// ignores). ok is false for a reply of another shape.
func ReadLeader(reply []any) (st LeaderState, ok bool) {
	if len(reply) < len(LeaderFields) {
		return st, false
	}
	str := func(i int) (string, bool) { s, ok := reply[i].(string); return s, ok }
	o, owned := str(0)
	f, exists := str(1)
	vf, _ := str(2)
	st.Value, _ = str(3)
	vn, _ := str(4)
	st.Kind, _ = str(5)
	st.Exists, st.Owned = exists, owned && o != ""
	if exists {
		var err error
		if st.Fence, err = strconv.ParseUint(f, 10, 64); err != nil {
			return st, false
		}
	}
	st.Seq, _ = strconv.ParseUint(vn, 10, 64)
	st.Elected = st.Owned && exists && vf == f
	return st, true
}

// Proclaimed is proclaim.lua's message: "FENCE SEQ VALUE".
func Proclaimed(fence, seq uint64, value string) string {
	return strconv.FormatUint(fence, 10) + " " + strconv.FormatUint(seq, 10) + " " + value
}

// ParseProclaimed reads a Proclaimed message.
func ParseProclaimed(msg string) (fence, seq uint64, value string, ok bool) {
	fs, rest, found := strings.Cut(msg, " ")
	if !found {
		return 0, 0, "", false
	}
	ns, value, found := strings.Cut(rest, " ")
	f, err1 := strconv.ParseUint(fs, 10, 64)
	n, err2 := strconv.ParseUint(ns, 10, 64)
	if !found || err1 != nil || err2 != nil {
		return 0, 0, "", false
	}
	return f, n, value, true
}

// Replies of proclaim.lua (the first element).
const (
	ProclaimDeposed = 0 // not the owner with that fence: nothing changed
	ProclaimDone    = 1 // published
)

// Fields of a semaphore's or RWMutex's hash.
const (
	FieldKind    = "k"  // KindSemaphore or KindRWMutex; a mutex has none
	FieldSize    = "s"  // permits in all
	FieldUsed    = "u"  // permits held
	FieldQueued  = "q"  // "1" while someone may wait in line
	FieldHolding = "h:" // + token -> "permits,fence"
)

// Kinds of lock; a name is one of them for as long as its key lives.
const (
	KindMutex     = "mutex"
	KindSemaphore = "semaphore"
	KindRWMutex   = "rwmutex"
)

// RWWriter is the number of permits an RWMutex writer takes: all of them
// (a reader takes one).
const RWWriter = 1 << 50

// Replies of release.lua.
const (
	ReleaseNotOwner   = 0 // the lease was lost: someone else owns it, or nobody since an expiry
	ReleaseFreed      = 1 // freed; nobody alive in line; the released fence was published
	ReleaseAgain      = 2 // this holding had already released it or handed it over (a retry)
	ReleaseHandedOver = 3 // handed to the first live waiter in line, told on its channel
)

// Replies of pass.lua.
const (
	PassRefused  = 0 // the old holder no longer owned the lock: nothing changed
	PassRecorded = 1 // the new holder owns it (also when already recorded)
	PassAlone    = 2 // the new holder owns it, and nobody waits in the line: its Client's turn may go on
)

// Replies of multi_acquire.lua (the first element).
const (
	MultiForeign = -1 // nothing changed: the key of the lock named next is not a dlock mutex
	MultiRefused = 0  // nothing changed: the lock named next is held, or has a live line
	MultiTaken   = 1  // every lock taken; their fences follow
)

// Operations of sem.lua (its ARGV[1]).
const (
	SemAcquire = "a"
	SemRelease = "r"
	SemLeave   = "l"
	SemExtend  = "e"
	SemPTTL    = "t"
)

// Script error prefixes.
const (
	ErrForeign = "DLOCK_FOREIGN " // the key is not a dlock lock of this kind; what it is follows
	ErrSize    = "DLOCK_SIZE "    // a semaphore in use with another size; that size follows
	ErrArg     = "DLOCK_ARG "     // an argument the script does not accept; which one follows
)

// The publish commands, which the scripts that publish (release.lua,
// sem.lua, force_unlock.lua) take as their last argument. Subscribers hear
// only their own kind: SSUBSCRIBE hears SPUBLISH, SUBSCRIBE hears PUBLISH.
// Every client of a server must therefore use the same one: sharded on a
// Cluster and on any server that has SPUBLISH (Redis 7.0 and later), plain
// on a server without it (earlier Redis, miniredis). A script given no
// publish command uses SPUBLISH.
const (
	PublishSharded = "SPUBLISH"
	PublishPlain   = "PUBLISH"
)

// ProbeChannel is the channel on which a client publishes one empty message
// to learn whether the server has SPUBLISH (an "unknown command" reply says
// it has not). Nobody subscribes to it, and no lock's channel has its name:
// every lock channel has a '{' right after the prefix.
func ProbeChannel(prefix string) string { return prefix + "probe" }

// EpochKey is a quorum master's epoch key (see quorum_acquire.lua): when,
// in server milliseconds, the master's data began. It has no braces, so no
// lock name maps to it.
func EpochKey(prefix string) string { return prefix + "epoch" }

// HandOver is the message "g FENCE TOKEN" that tells the waiter holding
// TOKEN that it now owns the lock with FENCE.
func HandOver(fence uint64, token string) string {
	return "g " + strconv.FormatUint(fence, 10) + " " + token
}

// ParseHandOver reads a HandOver message.
func ParseHandOver(msg string) (fence uint64, token string, ok bool) {
	rest, found := strings.CutPrefix(msg, "g ")
	if !found {
		return 0, "", false
	}
	fs, token, found := strings.Cut(rest, " ")
	f, err := strconv.ParseUint(fs, 10, 64)
	if !found || err != nil || token == "" {
		return 0, "", false
	}
	return f, token, true
}

// ParseWake reads a wake-up published on the lock's own channel: the fence
// of the holding released. ok is false for a message that is not a fence
// (waiters then look at the lock anyway).
func ParseWake(msg string) (fence uint64, ok bool) {
	f, err := strconv.ParseUint(msg, 10, 64)
	return f, err == nil
}

// Waiter is one waiter's entry in a lock's waiters hash.
type Waiter struct {
	Deadline int64  // server ms until which the place holds without a refresh
	TTL      int64  // the lease ms the waiter asked for
	Permits  int64  // a semaphore waiter's permits (0 for a mutex)
	Channel  string // where the waiter is told it was handed the lock
}

// Entry encodes w: "deadline,ttl,channel" for a mutex, and
// "deadline,ttl,permits,channel" for a semaphore. The channel comes last,
// so any byte of a lock name (a comma too) survives in it.
func (w Waiter) Entry() string {
	s := strconv.FormatInt(w.Deadline, 10) + "," + strconv.FormatInt(w.TTL, 10) + ","
	if w.Permits > 0 {
		s += strconv.FormatInt(w.Permits, 10) + ","
	}
	return s + w.Channel
}

// ParseWaiter reads an entry; semaphore says which of the two forms it is.
func ParseWaiter(entry string, semaphore bool) (Waiter, bool) {
	var w Waiter
	n := 2
	if semaphore {
		n = 3
	}
	parts := strings.SplitN(entry, ",", n+1)
	if len(parts) != n+1 {
		return w, false
	}
	var nums [3]int64
	for i := 0; i < n; i++ {
		v, err := strconv.ParseInt(parts[i], 10, 64)
		if err != nil {
			return w, false
		}
		nums[i] = v
	}
	w.Deadline, w.TTL, w.Channel = nums[0], nums[1], parts[n]
	if semaphore {
		w.Permits = nums[2]
	}
	return w, true
}

//go:embed lua/*.lua
var luaFiles embed.FS

// A Script is one of dlock's Lua scripts, run with EVALSHA (and EVAL when
// the server answers NOSCRIPT).
type Script struct {
	Name, Src, SHA string
}

// load makes the script called name: lua/NAME.lua, followed by the files
// named in then (one script run after another's check).
func load(name string, then ...string) *Script {
	var src []byte
	for _, f := range append([]string{name}, then...) {
		b, err := luaFiles.ReadFile("lua/" + f + ".lua")
		if err != nil {
			panic("wire: missing embedded script " + f) // a build error, not a runtime condition
		}
		src = append(src, b...)
	}
	sum := sha1.Sum(src)
	return &Script{Name: name, Src: string(src), SHA: hex.EncodeToString(sum[:])}
}

// The scripts (see each file's header for its KEYS, ARGV and replies).
var (
	Acquire     = load("acquire")
	Release     = load("release")
	Extend      = load("extend")
	PTTL        = load("pttl")
	Pass        = load("pass")
	FairAcquire = load("fair_acquire")
	FairLeave   = load("fair_leave")
	Sem         = load("sem")
	ForceUnlock = load("force_unlock")
	Proclaim    = load("proclaim")
	Leader      = load("leader")

	QuorumAcquire = load("quorum_acquire", "acquire") // its restart check, then acquire.lua's take without a line
	QuorumFence   = load("quorum_fence")

	MultiAcquire = load("multi_acquire")
)

// Scripts lists every script.
func Scripts() []*Script {
	return []*Script{Acquire, Release, Extend, PTTL, Pass, FairAcquire, FairLeave, Sem, ForceUnlock, Proclaim, Leader, QuorumAcquire, QuorumFence, MultiAcquire, StrAcquire, StrRelease, StrExtend, StrPTTL}
}
