package dlock_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// A re-executed test binary plays one worker process of a multi-process test.
	if role := os.Getenv(childRoleEnv); role != "" {
		os.Exit(runChild(role))
	}
	// redisproc keeps one OS thread for starting servers (so they die with it).
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/dlock-go/dlock/internal/redisproc.spawnLoop"))
}
