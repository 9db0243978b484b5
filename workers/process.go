package workers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/workflow"
)

// Process steps: the worker runs a process node's command as a child.
//
//   - The child is in its own process group (Setpgid) with the parent-death
//     signal SIGKILL (Pdeathsig): when the worker dies, even by kill -9, the
//     kernel kills the child. When the drive is interrupted (lease lost, run
//     cancelled, worker stopping) or the step times out, the whole group
//     gets SIGTERM, then SIGKILL after ProcessGrace. When the child exits,
//     whatever is left of its group is killed.
//   - Limits are rlimits set by /bin/sh in the child just before it execs
//     the command (ulimit -v for RLIMIT_AS, ulimit -t for RLIMIT_CPU): Go's
//     os/exec has no hook to set rlimits between fork and exec, and setting
//     them on the worker would limit the worker.
//   - The environment is clean: PATH, HOME, LANG and TZ from the worker, the
//     node's env, and PAL_RUN_ID, PAL_STEP_ID, PAL_ATTEMPT,
//     PAL_IDEMPOTENCY_KEY, PAL_REPORT_URL, PAL_REPORT_TOKEN, and PAL_RESUME=1
//     when an earlier process of this step's attempt did not finish.
//   - stdin is the rendered input (JSON). The output is the JSON the child
//     writes to fd 3; if it writes nothing there, its last non-empty line of
//     stdout (JSON, or else taken as a JSON string); if neither, null.
//   - The last StderrTail bytes of stderr go into step_completed or
//     step_failed (data.stderr).

// Bounds of a process step.
const (
	// StderrTail is how much of the end of stderr is journaled.
	StderrTail = 8 << 10
	// ProcessGrace is how long a child has between SIGTERM and SIGKILL.
	ProcessGrace = 5 * time.Second
	// defaultProcessTimeout bounds a process node that sets no timeoutMs.
	defaultProcessTimeout = time.Hour
	// maxProcessOutput bounds the output read from fd 3 or a stdout line.
	maxProcessOutput = 1 << 20
)

// envAllowlist is what a child inherits from the worker's environment.
var envAllowlist = []string{"PATH", "HOME", "LANG", "TZ"}

// processError is a process step that failed: its message, and the
// stderr tail to journal with it.
type processError struct {
	msg    string
	stderr string
	cause  error
}

func (e *processError) Error() string { return e.msg }
func (e *processError) Unwrap() error { return e.cause }

func (d *drive) execProcess(p engine.StepPlan) (stepResult, error) {
	var in engine.ProcessInput
	if err := json.Unmarshal(p.Input, &in); err != nil || len(in.Command) == 0 {
		return stepResult{}, permanent("step %s: bad input: %v", p.StepID, err)
	}
	rt, err := d.w.runtime()
	if err != nil {
		return stepResult{}, err
	}
	sess := rt.open(d.runID, p.StepID, p.Attempt)
	defer rt.close(sess)

	cmd := processCommand(in)
	cmd.Dir = in.Workdir
	cmd.Env = processEnv(in.Env, map[string]string{
		"PAL_RUN_ID": d.runID, "PAL_STEP_ID": p.StepID, "PAL_ATTEMPT": strconv.Itoa(p.Attempt),
		"PAL_IDEMPOTENCY_KEY": p.Key, "PAL_REPORT_URL": rt.base + ReportPath, "PAL_REPORT_TOKEN": sess.token,
	}, p.Resumes > 0)
	stdin := in.Stdin
	if len(stdin) == 0 {
		stdin = json.RawMessage("null")
	}
	cmd.Stdin = bytes.NewReader(append(stdin, '\n'))
	stdout := &lastLine{max: maxProcessOutput}
	stderr := &tail{max: StderrTail}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	// A grandchild that keeps stdout or stderr open must not hold the
	// step forever once the child has exited.
	cmd.WaitDelay = ProcessGrace
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	fd3r, fd3w, err := os.Pipe()
	if err != nil {
		return stepResult{}, err
	}
	defer fd3r.Close()
	cmd.ExtraFiles = []*os.File{fd3w}

	ctx, cancel := context.WithTimeout(d.ctx, timeoutOf(p.TimeoutMs, defaultProcessTimeout))
	defer cancel()
	if err := cmd.Start(); err != nil {
		fd3w.Close()
		return stepResult{}, permanent("step %s: starting %s: %v", p.StepID, in.Command[0], err)
	}
	fd3w.Close()
	pid := cmd.Process.Pid
	d.log.Info("process started", "step_id", p.StepID, "pid", pid, "resume", p.Resumes > 0)
	fd3 := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(fd3r, maxProcessOutput+1))
		fd3 <- b
	}()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()

	var waitErr error
	stopped := "" // why PAL stopped the process, if it did
loop:
	for {
		select {
		case waitErr = <-exited:
			break loop
		case req := <-sess.reqs:
			req.answer <- d.answerReport(p, req)
			if d.reportErr != nil {
				stopped = "report"
				waitErr = terminate(pid, exited)
				break loop
			}
		case <-ctx.Done():
			stopped = "context"
			waitErr = terminate(pid, exited)
			break loop
		}
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL) // what is left of its group
	var out []byte
	select {
	case out = <-fd3:
	case <-time.After(ProcessGrace):
		// A grandchild holds fd 3 open: read no more.
	}
	res := stepResult{stderr: stderr.String()}
	switch {
	case stopped == "report":
		return res, fmt.Errorf("step %s: %w: %v", p.StepID, errReport, d.reportErr)
	case stopped == "context" && d.ctx.Err() != nil:
		return res, context.Cause(d.ctx)
	case stopped == "context":
		return res, &processError{msg: fmt.Sprintf("step %s: the process timed out after %s and was stopped",
			p.StepID, timeoutOf(p.TimeoutMs, defaultProcessTimeout)), stderr: res.stderr, cause: context.DeadlineExceeded}
	case waitErr != nil:
		return res, &processError{msg: fmt.Sprintf("step %s: %s", p.StepID, exitReason(waitErr, in.Limits, res.stderr)),
			stderr: res.stderr, cause: errPermanent}
	}
	output, err := processOutput(out, stdout)
	if err != nil {
		return res, &processError{msg: fmt.Sprintf("step %s: %v", p.StepID, err), stderr: res.stderr, cause: errPermanent}
	}
	res.output = output
	return res, nil
}

// processCommand builds the child's command: the argv as it is, or under
// /bin/sh setting the rlimits before it execs the argv.
func processCommand(in engine.ProcessInput) *exec.Cmd {
	l := in.Limits
	if l == nil || (l.MemoryMb <= 0 && l.CPUSeconds <= 0) {
		return exec.Command(in.Command[0], in.Command[1:]...)
	}
	var script strings.Builder
	if l.MemoryMb > 0 {
		fmt.Fprintf(&script, "ulimit -v %d || exit 125; ", l.MemoryMb*1024)
	}
	if l.CPUSeconds > 0 {
		fmt.Fprintf(&script, "ulimit -t %d || exit 125; ", l.CPUSeconds)
	}
	script.WriteString(`exec "$@"`)
	return exec.Command("/bin/sh", append([]string{"-c", script.String(), "pal-process"}, in.Command...)...)
}

// processEnv is the child's clean environment.
func processEnv(declared, pal map[string]string, resumed bool) []string {
	var env []string
	for _, k := range envAllowlist {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	for k, v := range declared {
		if !strings.HasPrefix(k, "PAL_") {
			env = append(env, k+"="+v)
		}
	}
	for k, v := range pal {
		env = append(env, k+"="+v)
	}
	if resumed {
		env = append(env, "PAL_RESUME=1")
	}
	return env
}

// terminate stops the process group: SIGTERM, then SIGKILL after
// ProcessGrace. It returns the child's wait error.
func terminate(pid int, exited <-chan error) error {
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	t := time.NewTimer(ProcessGrace)
	defer t.Stop()
	select {
	case err := <-exited:
		return err
	case <-t.C:
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		return <-exited
	}
}

// exitReason says why a child failed, naming a limit it likely hit.
func exitReason(err error, l *workflow.ProcessLimits, stderr string) string {
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return fmt.Sprintf("the process failed: %v", err)
	}
	ws, _ := ee.Sys().(syscall.WaitStatus)
	what := fmt.Sprintf("exit status %d", ws.ExitStatus())
	if ws.Signaled() {
		what = "killed by signal " + ws.Signal().String()
	}
	if l != nil && l.CPUSeconds > 0 && ws.Signaled() && (ws.Signal() == syscall.SIGXCPU || ws.Signal() == syscall.SIGKILL) {
		return fmt.Sprintf("the process exceeded its CPU limit of %d s (limits.cpuSeconds) and was killed (%s)", l.CPUSeconds, what)
	}
	if l != nil && l.MemoryMb > 0 && (outOfMemory(stderr) || ws.Signaled() && (ws.Signal() == syscall.SIGSEGV ||
		ws.Signal() == syscall.SIGABRT || ws.Signal() == syscall.SIGKILL || ws.Signal() == syscall.SIGBUS)) {
		return fmt.Sprintf("the process exceeded its memory limit of %d MiB (limits.memoryMb) and was ended (%s)", l.MemoryMb, what)
	}
	if ws.ExitStatus() == 125 && l != nil {
		return "the process's limits could not be set (ulimit failed): " + lastLineOf(stderr)
	}
	msg := "the process ended with " + what
	if s := lastLineOf(stderr); s != "" {
		msg += ": " + s
	}
	return msg
}

// outOfMemory reports whether stderr shows a failed allocation.
func outOfMemory(stderr string) bool {
	for _, s := range []string{"MemoryError", "Cannot allocate memory", "out of memory", "std::bad_alloc",
		"cannot allocate memory", "fatal error: runtime: out of memory"} {
		if strings.Contains(stderr, s) {
			return true
		}
	}
	return false
}

func lastLineOf(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

// processOutput is the step's output: fd 3, else the last stdout line.
func processOutput(fd3 []byte, stdout *lastLine) (json.RawMessage, error) {
	if len(fd3) > maxProcessOutput {
		return nil, fmt.Errorf("the process wrote more than %d bytes to fd 3", maxProcessOutput)
	}
	if b := bytes.TrimSpace(fd3); len(b) > 0 {
		if !json.Valid(b) {
			return nil, errors.New("the process wrote to fd 3 what is not JSON")
		}
		return b, nil
	}
	line, tooLong := stdout.last()
	if tooLong {
		return nil, fmt.Errorf("the last line of the process's stdout is over %d bytes", maxProcessOutput)
	}
	if len(line) == 0 {
		return json.RawMessage("null"), nil
	}
	if json.Valid(line) {
		return line, nil
	}
	return json.Marshal(string(line))
}

// lastLine keeps the last non-empty line written to it, bounded.
type lastLine struct {
	max      int
	mu       sync.Mutex
	cur      []byte
	curLong  bool
	done     []byte
	doneLong bool
}

func (l *lastLine) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := len(p)
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		chunk := p
		if i >= 0 {
			chunk = p[:i]
		}
		if len(l.cur)+len(chunk) > l.max {
			l.curLong = true
		} else if !l.curLong {
			l.cur = append(l.cur, chunk...)
		}
		if i < 0 {
			break
		}
		l.endLine()
		p = p[i+1:]
	}
	return n, nil
}

func (l *lastLine) endLine() {
	if len(bytes.TrimSpace(l.cur)) > 0 || l.curLong {
		l.done, l.doneLong = append(l.done[:0], l.cur...), l.curLong
	}
	l.cur, l.curLong = l.cur[:0], false
}

func (l *lastLine) last() ([]byte, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.endLine()
	return bytes.TrimSpace(l.done), l.doneLong
}

// tail keeps the last max bytes written to it.
type tail struct {
	max int
	mu  sync.Mutex
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = append(t.buf[:0], t.buf[len(t.buf)-t.max:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.ToValidUTF8(string(t.buf), "")
}
