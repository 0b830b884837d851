package redisproc

import (
	"os/exec"
	"sync"
)

// proc is one redis-server process. Its methods are called with the
// Server's mutex held, except the watcher started by startProc.
type proc struct {
	cmd *exec.Cmd
	pid int
	// exited is closed once the process has exited. Where waitExit does
	// not reap (Linux), the process stays a zombie until reap, so its pid,
	// which is also its process group id, cannot be reused before then.
	exited chan struct{}
	// reapedByWatcher and err are set by the watcher before exited closes.
	reapedByWatcher bool
	err             error
	reapOnce        sync.Once
	reaped          bool
}

// startProc starts cmd in a process group of its own and watches for its
// exit.
func startProc(cmd *exec.Cmd) (*proc, error) {
	if err := spawn(cmd); err != nil {
		return nil, err
	}
	p := &proc{cmd: cmd, pid: cmd.Process.Pid, exited: make(chan struct{})}
	go func() {
		p.reapedByWatcher, p.err = waitExit(p)
		close(p.exited)
	}()
	return p, nil
}

func (p *proc) hasExited() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

// reap waits for the process to exit, collects it and returns how it ended.
func (p *proc) reap() error {
	<-p.exited
	p.reapOnce.Do(func() {
		if !p.reapedByWatcher {
			p.err = p.cmd.Wait()
		}
		p.reaped = true
	})
	return p.err
}

// kill stops the process and everything it forked (redis forks for BGSAVE
// and AOF rewrites) and reaps it.
func (p *proc) kill() {
	p.killGroup()
	_ = p.reap()
}
