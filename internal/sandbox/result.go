package sandbox

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"time"
)

// How a program ended, and which limit stopped it.

// Limit names a limit that stopped a program.
type Limit string

// The limits.
const (
	LimitMemory    Limit = "memory"
	LimitCPU       Limit = "cpu"
	LimitProcesses Limit = "processes"
	LimitFileSize  Limit = "file size"
	LimitDisk      Limit = "disk"
)

// Result is how a program ended.
type Result struct {
	// ExitCode is the program's exit status, -1 when a signal ended it.
	ExitCode int
	Signal   syscall.Signal
	// Limit is the limit that stopped it, "" if none did.
	Limit Limit
	// Full is the tmpfs that filled up, with LimitDisk.
	Full string
	// Err is set when the program did not start.
	Err error
}

// OK reports whether the program exited with status 0.
func (r Result) OK() bool { return r.Err == nil && r.ExitCode == 0 && r.Signal == 0 }

// watchForks stops the program the first time the process limit refuses
// a fork: a program at its limit (a fork bomb) would spin until its
// timeout.
func (p *Process) watchForks() {
	if p.cg == nil || p.cg.pids == "" || p.spec.Limits.Processes <= 0 {
		return
	}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-p.done:
			return
		case <-t.C:
			if p.cg.forksRefused() > 0 {
				p.mu.Lock()
				p.stoppedBy = LimitProcesses
				p.mu.Unlock()
				p.Kill()
				return
			}
		}
	}
}

// wait waits for the program and makes its Result.
func (p *Process) wait(st <-chan initStatus) {
	defer close(p.done)
	werr := p.cmd.Wait()
	ps := p.cmd.ProcessState
	res := Result{}
	var cpu time.Duration
	var full string
	if ps != nil {
		ws := ps.Sys().(syscall.WaitStatus)
		res.ExitCode = ws.ExitStatus()
		if ws.Signaled() {
			res.ExitCode, res.Signal = -1, ws.Signal()
		}
		cpu = ps.UserTime() + ps.SystemTime()
	} else {
		res.Err = werr
	}
	if st != nil {
		s := <-st
		switch {
		case s.Err == errStatus.Error():
			// No report: bwrap failed before the init ran (its message is
			// on stderr), or the sandbox was killed.
			if res.Signal == 0 && p.stopped() == "" {
				res.Err = fmt.Errorf("the sandbox did not start: %s", lastLine(p.tail.String()))
			}
		case s.Err != "":
			res.Err = errors.New(s.Err)
		default:
			res.ExitCode, res.Signal, cpu, full = s.Code, syscall.Signal(s.Signal), time.Duration(s.CPUMs)*time.Millisecond, s.Full
		}
	}
	if !res.OK() {
		res.Limit, res.Full = p.limitHit(res, cpu, full)
	}
	p.res = res
}

// limitHit names the limit that ended a program that failed, if any.
func (p *Process) limitHit(res Result, cpu time.Duration, full string) (Limit, string) {
	l := p.spec.Limits
	stopped := p.stopped()
	sig, code := res.Signal, res.ExitCode
	// A shell reports a child a signal ended as 128+n.
	signaled := func(s syscall.Signal) bool { return sig == s || code == 128+int(s) }
	memCgroup := p.cg != nil && p.cg.memory != ""
	stderr := p.tail.String()
	switch {
	case stopped != "":
		return stopped, ""
	case memCgroup && p.cg.oomKills() > 0:
		return LimitMemory, ""
	case full != "":
		return LimitDisk, full
	case l.FileSize > 0 && (signaled(syscall.SIGXFSZ) || strings.Contains(stderr, "File too large")):
		return LimitFileSize, ""
	case l.CPU > 0 && (signaled(syscall.SIGXCPU) || sig == syscall.SIGKILL && cpu >= l.CPU):
		return LimitCPU, ""
	case l.Memory > 0 && !memCgroup && (outOfMemory(stderr) || sig == syscall.SIGSEGV || sig == syscall.SIGABRT ||
		sig == syscall.SIGBUS || sig == syscall.SIGKILL):
		return LimitMemory, ""
	case p.cg != nil && p.cg.forksRefused() > 0:
		return LimitProcesses, ""
	}
	return "", ""
}

func (p *Process) stopped() Limit {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stoppedBy
}

// outOfMemory reports whether stderr shows a failed allocation (the
// RLIMIT_AS fallback has no other sign).
func outOfMemory(stderr string) bool {
	for _, s := range []string{"MemoryError", "Cannot allocate memory", "cannot allocate memory", "out of memory",
		"std::bad_alloc"} {
		if strings.Contains(stderr, s) {
			return true
		}
	}
	return false
}

// tail keeps the last 4 KiB written to it.
type tail struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, b...)
	if len(t.buf) > 4<<10 {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-4<<10:]...)
	}
	return len(b), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
