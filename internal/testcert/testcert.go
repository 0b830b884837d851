// Package testcert makes throwaway TLS certificates for tests: a CA of its
// own, a server certificate it signed for 127.0.0.1, ::1 and localhost,
// and a client certificate for mutual TLS, written as PEM files. Nothing
// here is fit for production: the keys live in a test's temporary
// directory and the certificates expire a day after they are made.
package testcert

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Certs are one CA and the two certificates it signed, as files and as
// parsed values.
type Certs struct {
	// CAFile is the CA certificate (PEM): what a client trusts, and what
	// a server checks client certificates against.
	CAFile string
	// CertFile and KeyFile are the server's certificate and key (PEM),
	// valid for 127.0.0.1, ::1 and localhost.
	CertFile, KeyFile string
	// ClientCertFile and ClientKeyFile are a client certificate and key
	// (PEM) for mutual TLS.
	ClientCertFile, ClientKeyFile string
	// Pool holds the CA certificate alone.
	Pool *x509.CertPool
	// Client is the client certificate with its key.
	Client tls.Certificate
}

// New makes a CA and its server and client certificates in a new
// t.TempDir(). Any failure fails the test.
func New(t testing.TB) *Certs {
	t.Helper()
	c, err := newCerts(t.TempDir())
	if err != nil {
		t.Fatalf("testcert: %v", err)
	}
	return c
}

// ClientConfig returns a tls.Config that trusts the CA alone and, with
// mutual true, presents the client certificate.
func (c *Certs) ClientConfig(mutual bool) *tls.Config {
	cfg := &tls.Config{RootCAs: c.Pool, MinVersion: tls.VersionTLS12}
	if mutual {
		cfg.Certificates = []tls.Certificate{c.Client}
	}
	return cfg
}

func newCerts(dir string) (*Certs, error) {
	now := time.Now()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "dlock test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	c := &Certs{
		CAFile:         filepath.Join(dir, "ca.pem"),
		CertFile:       filepath.Join(dir, "server.pem"),
		KeyFile:        filepath.Join(dir, "server-key.pem"),
		ClientCertFile: filepath.Join(dir, "client.pem"),
		ClientKeyFile:  filepath.Join(dir, "client-key.pem"),
		Pool:           x509.NewCertPool(),
	}
	c.Pool.AddCert(ca)
	if err := writePEM(c.CAFile, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	server := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "localhost"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
		// Client auth too: a cluster node presents it on the bus.
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	if _, err := leaf(server, ca, caKey, now, c.CertFile, c.KeyFile); err != nil {
		return nil, err
	}
	client := &x509.Certificate{
		SerialNumber: big.NewInt(3),
		Subject:      pkix.Name{CommonName: "dlock test client"},
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if c.Client, err = leaf(client, ca, caKey, now, c.ClientCertFile, c.ClientKeyFile); err != nil {
		return nil, err
	}
	return c, nil
}

// leaf signs tmpl with the CA, writes it and its new key, and returns both.
func leaf(tmpl, ca *x509.Certificate, caKey *ecdsa.PrivateKey, now time.Time, certFile, keyFile string) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl.NotBefore, tmpl.NotAfter = now.Add(-time.Hour), now.Add(24*time.Hour)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return tls.Certificate{}, err
	}
	if err := writePEM(certFile, "CERTIFICATE", der); err != nil {
		return tls.Certificate{}, err
	}
	if err := writePEM(keyFile, "PRIVATE KEY", keyDER); err != nil {
		return tls.Certificate{}, err
	}
	return tls.LoadX509KeyPair(certFile, keyFile)
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}
