package main

import (
	"slices"
	"strings"
	"testing"

	"github.com/dlock-go/dlock/internal/redistest"
	"github.com/dlock-go/dlock/internal/testcert"
)

// secret is the password in every URL of these tests.
const secret = "S3cretPass"

// withPassword makes s require the password secret (the harness's
// readiness probe does not authenticate, so it is set once s is up).
func withPassword(t *testing.T, s *redistest.Server) *redistest.Server {
	t.Helper()
	s.Do(t, "CONFIG", "SET", "requirepass", secret)
	return s
}

// A password in the Redis URL never appears in what dlock prints, on any
// error path: URLs that do not parse (net/url quotes them whole), bad
// ports, databases and options, unknown schemes, unreachable servers, a
// rejected password, a server that stops answering, for every command and
// whether the URL comes from --redis or $DLOCK_REDIS_URL.
func TestSecretsNeverPrinted(t *testing.T) {
	t.Parallel()
	s := withPassword(t, redistest.Start(t))
	good := "redis://default:" + secret + "@" + s.Addr()
	urls := []string{
		"redis://admin:" + secret + "@127.0.0.1:bad",
		"redis://admin:" + secret + "@127.0.0.1:99999",
		"redis://admin:" + secret + "@127.0.0.1:6379/-1",
		"redis://admin:" + secret + "@127.0.0.1:6379/x",
		"redis://admin:" + secret + "@127.0.0.1:6379?bogus=1",
		"redis://admin:" + secret + "@127.0.0.1:1?max_retries=-1",
		"redis://admin:" + secret + "%zz@127.0.0.1:1",
		"redis://127.0.0.1:1?max_retries=-1&password=" + secret,
		"rediss://admin:" + secret + "@127.0.0.1:1?max_retries=-1",
		"unix://admin:" + secret + "@/nonexistent/redis.sock?max_retries=-1",
		"ftp://admin:" + secret + "@127.0.0.1:1",
		"redis+cluster://admin:" + secret + "@127.0.0.1:1?max_retries=-1&dialer_retries=1",
		"redis+cluster://admin:" + secret + "@127.0.0.1:1/3",
		"redis+cluster://admin:" + secret + "@127.0.0.1:1?addr=bad",
		"redis+sentinel://admin:" + secret + "@127.0.0.1:1",
		"redis+sentinel://admin:" + secret + "@127.0.0.1:1?master_name=m&max_retries=-1&dialer_retries=1",
		// A password with characters that end the host early for the
		// parsers, and text that is not a URL.
		"redis://admin:" + secret + "?x@127.0.0.1:1",
		"redis://admin:" + secret + "#x@127.0.0.1:1",
		"redis://admin:" + secret + "/x@127.0.0.1:1",
		"redis://admin:1234?" + secret + "@127.0.0.1:1",
		"admin:" + secret + "@127.0.0.1:1",
		"redis:/admin:" + secret + "@127.0.0.1:1",
		"redis://default:" + secret + "x@" + s.Addr(), // rejected by the server
		good + "/99", // a database the server does not have
		// Lists of a quorum's masters: unreachable, too few, the same
		// twice, hosts without schemes, a majority down.
		"redis://admin:" + secret + "@127.0.0.1:1?max_retries=-1,redis://admin:" + secret + "@127.0.0.1:2?max_retries=-1,redis://admin:" + secret + "@127.0.0.1:3?max_retries=-1",
		"redis://admin:" + secret + "@127.0.0.1:1,redis://admin:" + secret + "@127.0.0.1:2",
		"redis://admin:" + secret + "@127.0.0.1:1,redis://admin:" + secret + "@127.0.0.1:2,redis://admin:" + secret + "@127.0.0.1:1",
		"redis://admin:" + secret + "@127.0.0.1:1,127.0.0.1:2,127.0.0.1:3",
		good + ",redis://admin:" + secret + ",x@127.0.0.1:1?max_retries=-1,redis://admin:" + secret + "@127.0.0.1:2?max_retries=-1",
	}
	commands := [][]string{
		{"run", "secret-lock", "--", "true"},
		{"status", "secret-lock"},
		{"list"},
		{"unlock", "--force", "secret-lock"},
	}
	check := func(t *testing.T, what string, p *dlockProc) {
		t.Helper()
		code, sig := p.end()
		out := p.stdout.String() + p.stderr.String()
		if strings.Contains(out, secret) {
			t.Errorf("%s printed the password (exit %d, signal %v):\n%s", what, code, sig, out)
		}
		if code == 0 {
			t.Errorf("%s succeeded; want an error: %s", what, out)
		}
	}
	t.Run("urls", func(t *testing.T) {
		for _, u := range urls {
			t.Run("", func(t *testing.T) {
				t.Parallel() // most of the time goes in failing dials
				noEnv := []string{"DLOCK_REDIS_URL=", "REDIS_URL="}
				for _, c := range commands {
					args := append([]string{c[0], "--redis", u}, c[1:]...)
					check(t, strings.Join(args, " "), startDlockEnv(t, noEnv, args...))
				}
				// $DLOCK_REDIS_URL goes the same way as --redis once read.
				check(t, "DLOCK_REDIS_URL="+u+" status", startDlockEnv(t, []string{"DLOCK_REDIS_URL=" + u, "REDIS_URL="}, commands[1]...))
				check(t, "market --redis "+u, startDlockEnv(t, noEnv, "market", "--redis", u, "--duration", "100ms", "--quiet"))
			})
		}
	})

	// The server stops answering while dlock waits for a held lock.
	holder := startDlockEnv(t, []string{"DLOCK_REDIS_URL=" + good}, "run", "secret-held", "--", "sh", "-c", "echo ready; exec sleep 310")
	holder.line()
	waiter := startDlockEnv(t, []string{"DLOCK_REDIS_URL=" + good}, "run", "--wait", "1s", "secret-held", "--", "true")
	s.Pause()
	t.Cleanup(s.Resume)
	check(t, "run --wait on a paused server", waiter)
}

// COMMAND is not given the password of a DLOCK_REDIS_URL that holds one,
// unless --pass-redis-url asks for it; one without a password is passed on.
func TestRunDoesNotPassRedisPassword(t *testing.T) {
	t.Parallel()
	s := withPassword(t, redistest.Start(t))
	url := "redis://default:" + secret + "@" + s.Addr()
	env := []string{"DLOCK_REDIS_URL=" + url, "REDIS_URL="}
	script := `echo "url=${DLOCK_REDIS_URL-unset}"`
	p := startDlockEnv(t, env, "run", "secret-env", "--", "sh", "-c", script)
	if l := p.line(); l != "url="+redactURL(url) {
		t.Errorf("COMMAND got %q, want the URL without its password", l)
	}
	if code := p.exit(); code != 0 {
		t.Errorf("exit %d; stderr %q", code, p.stderr)
	}
	p = startDlockEnv(t, env, "run", "--pass-redis-url", "secret-env", "--", "sh", "-c", script)
	if l := p.line(); l != "url="+url {
		t.Errorf("with --pass-redis-url COMMAND got %q, want the URL", l)
	}
	if code := p.exit(); code != 0 {
		t.Errorf("exit %d; stderr %q", code, p.stderr)
	}
	plain := redistest.Start(t)
	p = startDlock(t, plain.Addr(), "run", "secret-env", "--", "sh", "-c", script)
	if l := p.line(); l != "url=redis://"+plain.Addr() {
		t.Errorf("a URL without password: COMMAND got %q", l)
	}
	if code := p.exit(); code != 0 {
		t.Errorf("exit %d; stderr %q", code, p.stderr)
	}
}

// A DLOCK_REDIS_URL withheld from COMMAND (it holds a password) does not
// make a dlock run inside COMMAND lock on another server ($REDIS_URL or the
// default) instead, where it would exclude nobody: that dlock fails, and
// takes no lock anywhere.
func TestRunWithheldURLNotReplaced(t *testing.T) {
	t.Parallel()
	locks := withPassword(t, redistest.Start(t))
	other := redistest.Start(t)
	env := []string{"DLOCK_REDIS_URL=redis://default:" + secret + "@" + locks.Addr(), "REDIS_URL=redis://" + other.Addr()}
	p := startDlockEnv(t, env, "run", "outer", "--", "sh", "-c", `"$0" run inner -- true; echo "inner exit $?"`, dlockBinary(t))
	l := p.line()
	if code := p.exit(); code != 0 {
		t.Errorf("outer run: exit %d; stderr %q", code, p.stderr)
	}
	if n := other.Client(t).Exists(t.Context(), "dlock:{inner}").Val(); n != 0 {
		t.Errorf("the inner dlock run took its lock on $REDIS_URL's server (%s), not the outer one's", l)
	}
	if l == "inner exit 0" {
		t.Errorf("the inner dlock run succeeded without the password; stderr %q", p.stderr)
	}
	if strings.Contains(p.stderr.String(), secret) {
		t.Errorf("the password was printed: %q", p.stderr)
	}
}

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"redis://u:p@h:1/2":                      "redis://u:xxxxx@h:1/2",
		"redis://:p@h":                           "redis://:xxxxx@h",
		"redis://user@h":                         "redis://user@h",
		"redis://u:p@ss/w@rd@h:1?db=1":           "redis://u:xxxxx@h:1?db=1",
		"redis://h?password=p&db=1#f":            "redis://h?password=xxxxx&db=1#f",
		"redis+sentinel://h?sentinel_password=p": "redis+sentinel://h?sentinel_password=xxxxx",
		"unix://u:p@/tmp/r.sock":                 "unix://u:xxxxx@/tmp/r.sock",
		"redis://h:1":                            "redis://h:1",
		"not a url":                              "not a url",
		"rediss+cluster://u:p@h:1?addr=h2:2&x=y": "rediss+cluster://u:xxxxx@h:1?addr=h2:2&x=y",
		"u:p@h:1":                                "u:xxxxx@h:1",
		"redis://u:p?q@h:1":                      "redis://u:xxxxx@h:1",
		"redis://u:p#q@h:1":                      "redis://u:xxxxx@h:1",
		"redis://h?pass%77ord=p":                 "redis://h?pass%77ord=xxxxx",
		// A quorum's list: each URL on its own, addresses kept.
		"redis://u:p@a:1, redis://b:2?password=p,unix://u:p,q@/r.sock": "redis://u:xxxxx@a:1,redis://b:2?password=xxxxx,unix://u:xxxxx@/r.sock",
	} {
		if got := redactURL(in); got != want {
			t.Errorf("redactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// A password in the URL is not printed either when the connection fails
// on TLS (a CA that did not sign the server's certificate, no client
// certificate) or when the server refuses the user a permission it needs
// (NOPERM for channels, a script, a key), by any command.
func TestSecretsNeverPrintedTLSAndACL(t *testing.T) {
	t.Parallel()
	certs := testcert.New(t)
	other := testcert.New(t)
	tlsServer := redistest.Start(t, redistest.Options{TLS: certs, TLSAuthClients: true})
	tlsServer.Do(t, "CONFIG", "SET", "requirepass", secret)
	acl := docACL(t)
	refusing := map[string]*redistest.Server{}
	for _, rule := range []string{"&dlock:*", "+evalsha", "~dlock:*"} {
		s := redistest.Start(t)
		i := slices.Index(acl, any(rule))
		args := slices.Delete(slices.Clone(acl), i, i+1)
		args[4] = ">" + secret
		setACL(t, s, args)
		refusing[rule] = s
	}
	type attempt struct {
		env   []string
		flags []string
	}
	noTLS := []string{"REDIS_URL=", "DLOCK_TLS_CA=", "DLOCK_TLS_CERT=", "DLOCK_TLS_KEY="}
	tlsURL := "rediss://default:" + secret + "@" + tlsServer.Addr()
	var attempts []attempt
	for _, flags := range [][]string{
		{"--tls-ca", other.CAFile, "--tls-cert", certs.ClientCertFile, "--tls-key", certs.ClientKeyFile},
		{"--tls-ca", certs.CAFile},
		{"--tls-ca", certs.CAFile, "--tls-cert", other.ClientCertFile, "--tls-key", other.ClientKeyFile},
	} {
		attempts = append(attempts, attempt{append([]string{"DLOCK_REDIS_URL=" + tlsURL}, noTLS...), flags})
	}
	for _, s := range refusing {
		attempts = append(attempts, attempt{append([]string{"DLOCK_REDIS_URL=redis://dlock:" + secret + "@" + s.Addr()}, noTLS...), nil})
	}
	for _, a := range attempts {
		for _, c := range [][]string{
			{"run", "secret-acl", "--", "true"},
			{"run", "--wait", "forever", "secret-acl", "--", "true"},
			{"status", "secret-acl"},
			{"list"},
			{"unlock", "--force", "secret-acl"},
		} {
			args := append(append([]string{c[0]}, a.flags...), c[1:]...)
			p := startDlockEnv(t, a.env, args...)
			code, sig := p.end()
			out := p.stdout.String() + p.stderr.String()
			if strings.Contains(out, secret) {
				t.Errorf("%s %v printed the password (exit %d, signal %v):\n%s", redactURL(a.env[0]), args, code, sig, out)
			}
			if code == 0 && c[0] != "status" && c[0] != "list" {
				t.Errorf("%s %v succeeded; want an error: %s", redactURL(a.env[0]), args, out)
			}
		}
	}
}
