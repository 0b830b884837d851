package redisproc

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

const (
	// probeDialTimeout and probeTimeout bound one readiness probe. A
	// loading server answers at once (with LOADING), so a probe that takes
	// longer has reached something else, or a server not yet listening.
	probeDialTimeout = 200 * time.Millisecond
	probeTimeout     = time.Second
	// logTailLines is how much of a server's output an error quotes.
	logTailLines = 40
)

// launch starts one process on port and waits until it is ready: it
// answers PING, has finished loading its data, and is the process we
// started. busy reports that another process holds the port; the caller may
// try again (another port, or later). On any error no process is left
// running; ctx's end is reported as ctx.Err() itself. s.mu is held.
func (s *Server) launch(ctx context.Context, port int, deadline time.Time) (p *proc, busy bool, err error) {
	logOff, stdioOff := fileSize(s.logPath), fileSize(s.stdioPath)
	stdio, err := os.OpenFile(s.stdioPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, false, err
	}
	cmd := exec.Command(s.bin, s.args(port)...)
	cmd.Dir = s.dataDir
	if len(s.env) > 0 {
		cmd.Env = append(os.Environ(), s.env...)
	}
	cmd.Stdout, cmd.Stderr = stdio, stdio
	p, err = startProc(cmd)
	_ = stdio.Close()
	if err != nil {
		return nil, false, fmt.Errorf("starting %s: %w", s.bin, err)
	}

	addr := loopback(port)
	output := func() string {
		return tail(readFrom(s.logPath, logOff)+readFrom(s.stdioPath, stdioOff), logTailLines)
	}
	backoff := 2 * time.Millisecond
	for {
		if p.hasExited() {
			err := p.reap()
			out := output()
			if strings.Contains(out, "Address already in use") {
				return nil, true, fmt.Errorf("port %d in use", port)
			}
			return nil, false, fmt.Errorf("redis-server on %s exited before it was ready (%v); the end of its output:\n%s", addr, err, out)
		}
		info, err := probe(addr, s.tls)
		if err == nil {
			// The pid tells our server from one that another process
			// started on the port between our choice and our bind: that
			// one must never be taken for ours (the CLI flushes its
			// server). Ours will fail to bind, if it has not already.
			pid, _ := strconv.Atoi(InfoField(info, "process_id"))
			if pid != p.pid {
				p.kill()
				return nil, true, fmt.Errorf("port %d answered by another process (INFO process_id %q), not by ours (%d)", port, InfoField(info, "process_id"), p.pid)
			}
			if InfoField(info, "loading") == "0" || InfoField(info, "redis_mode") == "sentinel" {
				s.version = InfoField(info, "redis_version")
				return p, false, nil
			}
			err = errors.New("still loading")
		}
		if ctx.Err() != nil {
			p.kill()
			return nil, false, ctx.Err()
		}
		if time.Now().After(deadline) {
			p.kill()
			return nil, false, fmt.Errorf("redis-server on %s not ready within %v (last probe: %v); the end of its output:\n%s", addr, s.timeout, err, output())
		}
		select {
		case <-p.exited:
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 50*time.Millisecond)
	}
}

// probe sends PING and INFO on a fresh connection (over TLS with t) and
// returns INFO's text. It fails unless PING answers PONG (a loading server
// answers LOADING).
func probe(addr string, t *TLS) (string, error) {
	var c net.Conn
	c, err := net.DialTimeout("tcp", addr, probeDialTimeout)
	if err != nil {
		return "", err
	}
	defer func() { _ = c.Close() }()
	if err := c.SetDeadline(time.Now().Add(probeTimeout)); err != nil {
		return "", err
	}
	if t != nil {
		cfg := t.Client
		if cfg.ServerName == "" {
			cfg = cfg.Clone()
			cfg.ServerName = "127.0.0.1" // as tls.Dial would infer it from addr
		}
		tc := tls.Client(c, cfg)
		if err := tc.Handshake(); err != nil {
			return "", fmt.Errorf("TLS handshake: %w", err)
		}
		c = tc
	}
	if _, err := io.WriteString(c, "*1\r\n$4\r\nPING\r\n*1\r\n$4\r\nINFO\r\n"); err != nil {
		return "", err
	}
	r := bufio.NewReader(c)
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	if line = strings.TrimRight(line, "\r\n"); line != "+PONG" {
		return "", fmt.Errorf("PING: %s", line)
	}
	line, err = r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimRight(line, "\r\n")
	n, err := strconv.Atoi(strings.TrimPrefix(line, "$"))
	if !strings.HasPrefix(line, "$") || err != nil || n < 0 {
		return "", fmt.Errorf("INFO: %s", line)
	}
	buf := make([]byte, n)
	if _, err := io.ReadFull(r, buf); err != nil {
		return "", err
	}
	return string(buf), nil
}

// InfoField returns the value of the line "name:value" in the text of an
// INFO or CLUSTER INFO reply, or "" if there is no such line.
func InfoField(info, name string) string {
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}

func fileSize(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}

// readFrom returns the file's contents from offset on ("" if missing).
func readFrom(path string, off int64) string {
	b, err := os.ReadFile(path)
	if err != nil || off > int64(len(b)) {
		return ""
	}
	return string(b[off:])
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
