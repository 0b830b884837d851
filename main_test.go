package dlock_test

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/dlock-go/dlock/internal/redisproc"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// A re-executed test binary plays one worker process of a multi-process test.
	if role := os.Getenv(childRoleEnv); role != "" {
		os.Exit(runChild(role))
	}
	// The examples run against a private server of their own.
	s, err := redisproc.Start(context.Background(), redisproc.Config{TempPrefix: "dlock-examples-"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting redis-server for the examples:", err)
		os.Exit(1)
	}
	addr = s.Addr()
	code := m.Run()
	_ = s.Close()
	if code == 0 {
		// redisproc keeps one OS thread for starting servers (so they die with it).
		if err := goleak.Find(goleak.IgnoreAnyFunction("github.com/dlock-go/dlock/internal/redisproc.spawnLoop")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}
