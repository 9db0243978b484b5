package workers

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/internal/sandbox"
	"github.com/palrun/pal/workflow"
)

// Process steps: the worker runs a process node's program in a sandbox
// (package internal/sandbox; docs/architecture.md §10.10).
//
//   - The program sees a read-only system, a fresh work directory, its
//     own processes and loopback (or the worker's egress proxy with
//     network "egress"), and the operator's mounts (PAL_PROCESS_MOUNTS);
//     nothing of the worker's data, keys or environment. When the worker
//     dies, even by kill -9, the sandbox dies with it; when the program
//     exits, every process it left behind is ended.
//   - A drive that ends early (lease lost, run cancelled, worker stopping)
//     or a timeout sends every process of it SIGTERM, then SIGKILL after
//     ProcessGrace.
//   - The environment is the node's env and PAL_RUN_ID, PAL_STEP_ID,
//     PAL_ATTEMPT, PAL_IDEMPOTENCY_KEY, PAL_REPORT_SOCKET, and
//     PAL_RESUME=1 when an earlier process of this step's attempt did not
//     finish; the sandbox adds PATH, HOME, TMPDIR, LANG.
//   - stdin is the rendered input (JSON). The output is the JSON the
//     program writes to fd 3; if it writes nothing there, its last
//     non-empty line of stdout (JSON, or else taken as a JSON string); if
//     neither, null.
//   - The last StderrTail bytes of stderr go into step_completed or
//     step_failed (data.stderr).
//   - A worker without a sandbox (no usable bubblewrap) fails process
//     steps, unless PAL_PROCESS_SANDBOX=off, which runs them unconfined.

// Bounds of a process step.
const (
	// StderrTail is how much of the end of stderr is journaled.
	StderrTail = 8 << 10
	// ProcessGrace is how long a program has between SIGTERM and SIGKILL.
	ProcessGrace = 5 * time.Second
	// defaultProcessTimeout bounds a process node that sets no timeoutMs.
	defaultProcessTimeout = time.Hour
	// maxProcessOutput bounds the output read from fd 3 or a stdout line.
	maxProcessOutput = 1 << 20
)

// Settings of the process tier, named in its errors.
const (
	// EnvProcessSandbox is "off" to run process steps without a sandbox.
	EnvProcessSandbox = "PAL_PROCESS_SANDBOX"
	// EnvProcessPrograms lists the programs process steps may start.
	EnvProcessPrograms = "PAL_PROCESS_PROGRAMS"
	// EnvProcessMounts lists the host paths every sandbox sees.
	EnvProcessMounts = "PAL_PROCESS_MOUNTS"
)

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
	sb, err := d.w.processSandbox(in)
	if err != nil {
		return stepResult{}, permanent("step %s: %v", p.StepID, err)
	}
	path, err := sb.Resolve(in.Command[0])
	if errors.Is(err, sandbox.ErrNotAllowed) {
		return stepResult{}, permanent("step %s: %v: add it to %s to run it", p.StepID, err, EnvProcessPrograms)
	} else if err != nil {
		return stepResult{}, permanent("step %s: %v", p.StepID, err)
	}
	stdout := &lastLine{max: maxProcessOutput}
	stderr := &tail{max: StderrTail}
	fd3r, fd3w, err := os.Pipe()
	if err != nil {
		return stepResult{}, err
	}
	defer fd3r.Close()
	stdin := in.Stdin
	if len(stdin) == 0 {
		stdin = json.RawMessage("null")
	}
	proc, err := sb.Prepare(sandbox.Spec{Argv: append([]string{path}, in.Command[1:]...),
		Env: d.processEnv(p, in.Env), Dir: in.Workdir, Network: sandbox.Network(in.Network),
		Dial: sandbox.DialFunc(d.w.cfg.Egress.Dial((&net.Dialer{}).DialContext, nil)), Limits: sandboxLimits(in.Limits),
		Stdin: bytes.NewReader(append(stdin, '\n')), Stdout: stdout, Stderr: stderr, ExtraFiles: []*os.File{fd3w}})
	if err != nil {
		fd3w.Close()
		return stepResult{}, permanent("step %s: %v", p.StepID, err)
	}
	defer func() {
		if err := proc.Close(); err != nil {
			d.log.Warn("removing a process step's sandbox", "step_id", p.StepID, "err", err)
		}
	}()
	ln, sock, err := proc.Listen("report.sock")
	if err != nil {
		fd3w.Close()
		return stepResult{}, err
	}
	sess := serveSession(ln, p.StepID)
	defer sess.close()
	proc.SetEnv("PAL_REPORT_SOCKET", sock)
	err = proc.Start()
	fd3w.Close()
	if err != nil {
		return stepResult{}, permanent("step %s: starting %s: %v", p.StepID, in.Command[0], err)
	}
	d.log.Info("process started", "step_id", p.StepID, "pid", proc.Pid(), "resume", p.Resumes > 0)
	fd3 := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(fd3r, maxProcessOutput+1))
		fd3 <- b
	}()
	stopped := d.superviseProcess(p, proc, sess)
	var out []byte
	select {
	case out = <-fd3:
	case <-time.After(ProcessGrace):
		// Something holds fd 3 open (without a sandbox, a process the
		// program left behind): read no more.
	}
	return d.processResult(p, in.Limits, proc.Result(), stopped, out, stdout, stderr.String())
}

// processSandbox returns the worker's sandbox for a step's input, or why
// it cannot run.
func (w *Worker) processSandbox(in engine.ProcessInput) (*sandbox.Runner, error) {
	if workflow.HasPlaceholder(in.Command[0]) {
		return nil, errors.New("the program is a template")
	}
	for k := range in.Env {
		if msg := workflow.ProcessEnvProblem(k); msg != "" {
			return nil, fmt.Errorf("env.%s: %s", k, msg)
		}
	}
	return w.sandboxRunner("process steps")
}

// processEnv is the node's environment and PAL's variables.
func (d *drive) processEnv(p engine.StepPlan, declared map[string]string) []string {
	env := make([]string, 0, len(declared)+6)
	for k, v := range declared {
		env = append(env, k+"="+v)
	}
	env = append(env, "PAL_RUN_ID="+d.runID, "PAL_STEP_ID="+p.StepID, "PAL_ATTEMPT="+strconv.Itoa(p.Attempt),
		"PAL_IDEMPOTENCY_KEY="+p.Key)
	if p.Resumes > 0 {
		env = append(env, "PAL_RESUME=1")
	}
	return env
}

// sandboxLimits are a node's limits for the sandbox, defaults applied.
func sandboxLimits(l *workflow.ProcessLimits) sandbox.Limits {
	out := sandbox.Limits{Processes: l.Processes(), Disk: int64(l.Workdir()) << 20}
	if l != nil {
		out.Memory, out.CPU, out.FileSize = int64(l.MemoryMb)<<20, time.Duration(l.CPUSeconds)*time.Second, int64(l.FileSizeMb)<<20
	}
	return out
}

// superviseProcess answers the program's reports until it ends, and
// stops it when the drive ends early, the step times out or a report
// cannot be journaled. It returns why PAL stopped it ("" if it did not).
func (d *drive) superviseProcess(p engine.StepPlan, proc *sandbox.Process, sess *procSession) string {
	ctx, cancel := context.WithTimeout(d.ctx, timeoutOf(p.TimeoutMs, defaultProcessTimeout))
	defer cancel()
	for {
		select {
		case <-proc.Done():
			return ""
		case req := <-sess.reqs:
			req.answer <- d.answerReport(p, req)
			if d.reportErr != nil {
				terminate(proc)
				return "report"
			}
		case <-ctx.Done():
			terminate(proc)
			return "context"
		}
	}
}

// terminate stops every process of the program: SIGTERM, then SIGKILL
// after ProcessGrace.
func terminate(proc *sandbox.Process) {
	proc.Terminate()
	t := time.NewTimer(ProcessGrace)
	defer t.Stop()
	select {
	case <-proc.Done():
	case <-t.C:
		proc.Kill()
		<-proc.Done()
	}
}

// processResult is the step's result from how its program ended.
func (d *drive) processResult(p engine.StepPlan, l *workflow.ProcessLimits, res sandbox.Result, stopped string,
	fd3 []byte, stdout *lastLine, stderr string) (stepResult, error) {
	out := stepResult{stderr: stderr}
	fail := func(cause error, format string, args ...any) (stepResult, error) {
		return out, &processError{msg: fmt.Sprintf("step %s: ", p.StepID) + fmt.Sprintf(format, args...), stderr: stderr, cause: cause}
	}
	switch {
	case stopped == "report":
		return out, fmt.Errorf("step %s: %w: %v", p.StepID, errReport, d.reportErr)
	case stopped == "context" && d.ctx.Err() != nil:
		return out, context.Cause(d.ctx)
	case stopped == "context":
		return fail(context.DeadlineExceeded, "the process timed out after %s and was stopped", timeoutOf(p.TimeoutMs, defaultProcessTimeout))
	case res.Limit != "":
		return fail(errPermanent, "%s", limitMessage(res, l))
	case res.Err != nil:
		return fail(errPermanent, "the process failed: %v", res.Err)
	case !res.OK():
		msg := fmt.Sprintf("the process ended with exit status %d", res.ExitCode)
		if res.Signal != 0 {
			msg = "the process was killed by signal " + res.Signal.String()
		}
		if s := lastLineOf(stderr); s != "" {
			msg += ": " + s
		}
		return fail(errPermanent, "%s", msg)
	}
	output, err := processOutput(fd3, stdout)
	if err != nil {
		return fail(errPermanent, "%v", err)
	}
	out.output = output
	return out, nil
}

// limitMessage names the limit that stopped a program, with its field.
func limitMessage(res sandbox.Result, l *workflow.ProcessLimits) string {
	if l == nil {
		l = &workflow.ProcessLimits{}
	}
	switch res.Limit {
	case sandbox.LimitMemory:
		return fmt.Sprintf("the process exceeded its memory limit of %d MiB (limits.memoryMb) and was stopped", l.MemoryMb)
	case sandbox.LimitCPU:
		return fmt.Sprintf("the process exceeded its CPU limit of %d s (limits.cpuSeconds) and was stopped", l.CPUSeconds)
	case sandbox.LimitProcesses:
		return fmt.Sprintf("the process exceeded its process limit of %d (limits.maxProcesses) and was stopped", l.Processes())
	case sandbox.LimitFileSize:
		return fmt.Sprintf("the process exceeded its file size limit of %d MiB (limits.fileSizeMb)", l.FileSizeMb)
	case sandbox.LimitDisk:
		where := ""
		if res.Full != sandbox.WorkDir {
			where = " in " + res.Full
		}
		return fmt.Sprintf("the process exceeded its work directory limit of %d MiB (limits.workdirMb)%s and was stopped", l.Workdir(), where)
	}
	return "the process exceeded its " + string(res.Limit) + " limit"
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
