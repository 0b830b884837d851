package dlock_test

// Fault 11 of docs/SAFETY.md: the client's wall clock jumps. dlock must
// measure every duration and deadline on Go's monotonic clock, so nothing
// changes. TestFault11ClientWallClockJumps moves a holder process's wall
// clock for real (internal/wallclock); TestFault11NoWallClock checks the
// source for anything that would read or compare the wall clock.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/wallclock"
	"github.com/redis/go-redis/v9"
)

func init() { familyRoles["wall-hold"] = childWallHold }

// childWallHold: "TTL" or "TTL,ADDR,ADDR,..." (quorum mode over those
// masters). Take the lock "wall", print "locked TOKEN FENCE", then answer
// each stdin line:
//
//	now        "now UNIXNANO" (the wall clock)
//	state      "state live", or "state ended CAUSE"
//	extend     "extend ERR"
//	wait-lost  "wait-lost lost=IS_LOCK_LOST CAUSE" once the lease ends,
//	           "wait-lost kept" if it has not 10 s later (monotonic)
//	unlock     "unlock lost=IS_LOCK_LOST ERR"
func childWallHold(c *dlock.Client, _ *redis.Client, arg string) error {
	args := strings.Split(arg, ",")
	ttl, err := time.ParseDuration(args[0])
	if err != nil {
		return err
	}
	if len(args) > 1 {
		var rdbs []redis.UniversalClient
		for _, addr := range args[1:] {
			r := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
			defer r.Close()
			rdbs = append(rdbs, r)
		}
		// Patient (see patientQuorum): the traced child is slow, and a
		// renewal that misses master 0 is not seen there by the test.
		if c, err = dlock.NewQuorum(rdbs, dlock.WithNodeTimeout(250*time.Millisecond)); err != nil {
			return err
		}
		defer c.Close()
	}
	ctx := context.Background()
	l, err := c.Mutex("wall", dlock.TTL(ttl)).Lock(ctx)
	if err != nil {
		return err
	}
	fmt.Printf("locked %s %d\n", l.Token(), l.Fence())
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch cmd := in.Text(); cmd {
		case "now":
			fmt.Printf("now %d\n", time.Now().UnixNano())
		case "state":
			if l.Context().Err() == nil {
				fmt.Println("state live")
			} else {
				fmt.Printf("state ended %v\n", context.Cause(l.Context()))
			}
		case "extend":
			fmt.Printf("extend %v\n", l.Extend(ctx, ttl))
		case "wait-lost":
			select {
			case <-l.Context().Done():
				cause := context.Cause(l.Context())
				fmt.Printf("wait-lost lost=%v %v\n", errors.Is(cause, dlock.ErrLockLost), cause)
			case <-time.After(10 * time.Second):
				fmt.Println("wait-lost kept")
			}
		case "unlock":
			err := l.Unlock(ctx)
			fmt.Printf("unlock lost=%v %v\n", errors.Is(err, dlock.ErrLockLost), err)
		default:
			return fmt.Errorf("unknown command %q", cmd)
		}
	}
	return nil
}

// Fault 11, for real: a holder process's wall clock jumps an hour forward,
// then two hours back, while its lock is held and renewed, on one server
// and in quorum mode. Its lease does not end at the jump, it renews,
// Extend works, the lock stays exclusive; and when Redis is frozen (a
// majority of the masters) and the clock jumps back at once, the lease
// still ends by its deadline (not an hour later): the deadline is on the
// monotonic clock.
func TestFault11ClientWallClockJumps(t *testing.T) {
	if err := wallclock.Supported(); err != nil {
		t.Skip(err)
	}
	t.Run("S", func(t *testing.T) {
		s := redistest.Start(t)
		c2, _ := newClient(t, s)
		wallClockJumps(t, []*redistest.Server{s}, 1, c2, "")
	})
	t.Run("Q", func(t *testing.T) {
		servers, rdbs := quorumMasters(t, 5)
		var addrs []string
		for _, s := range servers {
			addrs = append(addrs, s.Addr())
		}
		wallClockJumps(t, servers, 3, patientQuorum(t, rdbs), ","+strings.Join(addrs, ","))
	})
}

// wallClockJumps runs TestFault11ClientWallClockJumps on servers: a child
// holds the lock (its arg: the TTL, then quorum), c2 contends, and
// freezing the first frozen servers stops its renewals.
func wallClockJumps(t *testing.T, servers []*redistest.Server, frozen int, c2 *dlock.Client, quorum string) {
	ctx := ctxT(t, 60*time.Second)
	const ttl = time.Second
	wc, err := wallclock.Command(os.Args[0], "-test.run=^$")
	if err != nil {
		t.Fatal(err)
	}
	stdin, sc := launchChild(t, wc, wc.Cmd, "wall-hold", servers[0].Addr(), ttl.String()+quorum)
	locked := strings.Fields(expectLine(t, sc, "locked "))
	ask := func(cmd string) string {
		t.Helper()
		if _, err := fmt.Fprintln(stdin, cmd); err != nil {
			t.Fatal(err)
		}
		return expectLine(t, sc, cmd+" ")
	}
	jump := func(off time.Duration) {
		t.Helper()
		if err := wc.SetOffset(off); err != nil {
			t.Fatal(err)
		}
		// The child's clock did move (else this test proves nothing); the
		// bounds are far from both the offset and zero.
		ns, _ := strconv.ParseInt(ask("now"), 10, 64)
		if d := time.Until(time.Unix(0, ns)); d < off-time.Minute || d > off+time.Minute {
			t.Fatalf("child's wall clock %v from ours, want %v", d, off)
		}
	}

	jump(time.Hour)
	// At once: a deadline kept on the wall clock would have passed now.
	if st := ask("state"); st != "live" {
		t.Fatalf("lease after the wall clock jumped forward: %s", st)
	}
	var rdbs []*redis.Client
	for _, s := range servers {
		rdbs = append(rdbs, s.Client(t))
	}
	waitRenewalsOn(t, ctx, rdbs, "dlock:{wall}", ttl, 4, func() {
		if _, err := c2.Mutex("wall").TryLock(ctx); !errors.Is(err, dlock.ErrNotObtained) {
			t.Fatalf("TryLock while the child holds: %v, want ErrNotObtained", err)
		}
	})
	if st := ask("state"); st != "live" {
		t.Fatalf("lease after four renewals on the moved clock: %s", st)
	}
	if e := ask("extend"); e != "<nil>" {
		t.Fatalf("Extend after the jump: %s", e)
	}

	// Redis frozen, so nothing renews the lease, and the clock two hours
	// back: a deadline on the wall clock would be two hours away.
	for _, s := range servers[:frozen] {
		s.Pause()
	}
	jump(-time.Hour)
	st := ask("wait-lost")
	for _, s := range servers[:frozen] {
		s.Resume()
	}
	if !strings.HasPrefix(st, "lost=true ") {
		t.Fatalf("lease with Redis frozen past its TTL and the wall clock moved back: %s, want lost with ErrLockLost", st)
	}
	if u := ask("unlock"); !strings.HasPrefix(u, "lost=true ") {
		t.Fatalf("Unlock of the lost lease: %s, want ErrLockLost", u)
	}
	l, err := c2.Mutex("wall").TryLock(ctx)
	if err != nil {
		t.Fatalf("TryLock after the child's lease ended: %v", err)
	}
	if fence, _ := strconv.ParseUint(locked[1], 10, 64); l.Fence() <= fence {
		t.Fatalf("fence %d not above the child's %d", l.Fence(), fence)
	}
	_ = l.Unlock(ctx)
}

// Fault 11, by construction: Go's time.Now carries a monotonic reading, and
// Sub, Since, Until, Before, After, Equal and Compare use it when both
// times have one; a time without one makes them read the wall clock. So
// the packages dlock runs (the library, its CLI and the internal packages
// they import, as go list -deps finds them) must not use what makes a time
// without a monotonic reading, or reads the wall clock as a number:
//
//   - time.Unix, UnixMilli, UnixMicro, Date, Parse, ParseInLocation;
//   - the Time methods Round and Truncate (any argument: Round(0) is the
//     documented way to strip it), UTC, Local, In, AddDate, ZoneBounds,
//     the Unmarshal and GobDecode methods;
//   - the Time methods Unix, UnixMilli, UnixMicro, UnixNano and the
//     calendar fields (Year ... Nanosecond, YearDay, Weekday, ISOWeek,
//     Date, Clock, Zone);
//   - any function, method or field from another module whose type holds
//     a time.Time (a go-redis TimeCmd's, parsed from TIME), since nothing
//     says it has a monotonic reading.
//
// Formatting a time for a message (Format, String) is allowed; so is the
// zero Time, which is earlier than any wall clock. Each remaining use is
// in wallClockAllowed with the reason it never feeds a duration or a
// deadline; an entry that no longer matches fails the test too.
func TestFault11NoWallClock(t *testing.T) {
	uses := wallClockUses(t)
	type key struct{ file, in, use string }
	found := map[key]int{}
	for _, u := range uses {
		found[key{u.file, u.in, u.use}]++
	}
	for _, a := range wallClockAllowed {
		k := key{a.file, a.in, a.use}
		switch n := found[k]; {
		case n == 0:
			t.Errorf("stale allowlist entry: %s, in %s: %s (no longer used there)", a.file, a.in, a.use)
		case n != a.n:
			t.Errorf("%s, in %s: %s used %d times, allowed %d (%s)", a.file, a.in, a.use, n, a.n, a.why)
		}
		delete(found, k)
	}
	for _, u := range uses {
		if _, bad := found[key{u.file, u.in, u.use}]; bad {
			t.Errorf("%s: %s in %s: reads the wall clock or makes a time without a monotonic reading; durations and deadlines must come from time.Now, Add, Sub, Since and Until", u.pos, u.use, u.in)
		}
	}
}

// wallClockAllowed lists the uses TestFault11NoWallClock lets through:
// the file (from the module root), the declaration it is in, the function,
// method or field used, how many times, and why it is harmless.
var wallClockAllowed = []struct {
	file, in, use string
	n             int
	why           string
}{
	{"watchdog.go", "var farFuture", "time.Unix", 1,
		"the watchdog's 'nothing due' sentinel, year 146 billion: any time compares before it, whatever the wall clock reads"},
	{"cmd/dlock/status.go", "inspect", "(*github.com/redis/go-redis/v9.TimeCmd).Val", 1,
		"the server's TIME, read in the same pipeline as the lock's keys"},
	{"cmd/dlock/status.go", "inspect", "time.Time.UnixMilli", 1,
		"that TIME in ms, compared only with deadlines the scripts stored by the same server's clock (semaphore holders, waiters in line): the client's clock plays no part"},
	{"cmd/dlock/quorum.go", "readVote", "(*github.com/redis/go-redis/v9.TimeCmd).Val", 1,
		"a quorum master's TIME, read in the same pipeline as its epoch key"},
	{"cmd/dlock/quorum.go", "readVote", "time.Time.UnixMilli", 1,
		"that TIME in ms, less the epoch the master's own clock stored: the age of its data, for dlock status to show; the client's clock plays no part"},
}

// wallClockUse is one use of something TestFault11NoWallClock checks.
type wallClockUse struct {
	pos      string // file:line:col
	file, in string // file from the module root; the declaration it is in
	use      string // what is used: time.Unix, time.Time.UnixNano, a foreign func's full name
}

// wallClockUses type-checks the module's run-time packages from source
// (imports from the export data go list builds) and returns their uses of
// what TestFault11NoWallClock forbids.
func wallClockUses(t *testing.T) []wallClockUse {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list the packages: %v", err)
	}
	out, err := exec.Command(goBin, "list", "-deps", "-export", "-json=ImportPath,Dir,GoFiles,Export,Module,Standard", ".", "./cmd/dlock").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	type listed struct {
		ImportPath, Dir, Export string
		GoFiles                 []string
		Standard                bool
		Module                  *struct{ Path, Dir string }
	}
	var pkgs []listed
	export := map[string]string{}
	for dec := json.NewDecoder(bytes.NewReader(out)); dec.More(); {
		var p listed
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("go list output: %v", err)
		}
		export[p.ImportPath] = p.Export
		if !p.Standard && p.Module != nil && p.Module.Path == modulePath {
			pkgs = append(pkgs, p)
		}
	}
	if len(pkgs) < 3 {
		t.Fatalf("go list found %d packages of %s to check", len(pkgs), modulePath)
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		if f := export[path]; f != "" {
			return os.Open(f)
		}
		return nil, fmt.Errorf("no export data for %s", path)
	})
	var uses []wallClockUse
	var checked []string
	for _, p := range pkgs {
		checked = append(checked, "."+strings.TrimPrefix(p.ImportPath, modulePath))
		var files []*ast.File
		for _, name := range p.GoFiles {
			f, err := parser.ParseFile(fset, filepath.Join(p.Dir, name), nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, f)
		}
		info := &types.Info{Uses: map[*ast.Ident]types.Object{}}
		if _, err := (&types.Config{Importer: imp}).Check(p.ImportPath, fset, files, info); err != nil {
			t.Fatalf("type-checking %s: %v", p.ImportPath, err)
		}
		for _, f := range files {
			rel, _ := filepath.Rel(p.Module.Dir, fset.File(f.Pos()).Name())
			for _, d := range f.Decls {
				in := declName(d)
				ast.Inspect(d, func(n ast.Node) bool {
					id, ok := n.(*ast.Ident)
					if !ok {
						return true
					}
					if use := wallClockRule(info.Uses[id]); use != "" {
						uses = append(uses, wallClockUse{fset.Position(id.Pos()).String(), filepath.ToSlash(rel), in, use})
					}
					return true
				})
			}
		}
	}
	t.Logf("checked %s (module %s)", strings.Join(checked, ", "), modulePath)
	return uses
}

const modulePath = "github.com/dlock-go/dlock"

var (
	// timeFuncs make a time.Time without a monotonic reading.
	timeFuncs = setOf("Unix", "UnixMilli", "UnixMicro", "Date", "Parse", "ParseInLocation")
	// timeMethods strip the monotonic reading, or read the wall clock.
	timeMethods = setOf("Round", "Truncate", "UTC", "Local", "In", "AddDate", "ZoneBounds",
		"UnmarshalJSON", "UnmarshalText", "UnmarshalBinary", "GobDecode",
		"Unix", "UnixMilli", "UnixMicro", "UnixNano",
		"Year", "Month", "Day", "Hour", "Minute", "Second", "Nanosecond", "YearDay", "Weekday", "ISOWeek", "Date", "Clock", "Zone")
)

func setOf(names ...string) map[string]bool {
	m := map[string]bool{}
	for _, n := range names {
		m[n] = true
	}
	return m
}

// wallClockRule names obj if using it is what TestFault11NoWallClock
// forbids, else returns "".
func wallClockRule(obj types.Object) string {
	if obj == nil || obj.Pkg() == nil {
		return ""
	}
	pkg := obj.Pkg().Path()
	switch obj := obj.(type) {
	case *types.Func:
		sig := obj.Type().(*types.Signature)
		if pkg == "time" {
			if recv := sig.Recv(); recv != nil {
				if isTime(recv.Type()) && timeMethods[obj.Name()] {
					return "time.Time." + obj.Name()
				}
			} else if timeFuncs[obj.Name()] {
				return "time." + obj.Name()
			}
			return ""
		}
		if !strings.HasPrefix(pkg, modulePath) && holdsTime(sig.Results()) {
			return obj.FullName()
		}
	case *types.Var:
		if obj.IsField() && pkg != "time" && !strings.HasPrefix(pkg, modulePath) && holdsTime(obj.Type()) {
			return pkg + "." + obj.Name() + " (field)"
		}
	}
	return ""
}

// isTime reports whether t is time.Time or *time.Time.
func isTime(t types.Type) bool {
	if p, ok := t.(*types.Pointer); ok {
		t = p.Elem()
	}
	n, ok := t.(*types.Named)
	return ok && n.Obj().Pkg() != nil && n.Obj().Pkg().Path() == "time" && n.Obj().Name() == "Time"
}

// holdsTime reports whether t is, or directly holds (tuple, pointer, slice,
// array, map value), a time.Time. A struct that holds one is not counted:
// its fields are, where they are used.
func holdsTime(t types.Type) bool {
	if isTime(t) {
		return true
	}
	switch t := t.(type) {
	case *types.Tuple:
		for i := 0; i < t.Len(); i++ {
			if holdsTime(t.At(i).Type()) {
				return true
			}
		}
	case *types.Pointer:
		return holdsTime(t.Elem())
	case *types.Slice:
		return holdsTime(t.Elem())
	case *types.Array:
		return holdsTime(t.Elem())
	case *types.Map:
		return holdsTime(t.Elem())
	}
	return false
}

// declName names a top-level declaration: its function (with receiver),
// or "var NAME", "const NAME", "type NAME" of its first spec.
func declName(d ast.Decl) string {
	switch d := d.(type) {
	case *ast.FuncDecl:
		if d.Recv != nil && len(d.Recv.List) > 0 {
			return types.ExprString(d.Recv.List[0].Type) + "." + d.Name.Name
		}
		return d.Name.Name
	case *ast.GenDecl:
		if len(d.Specs) > 0 {
			switch s := d.Specs[0].(type) {
			case *ast.ValueSpec:
				return d.Tok.String() + " " + s.Names[0].Name
			case *ast.TypeSpec:
				return "type " + s.Name.Name
			}
		}
		return d.Tok.String()
	}
	return ""
}
