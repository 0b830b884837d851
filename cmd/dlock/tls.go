// This file is --tls-ca, --tls-cert and --tls-key: the certificates a
// rediss:// connection trusts and presents, for servers whose certificate
// a private CA signed and servers that ask for a client certificate
// (tls-auth-clients yes).

package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
)

// The variables that stand for the TLS flags when they are not given.
const (
	envTLSCA   = "DLOCK_TLS_CA"
	envTLSCert = "DLOCK_TLS_CERT"
	envTLSKey  = "DLOCK_TLS_KEY"
)

// tlsFiles are the TLS flags of one command.
type tlsFiles struct {
	ca, cert, key string
}

// addTLSFlags defines --tls-ca, --tls-cert and --tls-key on fs.
func addTLSFlags(fs *flag.FlagSet) *tlsFiles {
	f := &tlsFiles{}
	fs.StringVar(&f.ca, "tls-ca", "", "PEM `file` of the CA certificates that rediss:// servers' certificates must be signed by, instead of the system's (default $"+envTLSCA+")")
	fs.StringVar(&f.cert, "tls-cert", "", "PEM `file` of the client certificate rediss:// connections present, for a server that asks for one (with --tls-key; default $"+envTLSCert+")")
	fs.StringVar(&f.key, "tls-key", "", "PEM `file` of --tls-cert's private key (default $"+envTLSKey+")")
	return f
}

// tlsSetting is one TLS setting and where it came from.
type tlsSetting struct {
	value, flag, env string
	fromEnv          bool
}

// name is the setting as the user gave it, for errors: "--tls-ca FILE" or
// "$DLOCK_TLS_CA=FILE".
func (s tlsSetting) name() string {
	if s.fromEnv {
		return "$" + s.env + "=" + s.value
	}
	return "--" + s.flag + " " + s.value
}

// resolve returns each setting from its flag, else from its variable.
func (f *tlsFiles) resolve() (ca, cert, key tlsSetting) {
	pick := func(v, fl, env string) tlsSetting {
		if v != "" {
			return tlsSetting{value: v, flag: fl, env: env}
		}
		return tlsSetting{value: os.Getenv(env), flag: fl, env: env, fromEnv: true}
	}
	return pick(f.ca, "tls-ca", envTLSCA), pick(f.cert, "tls-cert", envTLSCert), pick(f.key, "tls-key", envTLSKey)
}

// apply sets the CA and the client certificate on every target that
// speaks TLS. A flag given for a target without TLS is refused (it would
// do nothing); a variable is left unused there, as it may be set for other
// servers.
func (f *tlsFiles) apply(targets []*redisTarget) error {
	if f == nil {
		return nil
	}
	ca, cert, key := f.resolve()
	if ca.value == "" && cert.value == "" && key.value == "" {
		return nil
	}
	if (cert.value == "") != (key.value == "") {
		given, missing := cert, key
		if cert.value == "" {
			given, missing = key, cert
		}
		return fmt.Errorf("%s needs --%s (or $%s) too: a client certificate is presented with its key", given.name(), missing.flag, missing.env)
	}
	var pool *x509.CertPool
	if ca.value != "" {
		pem, err := os.ReadFile(ca.value)
		if err != nil {
			return fmt.Errorf("%s: %w", ca.name(), err)
		}
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("%s: no PEM certificate in it (want a file of -----BEGIN CERTIFICATE----- blocks)", ca.name())
		}
	}
	var certs []tls.Certificate
	if cert.value != "" {
		c, err := tls.LoadX509KeyPair(cert.value, key.value)
		if err != nil {
			return fmt.Errorf("%s with %s: %w", cert.name(), key.name(), err)
		}
		certs = []tls.Certificate{c}
	}
	for _, t := range targets {
		if t.tls == nil {
			for _, s := range []tlsSetting{ca, cert} {
				if s.value != "" && !s.fromEnv {
					return fmt.Errorf("%s applies to TLS servers only; --redis %q does not use TLS (rediss://...)", s.name(), t.display)
				}
			}
			continue
		}
		if pool != nil {
			t.tls.RootCAs = pool
		}
		if certs != nil {
			t.tls.Certificates = certs
		}
	}
	return nil
}

// explainTLS says, for a connection refused on a certificate, what is
// wrong and which flag fixes it; other errors are returned as they are.
// conf is the target's TLS configuration, nil without TLS.
func explainTLS(err error, conf *tls.Config) error {
	if conf != nil && closedAtOnce(err) {
		// In TLS 1.3 the client's handshake ends before the server has
		// checked the client's certificate: a server that refuses it
		// sends an alert and closes, and a client that has meanwhile
		// written its first command may be reset before it reads the
		// alert (seen on a loaded 2-core VM).
		if len(conf.Certificates) == 0 && conf.GetClientCertificate == nil {
			return fmt.Errorf("the server closed the TLS connection (%w), as a server that asks for a client certificate does when it gets none: give one with --tls-cert FILE --tls-key FILE (or $%s, $%s)", err, envTLSCert, envTLSKey)
		}
		return fmt.Errorf("the server closed the TLS connection (%w); if it refused the client certificate, that must be signed by a CA in the server's tls-ca-cert-file", err)
	}
	var unknown x509.UnknownAuthorityError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	msg := err.Error()
	switch {
	case errors.As(err, &unknown):
		return fmt.Errorf("the server's TLS certificate is not trusted (%w): give the CA certificate that signed it with --tls-ca FILE (or $%s)", err, envTLSCA)
	case errors.As(err, &host):
		return fmt.Errorf("the server's TLS certificate is not for the host in --redis (%w): connect by a name or address the certificate names", err)
	case errors.As(err, &invalid):
		return fmt.Errorf("the server's TLS certificate is not valid (%w)", err)
	case strings.Contains(msg, "remote error: tls: certificate required"):
		return fmt.Errorf("the server asks for a client certificate (%w): give one with --tls-cert FILE --tls-key FILE (or $%s, $%s)", err, envTLSCert, envTLSKey)
	case strings.Contains(msg, "remote error: tls: bad certificate"), strings.Contains(msg, "remote error: tls: unknown certificate authority"):
		return fmt.Errorf("the server refused the client certificate (%w): it must be signed by a CA in the server's tls-ca-cert-file", err)
	}
	return err
}

// closedAtOnce reports a connection that the server reset or closed
// without a reply.
func closedAtOnce(err error) bool {
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) || errors.Is(err, io.EOF) ||
		strings.Contains(err.Error(), "connection reset by peer")
}
