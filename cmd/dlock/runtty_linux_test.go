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
			master, slave := openPTY(t)
			script := `read x; echo "got $x"`
			if tc.want != 0 {
				script += `; exec sleep 30`
			}
			cmd := exec.Command(dlockBinary(t), "run", "tty", "--", "sh", "-c", script)
			cmd.Env = append(os.Environ(), "DLOCK_REDIS_URL=redis://"+s.Addr(), "REDIS_URL=")
			cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
			// dlock leads a new session whose controlling terminal is the
			// pseudo-terminal, as a login shell's job would.
			cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			_ = slave.Close()
			exited := make(chan struct{})
			go func() { _ = cmd.Wait(); close(exited) }()
			t.Cleanup(func() {
				select {
				case <-exited:
				default:
					_ = cmd.Process.Kill()
					<-exited
				}
			})

			out := newLineWriter()
			go func() {
				buf := make([]byte, 4096)
				for {
					n, err := master.Read(buf)
					_, _ = out.Write(buf[:n])
					if err != nil {
						return
					}
				}
			}()
			input := tc.input
			first, rest, _ := strings.Cut(input, "\n")
			if _, err := master.WriteString(first + "\n"); err != nil {
				t.Fatal(err)
			}
			deadline := time.Now().Add(procTimeout)
			for !strings.Contains(out.String(), "got hello") {
				if time.Now().After(deadline) {
					t.Fatalf("COMMAND did not read the terminal within %v; terminal output: %q", procTimeout, out)
				}
				time.Sleep(pollEvery)
			}
			if rest != "" {
				if _, err := master.WriteString(rest); err != nil {
					t.Fatal(err)
				}
			}
			select {
			case <-exited:
			case <-time.After(procTimeout):
				t.Fatalf("dlock did not exit within %v; terminal output: %q", procTimeout, out)
			}
			if code := exitStatus(cmd.ProcessState); code != tc.want {
				t.Errorf("exit %d, want %d; terminal output: %q", code, tc.want, out)
			}
		})
	}
}
