package rueidisdlock

import (
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/rueidis"
)

// TestErrorLinesAsSent: error replies read through rueidis keep the line
// Redis sent, "ERR " included, which rueidis drops.
func TestErrorLinesAsSent(t *testing.T) {
	mr := miniredis.RunT(t)
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{mr.Addr()}, DisableCache: true, ForceSingleClient: true})
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	k := newConn(rc)
	for _, tc := range []struct {
		line []any
		want string
	}{
		{[]any{"nosuchcommand"}, "ERR unknown command `nosuchcommand`, with args beginning with: "},
		{[]any{"evalsha", "0000000000000000000000000000000000000000", "0"}, "NOSCRIPT No matching script. Please use EVAL."},
	} {
		_, err := k.Do(t.Context(), tc.line, true)
		if err == nil || err.Error() != tc.want {
			t.Errorf("%v: error %v, want %q", tc.line, err, tc.want)
		}
		if _, ok := err.(interface{ RedisError() }); !ok {
			t.Errorf("%v: %T is no ReplyError", tc.line, err)
		}
	}
}
