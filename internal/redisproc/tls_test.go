//go:build linux

package redisproc

import (
	"strings"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/testcert"
)

// A TLS server speaks TLS only, on the port Addr names: a client that
// trusts its CA (and, with tls-auth-clients yes, presents a certificate)
// is answered; plain text, an unknown CA and a missing client certificate
// are refused. Restart keeps it so.
func TestTLSOnly(t *testing.T) {
	certs := testcert.New(t)
	other := testcert.New(t)
	for _, auth := range []string{"no", "yes"} {
		t.Run("auth-clients-"+auth, func(t *testing.T) {
			mutual := auth == "yes"
			s := start(t, Config{TLS: &TLS{
				CertFile: certs.CertFile, KeyFile: certs.KeyFile, CAFile: certs.CAFile,
				AuthClients: auth, Client: certs.ClientConfig(mutual),
			}})
			if s.TLSConfig() == nil {
				t.Fatal("TLSConfig() = nil for a TLS server")
			}
			ping := func(o *redis.Options) error {
				o.Addr, o.DisableIdentity, o.MaxRetries = s.Addr(), true, -1
				c := redis.NewClient(o)
				defer c.Close()
				return c.Ping(t.Context()).Err()
			}
			if err := ping(&redis.Options{TLSConfig: certs.ClientConfig(mutual)}); err != nil {
				t.Fatalf("PING over TLS: %v", err)
			}
			if err := ping(&redis.Options{}); err == nil {
				t.Error("PING in plain text to a TLS-only server succeeded")
			}
			if err := ping(&redis.Options{TLSConfig: other.ClientConfig(false)}); err == nil || !strings.Contains(err.Error(), "certificate") {
				t.Errorf("PING trusting another CA: %v, want a certificate error", err)
			}
			if mutual {
				if err := ping(&redis.Options{TLSConfig: certs.ClientConfig(false)}); err == nil {
					t.Error("PING without a client certificate succeeded with tls-auth-clients yes")
				}
			}
			if err := s.Restart(t.Context()); err != nil {
				t.Fatal(err)
			}
			if err := ping(&redis.Options{TLSConfig: certs.ClientConfig(mutual)}); err != nil {
				t.Fatalf("PING over TLS after Restart: %v", err)
			}
		})
	}
}

// An incomplete TLS setup is refused before anything starts, saying what
// is missing.
func TestTLSIncomplete(t *testing.T) {
	certs := testcert.New(t)
	for _, c := range []struct {
		tls  TLS
		want string
	}{
		{TLS{KeyFile: certs.KeyFile, CAFile: certs.CAFile, Client: certs.ClientConfig(false)}, "CertFile"},
		{TLS{CertFile: certs.CertFile, KeyFile: certs.KeyFile, Client: certs.ClientConfig(false)}, "CAFile"},
		{TLS{CertFile: certs.CertFile, KeyFile: certs.KeyFile, CAFile: certs.CAFile}, "Client"},
		{TLS{CertFile: certs.CertFile, KeyFile: certs.KeyFile, CAFile: certs.CAFile, Client: certs.ClientConfig(false), AuthClients: "maybe"}, "maybe"},
	} {
		tc := c.tls
		_, err := Start(t.Context(), Config{Dir: t.TempDir(), TLS: &tc})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Start with %+v: %v, want an error naming %s", c.tls, err, c.want)
		}
	}
}
