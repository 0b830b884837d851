package rueidisdlock_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redisproc"
	"github.com/dlock-go/dlock/rueidisdlock"
	"github.com/redis/rueidis"
)

// addr is the Redis server the example uses: in your code, yours; under go
// test, a private redis-server that TestMain starts.
var addr = "127.0.0.1:6379"

func TestMain(m *testing.M) {
	s, err := redisproc.Start(context.Background(), redisproc.Config{TempPrefix: "dlock-rueidis-example-"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting redis-server for the example:", err)
		os.Exit(1)
	}
	addr = s.Addr()
	code := m.Run()
	_ = s.Close()
	os.Exit(code)
}

// A Client over rueidis: the same Mutex, Lock and Unlock as over go-redis.
// For a Cluster give InitAddress the nodes; for Sentinel, the sentinels and
// ClientOption.Sentinel.MasterSet.
func Example() {
	ctx := context.Background()
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}})
	if err != nil {
		log.Fatal(err)
	}
	defer rc.Close()
	locks, err := rueidisdlock.New(rc)
	if err != nil {
		log.Fatal(err)
	}
	defer locks.Close()

	lease, err := locks.Mutex("invoice:42", dlock.TTL(15*time.Second)).Lock(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("locked", lease.Name())
	if err := lease.Unlock(ctx); err != nil {
		log.Fatal(err)
	}
	fmt.Println("unlocked")
	// Output:
	// locked invoice:42
	// unlocked
}
