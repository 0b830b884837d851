package main

import (
	"context"
	"fmt"

	"github.com/dlock-go/dlock/internal/redisproc"
)

// startServer starts a private redis-server (bin, a path or a name in
// $PATH) on a free loopback port, without persistence, so that runs do not
// depend on (or disturb) a shared one. Close stops it and removes its
// directory; if the bench dies first, redisproc sees to both.
func startServer(bin string) (*redisproc.Server, error) {
	srv, err := redisproc.Start(context.Background(), redisproc.Config{
		Bin:        bin,
		TempPrefix: "dlock-bench-",
		Args:       []string{"--appendonly", "no", "--loglevel", "warning"},
	})
	if err != nil {
		return nil, fmt.Errorf("%w (or pass -redis URL)", err)
	}
	return srv, nil
}
