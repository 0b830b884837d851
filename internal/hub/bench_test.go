package hub_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock/internal/driver/goredis"
	"github.com/dlock-go/dlock/internal/hub"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// counter is a Handler that counts messages.
type counter struct{ n atomic.Int64 }

func (c *counter) Message(string, string) { c.n.Add(1) }
func (c *counter) Gap(string)             {}

// BenchmarkMessage measures a message from SPUBLISH to the handler, through
// the hub and through a bare go-redis Receive loop: the hub should add no
// allocation and no goroutine hop per message.
func BenchmarkMessage(b *testing.B) {
	s := redistest.Start(b)
	pub := s.Client(b)
	b.Run("hub", func(b *testing.B) {
		var got counter
		h := hub.New(goredis.New(s.Client(b), false), &got, nil, nil)
		defer h.Close()
		<-h.Want("bench")
		publish(b, pub, &got)
	})
	b.Run("go-redis", func(b *testing.B) {
		var got counter
		ps := s.Client(b).SSubscribe(context.Background(), "bench")
		if _, err := ps.Receive(context.Background()); err != nil {
			b.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				msg, err := ps.ReceiveTimeout(context.Background(), time.Minute)
				if err != nil {
					return
				}
				if m, ok := msg.(*redis.Message); ok {
					got.Message(m.Channel, m.Payload)
				}
			}
		}()
		publish(b, pub, &got)
		_ = ps.Close()
		<-done
	})
}

// publish sends b.N messages in pipelines of 100 and waits until got has
// counted them all.
func publish(b *testing.B, pub *redis.Client, got *counter) {
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for sent := 0; sent < b.N; {
		n := min(100, b.N-sent)
		if _, err := pub.Pipelined(ctx, func(p redis.Pipeliner) error {
			for range n {
				p.SPublish(ctx, "bench", "1")
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		sent += n
		for deadline := time.Now().Add(10 * time.Second); got.n.Load() < int64(sent); {
			if time.Now().After(deadline) {
				b.Fatalf("%d of %d messages received", got.n.Load(), sent)
			}
			time.Sleep(10 * time.Microsecond)
		}
	}
}
