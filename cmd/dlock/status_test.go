package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/dlock-go/dlock/internal/redistest"
)

// listJSON runs dlock list --json with args and parses the result.
func listJSON(t *testing.T, addr string, args ...string) ([]lockInfo, string) {
	t.Helper()
	code, out, errOut := runDlock(t, addr, append([]string{"list", "--json"}, args...)...)
	if code != 0 {
		t.Fatalf("dlock list --json %q: exit %d; stderr %q", args, code, errOut)
	}
	var infos []lockInfo
	if err := json.Unmarshal([]byte(out), &infos); err != nil || infos == nil {
		t.Fatalf("dlock list --json %q does not parse as an array: %v\n%s", args, err, out)
	}
	return infos, errOut
}

func names(infos []lockInfo) string {
	var ns []string
	for _, i := range infos {
		ns = append(ns, i.Name)
	}
	return strings.Join(ns, ",")
}

// list finds held, free and foreign keys under the prefix, filters by
// pattern and prefix, and is bounded by --limit.
func TestList(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	rdb := s.Client(t)

	held := startDlock(t, s.Addr(), "run", "list-a", "--", "sh", "-c", `echo "$DLOCK_TOKEN"; exec sleep 30`)
	token := held.line()
	other := startDlock(t, s.Addr(), "run", "--prefix", "other:", "list-d", "--", "sh", "-c", `echo ready; exec sleep 30`)
	other.line()
	if code, _, errOut := runDlock(t, s.Addr(), "run", "list-b", "--", "true"); code != 0 {
		t.Fatalf("run list-b: exit %d; %s", code, errOut)
	}
	rdb.Set(t.Context(), "dlock:{list-c}", "not a lock", 0)
	rdb.Set(t.Context(), "unrelated", "x", 0)

	all, _ := listJSON(t, s.Addr())
	if names(all) != "list-a,list-b,list-c" {
		t.Fatalf("list: got %s, want list-a,list-b,list-c", names(all))
	}
	a, b, c := all[0], all[1], all[2]
	if a.Type != "mutex" || a.State != "held" || a.Token != token || a.Fence == 0 || a.TTLMillis <= 0 {
		t.Errorf("held lock: %+v", a)
	}
	if b.Type != "mutex" || b.State != "free" || b.Token != "" || b.Fence == 0 || b.TTLMillis <= 0 {
		t.Errorf("free lock: %+v", b)
	}
	if c.Type != "foreign" || c.RedisType != "string" || c.State != "unknown" || c.TTLMillis != -1 {
		t.Errorf("foreign key: %+v", c)
	}

	if got, _ := listJSON(t, s.Addr(), "list-[ab]"); names(got) != "list-a,list-b" {
		t.Errorf("list 'list-[ab]': got %s", names(got))
	}
	if got, _ := listJSON(t, s.Addr(), "nothing-*"); len(got) != 0 {
		t.Errorf("list 'nothing-*': got %s", names(got))
	}
	if got, _ := listJSON(t, s.Addr(), "--prefix", "other:"); names(got) != "list-d" || got[0].State != "held" {
		t.Errorf("list --prefix other: got %+v", got)
	}
	got, errOut := listJSON(t, s.Addr(), "--limit", "1")
	if len(got) != 1 || !strings.Contains(errOut, "--limit") {
		t.Errorf("list --limit 1: got %s, stderr %q", names(got), errOut)
	}

	code, out, errOut := runDlock(t, s.Addr(), "list")
	if code != 0 || !strings.Contains(out, "NAME") || !strings.Contains(out, token) || !strings.Contains(out, "foreign:string") {
		t.Errorf("list (table): exit %d, stderr %q, output:\n%s", code, errOut, out)
	}
}
