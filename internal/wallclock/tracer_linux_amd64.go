//go:build linux && amd64

package wallclock

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// supported runs `true` under the tracer once: a sandbox that forbids
// ptrace or seccomp filters (some containers do) makes the tracer fail,
// and then Command is unsupported here rather than broken.
func supported() error {
	probe.once.Do(func() {
		c, err := command("true")
		if err == nil {
			var out strings.Builder
			c.Stderr = &out
			if err = c.Run(); err != nil {
				err = fmt.Errorf("%w: %s", err, strings.TrimSpace(out.String()))
			}
		}
		if err != nil {
			probe.err = fmt.Errorf("wallclock: tracing a child fails here (%v): %w", err, errors.ErrUnsupported)
		}
	})
	return probe.err
}

var probe struct {
	once sync.Once
	err  error
}

func init() {
	if os.Getenv(tracerEnv) == "1" {
		os.Exit(runTracer())
	}
}

// runTracer runs os.Args[1:] traced, moving its wall clock by the offsets
// read from fd 3, and returns the exit code to leave with: the child's.
func runTracer() int {
	fail := func(err error) int {
		fmt.Fprintln(os.Stderr, "wallclock tracer:", err)
		return 125
	}
	if len(os.Args) < 2 {
		return fail(errors.New("no command"))
	}
	// Every ptrace request must come from the thread that started the
	// child, and the seccomp filter is installed on it alone, for the
	// child to inherit: this goroutine keeps the thread to the end.
	runtime.LockOSThread()
	var offset atomic.Int64
	syscall.CloseOnExec(3)
	syscall.CloseOnExec(4)
	go applyOffsets(os.NewFile(3, "wallclock-ctl"), os.NewFile(4, "wallclock-ack"), &offset)

	cmd := exec.Command(os.Args[1], os.Args[2:]...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, tracerEnv+"=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	cmd.Env = append(cmd.Env, tracedEnv+"=1")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Ptrace: true, Pdeathsig: syscall.SIGKILL}
	if err := installFilter(); err != nil {
		return fail(err)
	}
	if err := cmd.Start(); err != nil {
		return fail(err)
	}
	t := &tracer{offset: &offset, leader: cmd.Process.Pid}
	code, err := t.run()
	if err != nil {
		_ = cmd.Process.Kill()
		return fail(err)
	}
	return code
}

// applyOffsets reads 8-byte offsets (ns, little-endian) from ctl, stores
// each, and acknowledges it with a byte on ack.
func applyOffsets(ctl, ack *os.File, offset *atomic.Int64) {
	var b [8]byte
	for {
		if _, err := io.ReadFull(ctl, b[:]); err != nil {
			return
		}
		offset.Store(int64(binary.LittleEndian.Uint64(b[:])))
		if _, err := ack.Write(b[:1]); err != nil {
			return
		}
	}
}

// installFilter makes this thread, and the processes it starts, stop for
// the tracer at each system call that reads the wall clock.
func installFilter() error {
	const (
		ld  = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
		jeq = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
		ret = unix.BPF_RET | unix.BPF_K
	)
	// struct seccomp_data: nr at 0, arch at 4, args[0] at 16 (its low
	// half, on a little-endian machine). Jumps count from the next one.
	prog := []unix.SockFilter{
		/* 0 */ {Code: ld, K: 4},
		/* 1 */ {Code: jeq, K: unix.AUDIT_ARCH_X86_64, Jf: 8}, // else allow
		/* 2 */ {Code: ld, K: 0},
		/* 3 */ {Code: jeq, K: unix.SYS_GETTIMEOFDAY, Jt: 5}, // trace
		/* 4 */ {Code: jeq, K: unix.SYS_TIME, Jt: 4}, // trace
		/* 5 */ {Code: jeq, K: unix.SYS_CLOCK_GETTIME, Jf: 4}, // else allow
		/* 6 */ {Code: ld, K: 16},
		/* 7 */ {Code: jeq, K: unix.CLOCK_REALTIME, Jt: 1},
		/* 8 */ {Code: jeq, K: unix.CLOCK_REALTIME_COARSE, Jf: 1},
		/* 9 */ {Code: ret, K: unix.SECCOMP_RET_TRACE},
		/* 10 */ {Code: ret, K: unix.SECCOMP_RET_ALLOW},
	}
	fprog := unix.SockFprog{Len: uint16(len(prog)), Filter: &prog[0]}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("prctl(PR_SET_NO_NEW_PRIVS): %w", err)
	}
	if _, _, e := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, 0, uintptr(unsafe.Pointer(&fprog))); e != 0 {
		return fmt.Errorf("seccomp: %w", e)
	}
	runtime.KeepAlive(prog)
	return nil
}

// tracer follows the child and every thread and process it makes.
type tracer struct {
	offset *atomic.Int64
	leader int
	known  map[int]bool // threads whose first stop was seen
	inCall map[int]bool // stopped by the filter: shift the call's result
}

// run traces until the leader exits, and returns its exit code.
func (t *tracer) run() (int, error) {
	t.known = map[int]bool{t.leader: true}
	t.inCall = map[int]bool{}
	var ws unix.WaitStatus
	if _, err := unix.Wait4(t.leader, &ws, unix.WALL, nil); err != nil {
		return 0, err
	}
	if !ws.Stopped() || ws.StopSignal() != unix.SIGTRAP {
		return 0, fmt.Errorf("child not stopped at its exec (status %#x)", ws)
	}
	opts := unix.PTRACE_O_TRACESECCOMP | unix.PTRACE_O_TRACESYSGOOD | unix.PTRACE_O_EXITKILL |
		unix.PTRACE_O_TRACECLONE | unix.PTRACE_O_TRACEFORK | unix.PTRACE_O_TRACEVFORK | unix.PTRACE_O_TRACEEXEC
	if err := unix.PtraceSetOptions(t.leader, opts); err != nil {
		return 0, fmt.Errorf("PTRACE_SETOPTIONS: %w", err)
	}
	if err := hideVDSO(t.leader); err != nil {
		return 0, err
	}
	if err := unix.PtraceCont(t.leader, 0); err != nil {
		return 0, err
	}
	for {
		tid, err := unix.Wait4(-1, &ws, unix.WALL, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		switch {
		case ws.Exited() || ws.Signaled():
			delete(t.known, tid)
			delete(t.inCall, tid)
			if tid != t.leader {
				continue
			}
			if ws.Signaled() {
				return 128 + int(ws.Signal()), nil
			}
			return ws.ExitStatus(), nil
		case !ws.Stopped():
			continue
		}
		// A thread that went away while stopped (the child was killed)
		// answers ESRCH: its exit comes next.
		if err := t.stopped(tid, ws); err != nil && err != unix.ESRCH {
			return 0, err
		}
	}
}

// stopped handles one stop of tid and lets it go on.
func (t *tracer) stopped(tid int, ws unix.WaitStatus) error {
	sig := ws.StopSignal()
	switch {
	case !t.known[tid]:
		// A new thread or process starts with a SIGSTOP of its own.
		t.known[tid] = true
		return unix.PtraceCont(tid, 0)
	case sig == unix.SIGTRAP && ws.TrapCause() == unix.PTRACE_EVENT_SECCOMP:
		t.inCall[tid] = true
		return unix.PtraceSyscall(tid, 0) // stop again when the call returns
	case sig == unix.SIGTRAP|0x80: // a system call stop (TRACESYSGOOD)
		done, err := t.shift(tid)
		if err != nil || !done {
			if err == nil {
				err = unix.PtraceSyscall(tid, 0)
			}
			return err
		}
		delete(t.inCall, tid)
		return unix.PtraceCont(tid, 0)
	case sig == unix.SIGTRAP && ws.TrapCause() == unix.PTRACE_EVENT_EXEC:
		// A new program: it gets the vDSO back unless hidden again.
		if err := hideVDSO(tid); err != nil {
			return err
		}
		return unix.PtraceCont(tid, 0)
	case sig == unix.SIGTRAP && ws.TrapCause() > 0:
		return unix.PtraceCont(tid, 0) // clone, fork, vfork
	default:
		return unix.PtraceCont(tid, int(sig)) // deliver the signal
	}
}

// shift adds the offset to the result of the wall-clock read tid is
// stopped in, at the call's exit. done is false at its entry (a kernel that
// reports the entry after the filter's stop).
func (t *tracer) shift(tid int) (done bool, err error) {
	var regs unix.PtraceRegs
	if err := unix.PtraceGetRegs(tid, &regs); err != nil {
		return false, err
	}
	if !t.inCall[tid] {
		return true, nil
	}
	if int64(regs.Rax) == -int64(unix.ENOSYS) {
		return false, nil
	}
	off := t.offset.Load()
	if off == 0 {
		return true, nil
	}
	switch regs.Orig_rax {
	case unix.SYS_CLOCK_GETTIME:
		if regs.Rax == 0 {
			return true, addAt(tid, uintptr(regs.Rsi), off, 1)
		}
	case unix.SYS_GETTIMEOFDAY:
		if regs.Rax == 0 && regs.Rdi != 0 {
			return true, addAt(tid, uintptr(regs.Rdi), off, 1000)
		}
	case unix.SYS_TIME:
		if int64(regs.Rax) >= 0 {
			sec := floorDiv(int64(regs.Rax)*1e9+off, 1e9)
			regs.Rax = uint64(sec)
			if regs.Rdi != 0 {
				var b [8]byte
				binary.LittleEndian.PutUint64(b[:], uint64(sec))
				if _, err := unix.PtracePokeData(tid, uintptr(regs.Rdi), b[:]); err != nil {
					return true, err
				}
			}
			return true, unix.PtraceSetRegs(tid, &regs)
		}
	}
	return true, nil
}

// addAt adds off ns to the {seconds, fraction} pair at addr in tid's
// memory, whose fraction counts units of unit ns (1 for a timespec, 1000
// for a timeval).
func addAt(tid int, addr uintptr, off, unit int64) error {
	var b [16]byte
	if _, err := unix.PtracePeekData(tid, addr, b[:]); err != nil {
		return err
	}
	ns := int64(binary.LittleEndian.Uint64(b[:8]))*1e9 + int64(binary.LittleEndian.Uint64(b[8:]))*unit + off
	binary.LittleEndian.PutUint64(b[:8], uint64(floorDiv(ns, 1e9)))
	binary.LittleEndian.PutUint64(b[8:], uint64((ns-floorDiv(ns, 1e9)*1e9)/unit))
	_, err := unix.PtracePokeData(tid, addr, b[:])
	return err
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// hideVDSO turns the AT_SYSINFO_EHDR entry of the auxiliary vector of pid,
// stopped at the start of a new program, into AT_IGNORE: the program then
// reads clocks with system calls, which the filter sees. At that point the
// stack pointer points at argc, followed by argv, NULL, envp, NULL, then
// the auxiliary vector's (type, value) pairs up to AT_NULL.
func hideVDSO(pid int) error {
	const atNull, atIgnore, atSysinfoEHDR = 0, 1, 33 // <elf.h>
	var regs unix.PtraceRegs
	if err := unix.PtraceGetRegs(pid, &regs); err != nil {
		return err
	}
	word := func(addr uintptr) (uint64, error) {
		var b [8]byte
		_, err := unix.PtracePeekData(pid, addr, b[:])
		return binary.LittleEndian.Uint64(b[:]), err
	}
	sp := uintptr(regs.Rsp)
	argc, err := word(sp)
	if err != nil {
		return err
	}
	addr := sp + 8*(uintptr(argc)+2) // envp[0]
	for {
		v, err := word(addr)
		if err != nil {
			return err
		}
		addr += 8
		if v == 0 {
			break
		}
	}
	for i := 0; i < 256; i++ { // the auxiliary vector has a few dozen entries
		typ, err := word(addr)
		if err != nil {
			return err
		}
		switch typ {
		case atNull:
			return errors.New("no vDSO entry in the child's auxiliary vector")
		case atSysinfoEHDR:
			var b [8]byte
			binary.LittleEndian.PutUint64(b[:], atIgnore)
			_, err := unix.PtracePokeData(pid, addr, b[:])
			return err
		}
		addr += 16
	}
	return errors.New("the child's auxiliary vector has no end")
}
