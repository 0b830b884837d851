package dlock_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/redis/go-redis/v9"
)

// Leader election: Campaign waits its turn, the lease's fence is the term,
// Observe follows the leader, Resign hands over at once. The README's
// "Leader election" is this code (TestElectionReadmeIsExample).
func ExampleClient_Election() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	locks := dlock.New(rdb)
	defer locks.Close()

	e := locks.Election("scheduler", dlock.TTL(5*time.Second)) // succeeded within 5s if this process dies
	lease, err := e.Campaign(ctx, "host-a:8080")               // waits, in arrival order, until leader
	if err != nil {
		log.Fatal(err)
	}
	// Lead under lease.Context() (it ends if leadership is lost), and give
	// the term, lease.Fence(), to storage that must refuse a deposed leader.
	value, term, _ := e.Leader(ctx) // what every process sees, in one read
	fmt.Println("leader", value, term == lease.Fence())

	watch, stop := context.WithCancel(ctx)
	defer stop()
	changes := e.Observe(watch) // the current leader, then every change
	fmt.Println("observed", (<-changes).Value)
	if err := e.Proclaim(ctx, "host-a:9090"); err != nil { // only while still leader
		log.Fatal(err)
	}
	fmt.Println("observed", (<-changes).Value)

	if err := e.Resign(ctx); err != nil { // the next candidate leads at once
		log.Fatal(err)
	}
	fmt.Println("observed", <-changes == dlock.Leader{}) // the zero Leader: nobody leads
	// Output:
	// leader host-a:8080 true
	// observed host-a:8080
	// observed host-a:9090
	// observed true
}
