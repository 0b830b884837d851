package testcert

import (
	"crypto/tls"
	"crypto/x509"
	"testing"
)

// The server certificate verifies, against the CA alone, for 127.0.0.1,
// ::1 and localhost, and not for another name; the client certificate
// verifies as a client's; another CA trusts neither.
func TestCertificatesVerify(t *testing.T) {
	c := New(t)
	other := New(t)
	server, err := x509.ParseCertificate(mustLoad(t, c.CertFile, c.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"127.0.0.1", "::1", "localhost"} {
		if _, err := server.Verify(x509.VerifyOptions{Roots: c.Pool, DNSName: name}); err != nil {
			t.Errorf("server certificate for %s: %v", name, err)
		}
	}
	if _, err := server.Verify(x509.VerifyOptions{Roots: c.Pool, DNSName: "example.com"}); err == nil {
		t.Error("server certificate verified for example.com")
	}
	if _, err := server.Verify(x509.VerifyOptions{Roots: other.Pool, DNSName: "localhost"}); err == nil {
		t.Error("server certificate verified against another CA")
	}
	client := c.Client.Leaf
	if client == nil {
		if client, err = x509.ParseCertificate(c.Client.Certificate[0]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := client.Verify(x509.VerifyOptions{Roots: c.Pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("client certificate: %v", err)
	}
}

func mustLoad(t *testing.T, certFile, keyFile string) []byte {
	t.Helper()
	c, err := loadPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// loadPair returns the DER of the certificate in certFile, checked to go
// with the key in keyFile.
func loadPair(certFile, keyFile string) ([]byte, error) {
	c, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	return c.Certificate[0], nil
}
