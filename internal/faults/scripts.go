package faults

import (
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock/internal/wire"
)

// Scripts names Lua scripts by their SHA1, as EVALSHA sends them.
type Scripts struct {
	byHash map[string]scriptName
}

type scriptName struct {
	name string
	ops  bool // the first argument names the operation: calls are "name.OP"
}

// NewScripts returns an empty table.
func NewScripts() *Scripts { return &Scripts{byHash: make(map[string]scriptName)} }

// Add names the script whose source is src. With ops, a call's first
// argument (after the keys) names the operation, and the call is named
// "name.OP" (sem.lua's "a", "r", "l", "e", "t").
func (s *Scripts) Add(name, src string, ops bool) {
	sum := sha1.Sum([]byte(src))
	s.byHash[hex.EncodeToString(sum[:])] = scriptName{name: name, ops: ops}
}

// EngineScripts names dlock's scripts (internal/wire) as the engine sends
// them, each by its name ("acquire", "quorum_acquire"), and sem.lua's calls
// by operation (see Add).
func EngineScripts() *Scripts {
	s := NewScripts()
	for _, sc := range wire.Scripts() {
		s.Add(sc.Name, sc.Src, sc == wire.Sem)
	}
	return s
}

// line is one command line as a driver holds it: its arguments, as
// strings the way the driver writes them.
type line interface {
	Len() int
	Arg(i int) string
}

// classify names a command, if it is a script call.
func (s *Scripts) classify(l line, via Via) (Call, bool) {
	if l.Len() < 3 {
		return Call{}, false
	}
	var sha string
	switch strings.ToLower(l.Arg(0)) {
	case "evalsha", "evalsha_ro":
		sha = strings.ToLower(l.Arg(1))
	case "eval", "eval_ro":
		sum := sha1.Sum([]byte(l.Arg(1)))
		sha = hex.EncodeToString(sum[:])
	default:
		return Call{}, false
	}
	n, err := strconv.Atoi(l.Arg(2))
	if err != nil || n < 0 || 3+n > l.Len() {
		return Call{}, false
	}
	c := Call{Via: via, Keys: make([]string, n), Args: make([]string, l.Len()-3-n)}
	for i := range c.Keys {
		c.Keys[i] = l.Arg(3 + i)
	}
	for i := range c.Args {
		c.Args[i] = l.Arg(3 + n + i)
	}
	sn, ok := scriptName{}, false
	if s != nil {
		sn, ok = s.byHash[sha]
	}
	switch {
	case !ok:
		c.Script = "?" + sha[:min(len(sha), 8)]
	case sn.ops && len(c.Args) > 0:
		c.Script = sn.name + "." + c.Args[0]
	default:
		c.Script = sn.name
	}
	return c, true
}

// str formats one command argument as go-redis writes it.
func str(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case string:
		return v
	case *string:
		if v == nil {
			return ""
		}
		return *v
	case []byte:
		return string(v)
	case int:
		return strconv.Itoa(v)
	case int64:
		return strconv.FormatInt(v, 10)
	case int32:
		return strconv.FormatInt(int64(v), 10)
	case uint64:
		return strconv.FormatUint(v, 10)
	case uint32:
		return strconv.FormatUint(uint64(v), 10)
	case uint:
		return strconv.FormatUint(uint64(v), 10)
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case float32:
		return strconv.FormatFloat(float64(v), 'f', -1, 64)
	case bool:
		if v {
			return "1"
		}
		return "0"
	case time.Duration:
		return strconv.FormatInt(v.Nanoseconds(), 10)
	case fmt.Stringer:
		return v.String()
	}
	return fmt.Sprint(v)
}

// resp is the RESP encoding of a command line, as both drivers write it.
func resp(l line) []byte {
	b := make([]byte, 0, 64*l.Len())
	b = append(b, '*')
	b = strconv.AppendInt(b, int64(l.Len()), 10)
	b = append(b, '\r', '\n')
	for i := range l.Len() {
		s := l.Arg(i)
		b = append(b, '$')
		b = strconv.AppendInt(b, int64(len(s)), 10)
		b = append(b, '\r', '\n')
		b = append(b, s...)
		b = append(b, '\r', '\n')
	}
	return b
}
