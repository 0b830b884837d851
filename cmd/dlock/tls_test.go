package main

import (
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/testcert"
)

// dlockTLS runs dlock to completion with env added and returns its exit
// code and output.
func dlockTLS(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	p := startDlockEnv(t, env, args...)
	code = p.exit()
	return code, p.stdout.String(), p.stderr.String()
}

// run, status, list and unlock --force work on a rediss:// server whose
// certificate a private CA signed and that asks for a client certificate,
// with the certificates given by flag or by variable; a waiting run is
// notified over TLS.
func TestCLIOverTLS(t *testing.T) {
	certs := testcert.New(t)
	s := redistest.Start(t, redistest.Options{TLS: certs, TLSAuthClients: true})
	base := []string{"DLOCK_REDIS_URL=" + s.URL(), "REDIS_URL=", "DLOCK_TLS_CA=", "DLOCK_TLS_CERT=", "DLOCK_TLS_KEY="}
	for _, c := range []struct {
		name  string
		env   []string
		flags []string
	}{
		{"flags", base, []string{"--tls-ca", certs.CAFile, "--tls-cert", certs.ClientCertFile, "--tls-key", certs.ClientKeyFile}},
		{"variables", append(base, "DLOCK_TLS_CA="+certs.CAFile, "DLOCK_TLS_CERT="+certs.ClientCertFile, "DLOCK_TLS_KEY="+certs.ClientKeyFile), nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			name := "tls-" + c.name
			cmd := func(args ...string) []string { return append(append([]string{args[0]}, c.flags...), args[1:]...) }
			holder := startDlockEnv(t, c.env, cmd("run", name, "--", "sh", "-c", "echo ready; exec sleep 310")...)
			if l := holder.line(); l != "ready" {
				t.Fatalf("holder: %q", l)
			}
			waiter := startDlockEnv(t, c.env, cmd("run", "--wait", "25s", name, "--", "echo", "got it")...)
			waitSubscribed(t, s.Client(t), "dlock:{"+name+"}", 1)

			code, out, errOut := dlockTLS(t, c.env, cmd("status", "--json", name)...)
			var st lockInfo
			if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil || st.State != "held" || st.WaitingClients != 1 {
				t.Fatalf("status: exit %d, %v, %+v; stderr %q", code, err, st, errOut)
			}
			code, out, errOut = dlockTLS(t, c.env, cmd("list", "--json", "tls-*")...)
			var infos []lockInfo
			if err := json.Unmarshal([]byte(out), &infos); code != 0 || err != nil || len(infos) == 0 {
				t.Fatalf("list: exit %d, %v, %s; stderr %q", code, err, out, errOut)
			}
			code, out, errOut = dlockTLS(t, c.env, cmd("unlock", "--force", name)...)
			if code != 0 || !strings.Contains(out, "removed the holder") {
				t.Fatalf("unlock --force: exit %d, %q; stderr %q", code, out, errOut)
			}
			// The waiter hears the release within its --wait, far shorter
			// than the holder's TTL would have made it wait unnotified
			// had the removal not been published.
			if l := waiter.line(); l != "got it" {
				t.Fatalf("waiter: %q; stderr %s", l, waiter.stderr)
			}
			if code := waiter.exit(); code != 0 {
				t.Errorf("waiter: exit %d; stderr %s", code, waiter.stderr)
			}
			if code, _ := holder.end(); code == 0 {
				t.Errorf("the holder removed by unlock --force exited 0")
			}
		})
	}
}

// A rediss:// server the certificates do not fit is a clear error that
// names the flag that fixes it, within the connection check's bound:
// another CA (or the system's), no client certificate for a server that
// asks for one. Bad TLS flags are usage errors.
func TestCLITLSErrors(t *testing.T) {
	certs := testcert.New(t)
	other := testcert.New(t)
	s := redistest.Start(t, redistest.Options{TLS: certs, TLSAuthClients: true})
	plain := redistest.Start(t)
	notPEM := filepath.Join(t.TempDir(), "not.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	env := []string{"DLOCK_REDIS_URL=" + s.URL(), "REDIS_URL=", "DLOCK_TLS_CA=", "DLOCK_TLS_CERT=", "DLOCK_TLS_KEY="}
	client := []string{"--tls-cert", certs.ClientCertFile, "--tls-key", certs.ClientKeyFile}
	for _, c := range []struct {
		name  string
		env   []string
		flags []string
		code  int
		want  []string
	}{
		{"another CA", env, append([]string{"--tls-ca", other.CAFile}, client...), exitUnavailable, []string{"certificate is not trusted", "--tls-ca FILE"}},
		{"the system's CAs", env, client, exitUnavailable, []string{"certificate is not trusted", "--tls-ca FILE"}},
		{"another CA by variable", append(env, "DLOCK_TLS_CA="+other.CAFile), client, exitUnavailable, []string{"certificate is not trusted", "--tls-ca FILE"}},
		{"no client certificate", env, []string{"--tls-ca", certs.CAFile}, exitUnavailable, []string{"asks for a client certificate", "--tls-cert FILE --tls-key FILE"}},
		{"a client certificate of another CA", env, []string{"--tls-ca", certs.CAFile, "--tls-cert", other.ClientCertFile, "--tls-key", other.ClientKeyFile}, exitUnavailable, []string{"refused the client certificate"}},
		{"a certificate without its key", env, []string{"--tls-ca", certs.CAFile, "--tls-cert", certs.ClientCertFile}, exitUsage, []string{"--tls-cert " + certs.ClientCertFile + " needs --tls-key"}},
		{"a CA file that is missing", env, []string{"--tls-ca", "/nonexistent/ca.pem"}, exitUsage, []string{"--tls-ca /nonexistent/ca.pem", "no such file"}},
		{"a CA file without a certificate", env, []string{"--tls-ca", notPEM}, exitUsage, []string{"no PEM certificate"}},
		{"a CA for a server without TLS", []string{"DLOCK_REDIS_URL=" + plain.URL(), "REDIS_URL=", "DLOCK_TLS_CA="}, []string{"--tls-ca", certs.CAFile}, exitUsage, []string{"applies to TLS servers only", "rediss://"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			for _, args := range [][]string{
				{"run", "tls-err", "--", "true"},
				{"status", "tls-err"},
				{"list"},
				{"unlock", "--force", "tls-err"},
			} {
				args = append(append([]string{args[0]}, c.flags...), args[1:]...)
				code, out, errOut := dlockTLS(t, c.env, args...)
				if code != c.code {
					t.Errorf("%v: exit %d, want %d; stdout %q, stderr %q", args, code, c.code, out, errOut)
				}
				for _, w := range c.want {
					if !strings.Contains(errOut, w) {
						t.Errorf("%v: stderr %q does not say %q", args, errOut, w)
					}
				}
				oneLine(t, strings.Join(args, " "), errOut)
			}
		})
	}
	if n := s.Do(t, "DBSIZE"); n != int64(0) {
		t.Errorf("%v keys written by commands that failed", n)
	}
}

// The TLS flags apply to a rediss+cluster:// URL too: every node, the
// slot map's included, is reached over TLS with the client certificate.
func TestCLIClusterOverTLS(t *testing.T) {
	t.Parallel()
	certs := testcert.New(t)
	nodes := redistest.Cluster(t, 3, redistest.Options{TLS: certs, TLSAuthClients: true})
	url := "rediss+cluster://" + nodes[0].Addr() + "?addr=" + nodes[1].Addr()
	env := []string{"DLOCK_REDIS_URL=" + url, "REDIS_URL=", "DLOCK_TLS_CA=" + certs.CAFile, "DLOCK_TLS_CERT=" + certs.ClientCertFile, "DLOCK_TLS_KEY=" + certs.ClientKeyFile}
	holder := startDlockEnv(t, env, "run", "tls-cluster", "--", "sh", "-c", "echo ready; exec sleep 310")
	if l := holder.line(); l != "ready" {
		t.Fatalf("holder: %q", l)
	}
	code, out, errOut := dlockTLS(t, env, "status", "--json", "tls-cluster")
	var st lockInfo
	if err := json.Unmarshal([]byte(out), &st); code != 0 || err != nil || st.State != "held" {
		t.Fatalf("status: exit %d, %v, %+v; stderr %q", code, err, st, errOut)
	}
	code, out, errOut = dlockTLS(t, env, "list", "--json")
	var infos []lockInfo
	if err := json.Unmarshal([]byte(out), &infos); code != 0 || err != nil || len(infos) != 1 {
		t.Fatalf("list: exit %d, %v, %s; stderr %q", code, err, out, errOut)
	}
	if code, out, errOut := dlockTLS(t, env, "unlock", "--force", "tls-cluster"); code != 0 {
		t.Fatalf("unlock --force: exit %d, %q; stderr %q", code, out, errOut)
	}
	if code, _ := holder.end(); code == 0 {
		t.Errorf("the holder removed by unlock --force exited 0")
	}
	// Without the CA the cluster's certificates are not trusted.
	code, _, errOut = dlockTLS(t, append(env, "DLOCK_TLS_CA="), "status", "tls-cluster")
	if code == 0 || !strings.Contains(errOut, "--tls-ca") {
		t.Errorf("status without the CA: exit %d, stderr %q; want the --tls-ca hint", code, errOut)
	}
}

// TestExplainTLSReset: a TLS connection that the server resets or closes
// before the client reads its alert (TLS 1.3 checks the client's
// certificate after the client's handshake has ended) is still explained
// by the certificate flags, not left as a bare reset.
func TestExplainTLSReset(t *testing.T) {
	reset := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	withCert := &tls.Config{Certificates: []tls.Certificate{{}}}
	for _, c := range []struct {
		name string
		err  error
		conf *tls.Config
		want string
	}{
		{"reset, no client certificate", reset, &tls.Config{}, "--tls-cert FILE --tls-key FILE"},
		{"EOF, no client certificate", io.EOF, &tls.Config{}, "asks for a client certificate"},
		{"reset, a client certificate", reset, withCert, "if it refused the client certificate"},
		{"reset without TLS", reset, nil, "connection reset by peer"},
	} {
		got := explainTLS(c.err, c.conf).Error()
		if !strings.Contains(got, c.want) {
			t.Errorf("%s: %q does not say %q", c.name, got, c.want)
		}
		if c.conf == nil && got != c.err.Error() {
			t.Errorf("%s: %q, want the error as it was", c.name, got)
		}
	}
}
