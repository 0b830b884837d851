//go:build linux

package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/dlock-go/dlock/internal/redistest"
)

// openPTY returns a new pseudo-terminal's master and slave.
func openPTY(t *testing.T) (master, slave *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("no pseudo-terminals here: %v", err)
	}
	t.Cleanup(func() { _ = m.Close() })
	var n uint32
	var ioctlErr error
	rc, err := m.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	err = rc.Control(func(fd uintptr) {
		var unlock int32
		if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); e != 0 {
			ioctlErr = e
			return
		}
		if _, _, e := syscall.Syscall(syscall.SYS_IOCTL, fd, syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); e != 0 {
			ioctlErr = e
		}
	})
	if err != nil || ioctlErr != nil {
		t.Fatalf("setting up the pseudo-terminal: %v %v", err, ioctlErr)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return m, s
}

// ptyProc is a process that leads a new session whose controlling
// terminal is a pseudo-terminal, as a login shell does; the test types on
// the terminal and reads what is written to it.
type ptyProc struct {
	t      *testing.T
	cmd    *exec.Cmd
	master *os.File
	out    *lineWriter
	done   chan struct{}
}

// startOnPTY starts argv with the pseudo-terminal as its standard input,
// output and error, talking to the Redis server at addr through
// DLOCK_REDIS_URL. Everything in its session is killed when the test ends.
func startOnPTY(t *testing.T, addr string, argv ...string) *ptyProc {
	t.Helper()
	master, slave := openPTY(t)
	p := &ptyProc{t: t, master: master, out: newLineWriter(), done: make(chan struct{})}
	p.cmd = exec.Command(argv[0], argv[1:]...)
	p.cmd.Env = append(os.Environ(), "DLOCK_REDIS_URL=redis://"+addr, "REDIS_URL=")
	p.cmd.Stdin, p.cmd.Stdout, p.cmd.Stderr = slave, slave, slave
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	_ = slave.Close()
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		killSession(p.cmd.Process.Pid)
	})
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := master.Read(buf)
			_, _ = p.out.Write(buf[:n])
			if err != nil {
				return
			}
		}
	}()
	return p
}

// waitFor waits, within procTimeout, until the terminal shows s; it fails
// at once if it shows unwanted first.
func (p *ptyProc) waitFor(s, unwanted string) {
	p.t.Helper()
	deadline := time.Now().Add(procTimeout)
	for !strings.Contains(p.out.String(), s) {
		if unwanted != "" && strings.Contains(p.out.String(), unwanted) {
			p.t.Fatalf("the terminal shows %q before %q: %q", unwanted, s, p.out)
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("the terminal did not show %q within %v: %q", s, procTimeout, p.out)
		}
		time.Sleep(pollEvery)
	}
}

// typeIn writes s to the terminal as if typed.
func (p *ptyProc) typeIn(s string) {
	p.t.Helper()
	if _, err := p.master.WriteString(s); err != nil {
		p.t.Fatal(err)
	}
}

// end waits, within procTimeout, for the process to end and returns its
// exit code as a shell would report it.
func (p *ptyProc) end() int {
	p.t.Helper()
	select {
	case <-p.done:
	case <-time.After(procTimeout):
		p.t.Fatalf("%q did not exit within %v; terminal output: %q", p.cmd.Args, procTimeout, p.out)
	}
	return shellStatus(p.cmd.ProcessState)
}

// On a terminal, COMMAND runs in the terminal's foreground group: it can
// read the terminal (a background group would be stopped by SIGTTIN, and
// dlock would hang), Ctrl-C reaches it, and dlock takes the terminal back
// afterwards (else its release would be stopped by SIGTTOU).
func TestRunOnTerminal(t *testing.T) {
	t.Parallel()
	s := redistest.Start(t)
	for _, tc := range []struct {
		name  string
		input string
		want  int
	}{
		{"read", "hello\n", 0},
		{"ctrl-c", "hello\n\x03", 128 + int(syscall.SIGINT)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			script := `read x; echo "got $x"`
			if tc.want != 0 {
				script += `; exec sleep 30`
			}
			p := startOnPTY(t, s.Addr(), dlockBinary(t), "run", "tty", "--", "sh", "-c", script)
			first, rest, _ := strings.Cut(tc.input, "\n")
			p.typeIn(first + "\n")
			p.waitFor("got hello", "")
			if rest != "" {
				p.typeIn(rest)
			}
			if code := p.end(); code != tc.want {
				t.Errorf("exit %d, want %d; terminal output: %q", code, tc.want, p.out)
			}
		})
	}
}
