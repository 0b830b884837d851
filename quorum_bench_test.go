package dlock_test

import (
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// BenchmarkQuorum: one goroutine's lock+unlock on one master beside a
// quorum of 5 (the first of them the same server), and a quorum of 5 with
// 2 masters killed (connection refused): what the fan-out, the fence raise
// and the release on every master cost per cycle. bench/ -scenario quorum
// has the fuller comparison (percentiles, blackholed masters, redsync).
func BenchmarkQuorum(b *testing.B) {
	servers, rdbs := quorumMasters(b, 5)
	down := redistest.Masters(b, 2)
	deadRdbs := append([]redis.UniversalClient{}, rdbs[:3]...)
	for _, s := range down {
		deadRdbs = append(deadRdbs, s.Client(b))
		s.Kill()
	}
	for _, bc := range []struct {
		name string
		c    func() (*dlock.Client, error)
	}{
		{"masters=1", func() (*dlock.Client, error) { return dlock.New(servers[0].Client(b)), nil }},
		{"masters=5", func() (*dlock.Client, error) { return dlock.NewQuorum(rdbs) }},
		{"masters=5,killed=2", func() (*dlock.Client, error) { return dlock.NewQuorum(deadRdbs) }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c, err := bc.c()
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			serialCycles(b, c.Mutex("bench-quorum"))
		})
	}
}
