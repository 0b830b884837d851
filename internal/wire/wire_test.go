package wire

import (
	"strings"
	"testing"
)

// awkwardNames are names whose bytes could be mistaken for the layout's own.
var awkwardNames = []string{
	"plain", "a,b", "a{b}c", "x}:q", "x}:w}", "x:h", "{", "{}", "a b\nc", "\xff\xfe", ",", "a:c:b",
}

func TestParseKeyRoundTrips(t *testing.T) {
	for _, prefix := range []string{DefaultPrefix, "", "{x}", "p:"} {
		for _, name := range awkwardNames {
			k := KeysOf(prefix, name)
			for key, want := range map[string]Role{k.Hash: RoleHash, k.Line: RoleLine, k.Waiters: RoleWaiters, k.Holders: RoleHolders} {
				got, role, ok := ParseKey(prefix, key)
				if !ok || got != name || role != want {
					t.Errorf("ParseKey(%q, %q) = %q, %v, %v; want %q, %v", prefix, key, got, role, ok, name, want)
				}
			}
			if !strings.HasPrefix(HandOverChannel(prefix, name, "C"), k.Hash) {
				t.Errorf("hand-over channel of %q is not in the lock's slot", name)
			}
			k2, ho := KeysAndHandOver(prefix, name, "C")
			if k2 != k || ho != HandOverChannel(prefix, name, "C") || k.Hash != HashKey(prefix, name) {
				t.Errorf("KeysAndHandOver(%q) = %+v %q; want %+v %q", name, k2, ho, k, HandOverChannel(prefix, name, "C"))
			}
		}
	}
	for _, key := range []string{"other", "dlock:x", "dlock:{}", "dlock:{}}", "dlock:{a}:z"} {
		if name, _, ok := ParseKey(DefaultPrefix, key); ok {
			t.Errorf("ParseKey(%q) = %q, want not a lock key", key, name)
		}
	}
}

func TestCheckName(t *testing.T) {
	for _, name := range awkwardNames {
		if err := CheckName(name); err != nil {
			t.Errorf("CheckName(%q) = %v", name, err)
		}
	}
	for _, name := range []string{"", "}a", strings.Repeat("x", MaxNameLen+1)} {
		if err := CheckName(name); err == nil {
			t.Errorf("CheckName(%q) = nil, want an error", name)
		}
	}
}

func TestWaiterEntryRoundTrips(t *testing.T) {
	for _, name := range awkwardNames {
		ch := HandOverChannel(DefaultPrefix, name, "client1")
		for _, w := range []Waiter{{Deadline: 17, TTL: 10000, Channel: ch}, {Deadline: 17, TTL: 5, Permits: RWWriter, Channel: ch}} {
			got, ok := ParseWaiter(w.Entry(), w.Permits > 0)
			if !ok || got != w {
				t.Errorf("ParseWaiter(%q) = %+v, %v; want %+v", w.Entry(), got, ok, w)
			}
		}
	}
}

func TestHandOverRoundTrips(t *testing.T) {
	f, tok, ok := ParseHandOver(HandOver(1234567890123456, "tok_-"))
	if !ok || f != 1234567890123456 || tok != "tok_-" {
		t.Fatalf("got %d %q %v", f, tok, ok)
	}
	for _, bad := range []string{"", "g", "g 1", "g x t", "123"} {
		if _, _, ok := ParseHandOver(bad); ok {
			t.Errorf("ParseHandOver(%q) accepted", bad)
		}
	}
	if f, ok := ParseWake("42"); !ok || f != 42 {
		t.Errorf("ParseWake = %d %v", f, ok)
	}
}

func TestScriptsLoad(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range Scripts() {
		if s.Src == "" || len(s.SHA) != 40 || seen[s.SHA] {
			t.Errorf("script %s: empty or duplicate", s.Name)
		}
		seen[s.SHA] = true
	}
}
