package main

import (
	"context"
	"fmt"
	"os/exec"

	"github.com/alicebob/miniredis/v2"

	"github.com/dlock-go/dlock/internal/redisproc"
)

// embeddedServer is the private server "dlock market" uses when no --redis
// is given: a redis-server child process, or an in-process miniredis.
type embeddedServer struct {
	addr     string
	describe string // one line for the user
	// miniredis is true for the in-process fallback, which lacks some of
	// Redis's semantics (see marketVariantsFor).
	miniredis bool
	stop      func()
}

// startEmbedded starts a private redis-server on a free loopback port if
// one is on PATH, otherwise an in-process miniredis.
func startEmbedded(ctx context.Context) (*embeddedServer, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		m := miniredis.NewMiniRedis()
		if err := m.StartAddr("127.0.0.1:0"); err != nil {
			return nil, fmt.Errorf("starting the in-process server: %w", err)
		}
		return &embeddedServer{
			addr:      m.Addr(),
			describe:  fmt.Sprintf("an in-process miniredis on %s (redis-server is not on PATH; install it for faithful results)", m.Addr()),
			miniredis: true,
			stop:      m.Close,
		}, nil
	}
	// A loopback TCP port rather than a unix socket in a private
	// directory, which no stranger could take: redisproc already refuses a
	// server that is not its child, and over TCP the experiment measures
	// what it measures against a --redis server (and what docs/MARKET.md
	// reports), network stack included. The directory, named for our pid,
	// goes at stop; if dlock is killed first, the next market removes it.
	srv, err := redisproc.Start(ctx, redisproc.Config{
		Bin:        bin,
		TempPrefix: "dlock-market-",
		Args:       []string{"--appendonly", "no"},
	})
	if err != nil {
		return nil, err
	}
	return &embeddedServer{
		addr:     srv.Addr(),
		describe: fmt.Sprintf("a private redis-server %s on %s (pid %d, stopped at exit)", srv.Version(), srv.Addr(), srv.PID()),
		stop:     func() { _ = srv.Close() },
	}, nil
}
