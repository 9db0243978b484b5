package testenv

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// hermeticPrefixes are the parent environment variables a child process does
// not inherit: a developer's PAL settings, database and provider keys must
// never leak into a test.
var hermeticPrefixes = []string{"PAL_", "DATABASE_URL", "OPENAI_", "ANTHROPIC_"}

// Process is a child process started by StartProcess. Its stdout and stderr
// are captured together; the test's cleanup kills it if it still runs and,
// when the test failed, logs what it wrote.
type Process struct {
	name string
	cmd  *exec.Cmd
	out  *outputBuffer

	exited  chan struct{}
	waitErr error // set before exited is closed
}

// StartProcess starts bin with args. The child's environment is the test
// binary's minus every PAL_*, DATABASE_URL, OPENAI_* and ANTHROPIC_*
// variable, plus env ("KEY=value" entries, which win). The test fails at once
// if the process cannot be started.
func StartProcess(tb testing.TB, bin string, args []string, env []string) *Process {
	tb.Helper()
	p, err := startProcess(bin, args, env)
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	tb.Cleanup(func() {
		p.Kill()
		if tb.Failed() {
			tb.Logf("testenv: output of %s (pid %d, %s):\n%s", p.name, p.PID(), p.exitState(), p.Output())
		}
	})
	return p
}

// startProcess starts a process without tying it to a test.
func startProcess(bin string, args, env []string) (*Process, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = append(hermeticEnv(os.Environ()), env...)
	out := newOutputBuffer()
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.SysProcAttr = childAttr()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	p := &Process{
		name:   filepath.Base(bin),
		cmd:    cmd,
		out:    out,
		exited: make(chan struct{}),
	}
	go func() {
		// Wait returns only after the output has been copied, so Output is
		// complete once Exited is closed.
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

func hermeticEnv(environ []string) []string {
	env := make([]string, 0, len(environ))
next:
	for _, kv := range environ {
		for _, prefix := range hermeticPrefixes {
			if strings.HasPrefix(kv, prefix) {
				continue next
			}
		}
		env = append(env, kv)
	}
	return env
}

// PID returns the process id.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// Output returns everything the process wrote to stdout and stderr so far.
func (p *Process) Output() string { return p.out.String() }

// Exited is closed once the process has exited and been reaped.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// Wait waits for the process to exit and returns its exit error (nil for
// status 0, an *exec.ExitError otherwise), or ctx's error if ctx ends first.
func (p *Process) Wait(ctx context.Context) error {
	select {
	case <-p.exited:
		return p.waitErr
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Kill sends SIGKILL and waits until the process has been reaped. Killing a
// process that already exited does nothing.
func (p *Process) Kill() {
	select {
	case <-p.exited:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.exited
}

// Stop freezes the process with SIGSTOP, as a machine that hangs would.
func (p *Process) Stop() error { return p.signal(syscall.SIGSTOP) }

// Cont resumes a process frozen by Stop (SIGCONT).
func (p *Process) Cont() error { return p.signal(syscall.SIGCONT) }

// Term asks the process to shut down (SIGTERM) without waiting; use Wait or
// Exited to await the exit.
func (p *Process) Term() error { return p.signal(syscall.SIGTERM) }

func (p *Process) signal(sig syscall.Signal) error {
	select {
	case <-p.exited:
		return fmt.Errorf("signalling %s (pid %d) with %v: %w", p.name, p.PID(), sig, os.ErrProcessDone)
	default:
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		return fmt.Errorf("signalling %s (pid %d) with %v: %w", p.name, p.PID(), sig, err)
	}
	return nil
}

// WaitForOutput waits until the process's output contains substring. It
// returns an error if the process exits first or ctx ends first; the error
// quotes the tail of the output.
func (p *Process) WaitForOutput(ctx context.Context, substring string) error {
	for {
		found, changed := p.out.contains(substring)
		if found {
			return nil
		}
		select {
		case <-changed:
		case <-p.exited:
			if found, _ := p.out.contains(substring); found {
				return nil
			}
			return fmt.Errorf("%s (pid %d) %s before printing %q; output ends with:\n%s",
				p.name, p.PID(), p.exitState(), substring, tail(p.Output(), 2000))
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s (pid %d) to print %q: %w; output ends with:\n%s",
				p.name, p.PID(), substring, ctx.Err(), tail(p.Output(), 2000))
		}
	}
}

func (p *Process) exitState() string {
	select {
	case <-p.exited:
		if p.waitErr == nil {
			return "exited with status 0"
		}
		return "exited: " + p.waitErr.Error()
	default:
		return "running"
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}

// waitExit waits up to d for the process to exit and reports whether it did.
func (p *Process) waitExit(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.exited:
		return true
	case <-t.C:
		return false
	}
}

// outputBuffer collects a process's output and lets readers await growth:
// changed is closed and replaced on every write.
type outputBuffer struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	changed chan struct{}
}

func newOutputBuffer() *outputBuffer {
	return &outputBuffer{changed: make(chan struct{})}
}

func (b *outputBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	n, err := b.buf.Write(p)
	close(b.changed)
	b.changed = make(chan struct{})
	return n, err
}

func (b *outputBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// contains reports whether the output holds s, and returns a channel closed
// on the next write.
func (b *outputBuffer) contains(s string) (bool, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return bytes.Contains(b.buf.Bytes(), []byte(s)), b.changed
}
