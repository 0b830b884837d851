package redistest

import (
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/testcert"
)

// A TLS server is reached by Client and Do over TLS, with the client
// certificate when it asks for one, and not in plain text.
func TestTLSServer(t *testing.T) {
	certs := testcert.New(t)
	for _, mutual := range []bool{false, true} {
		s := Start(t, Options{TLS: certs, TLSAuthClients: mutual})
		if !strings.HasPrefix(s.URL(), "rediss://") {
			t.Errorf("URL() = %q, want rediss://", s.URL())
		}
		if err := s.Client(t).Set(t.Context(), "k", "v", 0).Err(); err != nil {
			t.Fatalf("mutual %v: SET over TLS: %v", mutual, err)
		}
		if v := s.Do(t, "GET", "k"); v != "v" {
			t.Errorf("mutual %v: Do GET k = %v", mutual, v)
		}
		plain := s.Client(t, func(o *redis.Options) { o.TLSConfig, o.MaxRetries = nil, -1 })
		if err := plain.Ping(t.Context()).Err(); err == nil {
			t.Errorf("mutual %v: PING in plain text succeeded", mutual)
		}
	}
}
