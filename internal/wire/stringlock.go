package wire

import (
	"errors"
	"fmt"
	"strings"
)

// KindString names a string lock (dlock.StringMutex) in errors: a key in
// the format other Redis lock libraries use (a string holding the owner's
// random value, SET NX PX, compare-and-delete), not a dlock hash.
const KindString = "string lock"

// SuffixStringFence follows a string lock's key (or its hash tag) in the
// name of its fence counter (see StringFenceKey).
const SuffixStringFence = ":dlock-fence"

// The scripts of string locks (see each file's header).
var (
	StrAcquire = load("str_acquire")
	StrRelease = load("str_release")
	StrExtend  = load("str_extend")
	StrPTTL    = load("str_pttl")
)

// HashTag returns the part of key that Redis Cluster hashes to place it:
// the bytes between the first '{' and the first '}' after it, if there is
// at least one; ok is false when the whole key is hashed.
func HashTag(key string) (tag string, ok bool) {
	i := strings.IndexByte(key, '{')
	if i < 0 {
		return "", false
	}
	j := strings.IndexByte(key[i+1:], '}')
	if j <= 0 {
		return "", false
	}
	return key[i+1 : i+1+j], true
}

// CheckStringKey reports why key cannot be a string lock's key, or nil. Any
// bytes are allowed, except that it may not be empty or longer than
// MaxNameLen, and a key without a hash tag may not contain '}': its fence
// counter could then not be named into the key's Cluster slot.
func CheckStringKey(key string) error {
	switch {
	case key == "":
		return errors.New("lock key is empty")
	case len(key) > MaxNameLen:
		return fmt.Errorf("lock key is %d bytes, longer than MaxNameLen (%d)", len(key), MaxNameLen)
	}
	if _, ok := HashTag(key); !ok && strings.IndexByte(key, '}') >= 0 {
		return fmt.Errorf("lock key %q has a '}' but no hash tag: its fence counter could not share its Cluster slot; give it a hash tag ({...})", key)
	}
	return nil
}

// StringFenceKey is the fence counter of the string lock at key, in key's
// Cluster slot: key + SuffixStringFence if key has a hash tag (the counter
// inherits it), else "{" + key + "}" + SuffixStringFence (key itself is the
// tag, which hashes as the whole key does).
func StringFenceKey(key string) string {
	if _, ok := HashTag(key); ok {
		return key + SuffixStringFence
	}
	return "{" + key + "}" + SuffixStringFence
}
