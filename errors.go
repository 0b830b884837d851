package dlock

import (
	"errors"
	"fmt"
	"strings"
)

// Sentinel errors. Every error dlock returns wraps one of these (or a
// context error, or a Redis error) together with the lock name, so callers
// branch with errors.Is.
var (
	// ErrNotObtained is returned by TryLock when the lock is held by someone else.
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
)

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidArgument}, args...)...)
}

// nameErr puts the lock name in front of err.
func nameErr(name string, err error) error {
	return fmt.Errorf("dlock: lock %q: %w", name, err)
}

// scriptErr turns a script's own error replies into dlock errors.
func scriptErr(key string, err error) error {
	msg := err.Error()
	switch {
	case strings.HasPrefix(msg, "DLOCK_FOREIGN "):
		what := strings.TrimPrefix(msg, "DLOCK_FOREIGN ")
		if i := strings.IndexByte(what, ' '); i >= 0 && !strings.HasPrefix(what, "dlock ") {
			what = what[:i]
		}
		return fmt.Errorf("%w: Redis key %q holds a %s", ErrForeignKey, key, what)
	case strings.HasPrefix(msg, "WRONGTYPE"):
		return fmt.Errorf("%w: Redis key %q holds a value of another type", ErrForeignKey, key)
	}
	return err
}
