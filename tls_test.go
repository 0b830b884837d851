package dlock_test

import (
	"context"
	"crypto/tls"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/testcert"
	"github.com/redis/go-redis/v9"
)

// Every primitive works over TLS as in plain text: notified waiting (the
// pub/sub connection speaks TLS too), the line, hand-overs, Extend, TTL and
// watchdog renewal; with and without a client certificate.
func TestTLSEveryPrimitive(t *testing.T) {
	certs := testcert.New(t)
	for _, mutual := range []bool{false, true} {
		t.Run(map[bool]string{false: "server-cert", true: "mutual"}[mutual], func(t *testing.T) {
			s := redistest.Start(t, redistest.Options{TLS: certs, TLSAuthClients: mutual})
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			var renewals atomic.Int64
			a, _ := newClient(t, s)
			countRenewals(a, &renewals)
			b, _ := newClient(t, s)
			everyPrimitive(t, ctx, a, b, &renewals, s.Client(t), func(*dlock.Lease) {})
			for _, c := range []*dlock.Client{a, b} {
				if err := c.Close(); err != nil {
					t.Errorf("Close: %v", err)
				}
			}
		})
	}
}

// A server whose certificate the client does not trust, or that wants a
// client certificate it was not given, fails a lock call with the TLS
// error, within the call's ctx: never a hang, never a lock.
func TestTLSUntrusted(t *testing.T) {
	certs := testcert.New(t)
	s := redistest.Start(t, redistest.Options{TLS: certs, TLSAuthClients: true})
	for _, c := range []struct {
		name string
		cfg  *tls.Config
		want string
	}{
		{"unknown CA", testcert.New(t).ClientConfig(true), "certificate signed by unknown authority"},
		{"no client certificate", certs.ClientConfig(false), "certificate"},
	} {
		t.Run(c.name, func(t *testing.T) {
			rdb := s.Client(t, func(o *redis.Options) { o.TLSConfig = c.cfg })
			locks, err := newDlockOrErr(t, rdb)
			if err != nil { // rueidis meets the handshake in rueidis.NewClient
				// Without a client certificate the server resets the
				// connection during rueidis's first write, and rueidis says
				// only that: the refusal is still an error at once.
				if c.name == "unknown CA" && !strings.Contains(err.Error(), c.want) {
					t.Errorf("rueidis.NewClient's error %q does not say %q", err, c.want)
				}
				return
			}
			defer locks.Close()
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			for _, lock := range []func(context.Context) (*dlock.Lease, error){
				locks.Mutex("tls").TryLock,
				locks.Mutex("tls").Lock,
				locks.Mutex("tls", dlock.Fair()).Lock,
				locks.RWMutex("tls-rw").RLock,
				func(ctx context.Context) (*dlock.Lease, error) { return locks.Semaphore("tls-s", 2).Acquire(ctx, 1) },
			} {
				l, err := lock(ctx)
				switch {
				case err == nil:
					t.Fatalf("obtained %s through an untrusted TLS connection", l.Name())
				case errors.Is(err, context.DeadlineExceeded):
					t.Fatalf("waited until the ctx ended instead of reporting the TLS failure: %v", err)
				case !strings.Contains(err.Error(), c.want):
					t.Errorf("error %q does not say %q", err, c.want)
				}
			}
			if n := s.Do(t, "DBSIZE"); n != int64(0) {
				t.Errorf("%v keys written through an untrusted connection", n)
			}
		})
	}
}

// Every primitive works on a Redis Cluster whose nodes speak TLS only,
// the cluster bus included, with client certificates: the slot map, each
// master's sharded subscriptions and the scripts all go over TLS.
func TestTLSClusterEveryPrimitive(t *testing.T) {
	certs := testcert.New(t)
	nodes := redistest.Cluster(t, 3, redistest.Options{TLS: certs, TLSAuthClients: true})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var renewals atomic.Int64
	a := newDlock(t, redistest.ClusterClient(t, nodes))
	defer a.Close()
	countRenewals(a, &renewals)
	b := newDlock(t, redistest.ClusterClient(t, nodes))
	defer b.Close()
	everyPrimitive(t, ctx, a, b, &renewals, redistest.ClusterClient(t, nodes), func(*dlock.Lease) {})
}
