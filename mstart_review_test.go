package dlock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/faults"
	"github.com/dlock-go/dlock/internal/redistest"
)

// TestMultiLockLateEveryTime: every group acquire's reply comes past the
// lease's validity, so every take's token is spent and Lock starts over
// each time. It must go on only while ctx lives and the Client is open:
// ctx ending (or Close) mid-restart ends the call promptly, with ctx's
// error (ErrClosed), and nothing of the names is left at Redis after the
// late replies and give-backs have run.
func TestMultiLockLateEveryTime(t *testing.T) {
	const ttl, delay = time.Second, 1010 * time.Millisecond
	for _, end := range []string{"ctx", "close"} {
		t.Run(end, func(t *testing.T) {
			t.Parallel()
			s := redistest.Start(t)
			c, in := reviewClient(t, s, 5*time.Second, nil,
				faults.Rule{Script: "multi_acquire", Kind: faults.DelayReply, P: 1, Min: delay, Max: delay})
			_, rdb := newClients(t, s, 1)
			ctx := ctxT(t, 30*time.Second)
			lctx, cancel := context.WithTimeout(ctx, 3500*time.Millisecond)
			defer cancel()
			if end == "close" {
				time.AfterFunc(2500*time.Millisecond, func() { _ = c.Close() })
			}
			a, b := "mevery-a-"+end, "mevery-b-"+end
			start := time.Now()
			l, err := c.MultiLock([]string{a, b}, dlock.TTL(ttl)).Lock(lctx)
			took := time.Since(start)
			if err == nil {
				_ = l.Unlock(ctx)
				t.Fatalf("Lock took the names though every grant came late; faults: %s", in.Summary())
			}
			want := error(context.DeadlineExceeded)
			if end == "close" {
				want = dlock.ErrClosed
			}
			if !errors.Is(err, want) {
				t.Fatalf("Lock: %v, want %v; faults: %s", err, want, in.Summary())
			}
			if took > 5*time.Second {
				t.Fatalf("Lock returned %v after start, well past its end", took)
			}
			n := 0
			for k, v := range in.Stats() {
				if strings.HasPrefix(k, "multi_acquire delay-reply") {
					n += v
				}
			}
			if n < 2 {
				t.Fatalf("only %d group acquires: Lock did not start over; faults: %s", n, in.Summary())
			}
			in.WaitLate()
			k := lateKinds()[0]
			for _, name := range []string{a, b} {
				waitFor(t, ctx, "nothing of "+name+" left at Redis", func() bool { return k.left(ctx, rdb, name) == "" })
			}
		})
	}
}
