package dlock

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/dlock-go/dlock/internal/driver"
	"github.com/dlock-go/dlock/internal/wire"
)

// Sentinel errors. Every error dlock returns wraps one of these (or a
// context error, or a Redis error) together with the lock name, so callers
// branch with errors.Is.
var (
	// ErrNotObtained is returned by TryLock when the lock is held by someone
	// else, or when a grant came too late to be valid (its reply came after
	// the lease it granted may have expired; in quorum mode, a majority that
	// answered too late or whose fence could not be raised): such a grant is
	// given back. Lock does not return it for such a grant: it goes on
	// waiting with a new owner token (as it does for a hand-over or a pass
	// that reached it only after the lease it granted may have expired),
	// and a MultiLock's Lock starts over with one.
	ErrNotObtained = errors.New("dlock: not obtained")
	// ErrLockLost means a lease is no longer held: it expired, was deleted or
	// overwritten, or renewal could not reach Redis before its deadline. It is
	// also the context.Cause of a lost lease's Context.
	ErrLockLost = errors.New("dlock: lock lost")
	// ErrClosed is returned by every call on a closed Client, and is the
	// context.Cause of leases that were still held when it closed.
	ErrClosed = errors.New("dlock: client closed")
	// ErrInvalidArgument wraps a description of a bad name, TTL or size.
	ErrInvalidArgument = errors.New("dlock: invalid argument")
	// ErrForeignKey means the Redis key a lock name maps to already holds
	// something that is not a dlock lock of this kind; dlock never overwrites it.
	ErrForeignKey = errors.New("dlock: key is not a dlock lock")
	// ErrNotReplicated means fewer replicas than WithReplicaAck asks for
	// confirmed a grant or an extension in time: the grant was undone (the
	// lock is not held), or the extension does not count (the lease keeps
	// its earlier deadline). The message says how many confirmed.
	ErrNotReplicated = errors.New("dlock: not replicated")
	// ErrNoLeader is returned by Election.Leader when nobody leads the
	// election: no candidate holds it, or the one that was just handed it
	// has not yet published its value.
	ErrNoLeader = errors.New("dlock: no leader")
)

// prefix begins every error message of the package, once: an error that
// wraps another writes the inner one's message without it.
const prefix = "dlock: "

// bare is err's message without the package's prefix.
func bare(err error) string { return strings.TrimPrefix(err.Error(), prefix) }

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...)
}

// nameError is an error about one lock: `dlock: lock "NAME": ` and what
// went wrong, with the context's cause in parentheses when a context
// ended it for a reason of its own.
type nameError struct {
	name  string
	err   error
	cause error // optional
}

func (e *nameError) Error() string {
	s := prefix + "lock " + strconv.Quote(e.name) + ": " + bare(e.err)
	if e.cause != nil {
		s += " (" + bare(e.cause) + ")"
	}
	return s
}

func (e *nameError) Unwrap() []error {
	if e.cause == nil {
		return []error{e.err}
	}
	return []error{e.err, e.cause}
}

// nameErr puts the lock name in front of err.
func nameErr(name string, err error) error {
	return &nameError{name: name, err: err}
}

// foreignError says what a lock's key holds instead of a dlock lock of the
// kind asked for; it is an ErrForeignKey.
type foreignError struct{ msg string }

func (e *foreignError) Error() string        { return prefix + e.msg }
func (e *foreignError) Is(target error) bool { return target == ErrForeignKey }

// lostError is ErrLockLost with what the lease found, written once:
// "dlock: lock lost: Redis key ... is ...".
type lostError struct{ err error }

func (e *lostError) Error() string   { return ErrLockLost.Error() + ": " + bare(e.err) }
func (e *lostError) Unwrap() []error { return []error{ErrLockLost, e.err} }

// scriptErr turns a script's own error replies about key into dlock errors;
// kind is the kind of lock the call wanted the key to be.
func scriptErr(key, kind string, err error) error {
	msg := err.Error()
	switch {
	case strings.HasPrefix(msg, "DLOCK_FOREIGN "):
		what := strings.TrimPrefix(msg, "DLOCK_FOREIGN ")
		if i := strings.IndexByte(what, ' '); i >= 0 && !strings.HasPrefix(what, "dlock ") {
			what = what[:i]
		}
		if strings.HasPrefix(what, "dlock ") {
			return &foreignError{fmt.Sprintf("Redis key %q is a %s, not a %s", key, what, kind)}
		}
		return &foreignError{fmt.Sprintf("Redis key %q is a %s that dlock did not write, not a dlock %s", key, what, kind)}
	case strings.HasPrefix(msg, "WRONGTYPE"):
		return &foreignError{fmt.Sprintf("Redis key %q is not a hash, so not a dlock %s", key, kind)}
	}
	return err
}

// scriptACLRefusal is how Redis 7 words a command that a script ran and
// the user's ACL refused; it names neither the command nor, by name, the
// script (only its SHA).
const scriptACLRefusal = "can't run this command or subcommand"

// refused reports a command the server refused for the user's ACL
// (NOPERM, or the refusal of a command a script ran) or for its
// authentication (NOAUTH, WRONGPASS), or a TLS connection refused for its
// certificates (the server's not trusted or not for its name, the
// client's missing or not trusted): retrying cannot cure it.
func refused(err error) bool {
	if err == nil {
		return false
	}
	if badCertificate(err) {
		return true
	}
	var rerr driver.ReplyError
	if !errors.As(err, &rerr) {
		return false
	}
	msg := rerr.Error()
	for _, p := range []string{"NOPERM", "NOAUTH", "WRONGPASS"} {
		if strings.HasPrefix(msg, p) {
			return true
		}
	}
	return strings.Contains(msg, scriptACLRefusal)
}

// badCertificate reports a TLS handshake that failed on a certificate: the
// server's, which this side did not trust (unknown authority, wrong name,
// expired), or this side's, which the server asked for and did not get or
// did not trust (its alert arrives as a "remote error").
func badCertificate(err error) bool {
	if err == nil {
		return false
	}
	var verify *tls.CertificateVerificationError
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	if errors.As(err, &verify) || errors.As(err, &unknown) || errors.As(err, &host) || errors.As(err, &invalid) {
		return true
	}
	msg := err.Error()
	for _, alert := range []string{"tls: certificate required", "tls: bad certificate", "tls: unknown certificate authority", "tls: certificate expired", "tls: unsupported certificate"} {
		if strings.Contains(msg, "remote error: "+alert) {
			return true
		}
	}
	return false
}

// explainRefusal adds, to a refusal of a command that one of dlock's
// scripts ran, which script it was and where the commands the ACL must
// allow are listed, and to a certificate refused, what to set; other
// errors are returned as they are. Redis's own
// NOPERM replies already name the command, keys or channels refused.
func explainRefusal(err error) error {
	if badCertificate(err) {
		return fmt.Errorf("the TLS connection to Redis failed on a certificate (%w): the go-redis client's TLSConfig must trust the CA that signed the server's certificate (RootCAs), name the server as its certificate does (ServerName), and present a client certificate (Certificates) if the server asks for one", err)
	}
	if err == nil || !refused(err) || !strings.Contains(err.Error(), scriptACLRefusal) {
		return err
	}
	name := "a dlock script"
	for _, s := range wire.Scripts() {
		if strings.Contains(err.Error(), s.SHA) {
			name = "dlock's script " + s.Name + ".lua"
			break
		}
	}
	return fmt.Errorf("the Redis user may not run a command that %s runs (%w); the ACL must allow every command listed in docs/PRODUCTION.md", name, err)
}
