package workers_test

// Process steps with real processes in real bubblewrap sandboxes: Python
// and Go programs using the SDK helpers, run by real `pal worker`
// processes that are killed with kill -9 mid sub-step.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/internal/sandbox"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/workers"
	"github.com/palrun/pal/workflow"
)

// repoRoot is the module's root (the tests run in workers/).
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	require.NoError(t, err)
	return root
}

// python is Debian's interpreter, which the sandbox sees under /usr.
const python = "/usr/bin/python3"

// sharedDir is a directory a sandbox may write when it is mounted
// (PAL_PROCESS_MOUNTS dir:rw): one that its uid can reach and write.
func sharedDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "pal-test-")
	require.NoError(t, err)
	require.NoError(t, os.Chmod(dir, 0o777))
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

// repoMount is the mount through which the sandbox sees the repository
// at /opt/pal, as examples/process expects.
func repoMount(t *testing.T) string { return repoRoot(t) + "=/opt/pal" }

// runner is a sandbox for in-process workers with the given mounts
// (PAL_PROCESS_MOUNTS form).
func runner(t *testing.T, mounts string, programs ...string) *sandbox.Runner {
	t.Helper()
	ms, err := sandbox.ParseMounts(mounts)
	require.NoError(t, err)
	r, err := sandbox.New(sandbox.Config{Mounts: ms, Programs: programs})
	require.NoError(t, err)
	require.NoError(t, r.Available())
	return r
}

// substepsProgram is the command of examples/process's program in one
// language: the Python script, which the sandbox sees at /opt/pal, or the
// Go program built for the test.
func substepsProgram(t *testing.T, lang string) ([]string, map[string]string) {
	t.Helper()
	if lang == "python" {
		return []string{python, "/opt/pal/examples/process/substeps.py"}, map[string]string{"PYTHONPATH": "/opt/pal/sdk/python"}
	}
	bin := filepath.Join(t.TempDir(), "substeps")
	build := exec.Command("go", "build", "-o", bin, "./examples/process/substeps")
	build.Dir = repoRoot(t)
	out, err := build.CombinedOutput()
	require.NoError(t, err, "building examples/process/substeps:\n%s", out)
	return []string{bin}, map[string]string{}
}

// processWorkflow is a workflow of one process node "work".
func processWorkflow(t *testing.T, command []string, env map[string]string, extra string) string {
	t.Helper()
	c, err := json.Marshal(command)
	require.NoError(t, err)
	e, err := json.Marshal(env)
	require.NoError(t, err)
	return fmt.Sprintf(`{"name":"process","nodes":[{"id":"start","type":"trigger"},
	{"id":"work","type":"process","data":{"command":%s,"env":%s,"input":{"topic":"{{input.topic}}"}%s}}],
	"edges":[{"from":"start","to":"work"}]}`, c, e, extra)
}

// waitHold waits until the hold file names n processes (their pids in
// the sandbox).
func waitHold(t *testing.T, path string, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(path)
		return len(strings.Fields(string(b))) >= n
	}, 60*time.Second, 20*time.Millisecond, "no process held at %s", path)
}

// newMark returns an environment entry (NAME=value) unique to one test:
// every process of its sandboxes carries it.
func newMark(t *testing.T) (string, string) {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "TEST_MARK", hex.EncodeToString(b)
}

// alive returns the host pids of the running processes whose environment
// holds the mark and whose command line starts with cmd ("" for any).
func alive(mark, cmd string) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
		if err != nil || !strings.Contains(string(env), mark) {
			continue
		}
		line, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || !strings.HasPrefix(strings.ReplaceAll(string(line), "\x00", " "), cmd) {
			continue
		}
		// The state follows the command name in parentheses; a zombie
		// does not run.
		if s := string(stat); strings.LastIndexByte(s, ')') > 0 {
			if i := strings.LastIndexByte(s, ')'); i+2 < len(s) && s[i+2] != 'Z' {
				out = append(out, pid)
			}
		}
	}
	return out
}

// requireNoneAlive waits until no process with the mark runs.
func requireNoneAlive(t *testing.T, mark string) {
	t.Helper()
	require.Eventually(t, func() bool { return len(alive(mark, "")) == 0 }, 10*time.Second, 10*time.Millisecond,
		"a process of the step outlived it: %v", alive(mark, ""))
}

// sideEffects reads the side-effect file: one [name, key, resume] per line.
func sideEffects(t *testing.T, path string) [][]string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	var out [][]string
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		out = append(out, strings.Fields(l))
	}
	return out
}

func TestProcessSubstepsSurviveKill9(t *testing.T) {
	for _, lang := range []string{"python", "go"} {
		t.Run(lang, func(t *testing.T) {
			t.Parallel()
			p := setupProc(t, time.Second)
			command, env := substepsProgram(t, lang)
			dir := sharedDir(t)
			side, hold := filepath.Join(dir, "side-effects"), filepath.Join(dir, "hold")
			mk, mv := newMark(t)
			env["SIDE_EFFECTS"], env["HOLD_AT"], env["HOLD_FILE"], env[mk] = side, "s3", hold, mv
			mounts := "PAL_PROCESS_MOUNTS=" + repoMount(t) + "," + dir + ":rw"

			w1 := p.palWorker(t, "w1", mounts)
			runID := p.startWithID(t, processWorkflow(t, command, env, `,"maxResumes":3`), `{"topic":"crash"}`)
			waitHold(t, hold, 1)
			require.NotEmpty(t, alive(mv, ""))
			w1.Kill() // during sub-step 3, after its side effect
			requireNoneAlive(t, mv)

			p.palWorker(t, "w2", mounts)
			end := p.WaitEnd(t, runID)
			require.Equal(t, event.RunSucceeded, end.Kind, "%s", end.Data)

			k := key(runID, "work", 1)
			require.Equal(t, [][]string{
				{"s1", k + "/s1", "resume=0"},
				{"s2", k + "/s2", "resume=0"},
				{"s3", k + "/s3", "resume=0"},
				{"s3", k + "/s3", "resume=1"}, // run again, with the same key
				{"s4", k + "/s4", "resume=1"},
				{"s5", k + "/s5", "resume=1"},
			}, sideEffects(t, side))

			var out struct {
				Resumed bool   `json:"resumed"`
				Topic   string `json:"topic"`
				Results []struct {
					Name, Key string
				} `json:"results"`
			}
			require.NoError(t, json.Unmarshal(data[event.RunSucceededData](t, end).Output, &out))
			require.True(t, out.Resumed)
			require.Equal(t, "crash", out.Topic)
			require.Len(t, out.Results, 5)
			require.Equal(t, k+"/s1", out.Results[0].Key) // the journaled output, returned by the helper

			evs := p.Events(t, runID)
			require.Len(t, find(evs, event.SubstepCompleted, "work"), 5)
			for i := 1; i <= 5; i++ {
				n := 0
				for _, ev := range find(evs, event.SubstepCompleted, "work") {
					if data[event.SubstepCompletedData](t, ev).Name == fmt.Sprintf("s%d", i) {
						n++
					}
				}
				require.Equal(t, 1, n, "s%d journaled once", i)
			}
			require.Len(t, find(evs, event.StepCompleted, "work"), 1)

			// The read model shows the sub-steps under the step.
			view, err := p.Runs.Get(context.Background(), runID)
			require.NoError(t, err)
			require.Len(t, view.Steps, 1)
			require.Len(t, view.Steps[0].Substeps, 5)
			for i, s := range view.Steps[0].Substeps {
				require.Equal(t, fmt.Sprintf("s%d", i+1), s.Name)
				require.Equal(t, engine.StepCompleted, s.Status)
			}
		})
	}
}

func TestProcessResumeExhaustedAfterFourCrashes(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	command, env := substepsProgram(t, "python")
	dir := sharedDir(t)
	side, hold := filepath.Join(dir, "side-effects"), filepath.Join(dir, "hold")
	mk, mv := newMark(t)
	env["SIDE_EFFECTS"], env["HOLD_AT"], env["HOLD_FILE"], env["HOLD_ALWAYS"], env[mk] = side, "s2", hold, "1", mv
	mounts := "PAL_PROCESS_MOUNTS=" + repoMount(t) + "," + dir + ":rw"

	runID := p.startWithID(t, processWorkflow(t, command, env, ""), `{"topic":"loop"}`) // maxResumes: the default 3
	for i := 1; i <= 4; i++ {
		w := p.palWorker(t, fmt.Sprintf("w%d", i), mounts)
		waitHold(t, hold, i)
		w.Kill()
		requireNoneAlive(t, mv)
	}
	p.palWorker(t, "w5", mounts)
	end := p.WaitEnd(t, runID)
	require.Equal(t, event.RunFailed, end.Kind)
	f := data[event.RunFailedData](t, end)
	require.Equal(t, event.CodeProcessResumeExhausted, f.Code, f.Error)
	require.Equal(t, 4, f.Attempts)
	require.Equal(t, "work", f.StepID)

	lines := sideEffects(t, side)
	require.Len(t, lines, 5) // s1 once, then s2 in each of the four processes
	require.Equal(t, "s1", lines[0][0])
	for _, l := range lines[1:] {
		require.Equal(t, []string{"s2", key(runID, "work", 1) + "/s2"}, l[:2])
	}
}

// TestProcessReportSocketIsTheStepsOwn: a step reports over the socket
// PAL_REPORT_SOCKET names, which only its process sees; a report that
// names another step, or passes the bounds, is refused; there is no token
// in the environment.
func TestProcessReportSocketIsTheStepsOwn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", nil)
	post := `
import http.client, json, os, socket
class Unix(http.client.HTTPConnection):
    def connect(self):
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(os.environ["PAL_REPORT_SOCKET"])
def post(step, name, status="completed", output=1):
    c = Unix("pal")
    c.request("POST", "/v1/runtime/report", body=json.dumps({"step_id": step, "name": name, "status": status, "output": output}))
    return c.getresponse().status
`
	a := post + `
assert post("a", "mine") == 200
print(json.dumps({"socket": os.environ["PAL_REPORT_SOCKET"]}))`
	bScript := post + `
print(json.dumps({"claim": post("a", "forged"),
                  "big": post("b", "big", output="x" * (300 << 10)),
                  "status": post("b", "odd", status="finished"),
                  "name": post("b", "n" * 129),
                  "own": post("b", "mine"),
                  "sockets": sorted(os.listdir(os.path.dirname(os.environ["PAL_REPORT_SOCKET"]))),
                  "token": [k for k in os.environ if "TOKEN" in k or k == "PAL_REPORT_URL"]}))`
	cmdA, err := json.Marshal([]string{python, "-c", a})
	require.NoError(t, err)
	cmdB, err := json.Marshal([]string{python, "-c", bScript})
	require.NoError(t, err)
	wf := fmt.Sprintf(`{"name":"sockets","nodes":[{"id":"start","type":"trigger"},
	{"id":"a","type":"process","data":{"command":%s}},
	{"id":"b","type":"process","data":{"command":%s,"env":{"A_SOCKET":"{{steps.a.output.socket}}"}}}],
	"edges":[{"from":"start","to":"a"},{"from":"a","to":"b"}]}`, cmdA, cmdB)
	runID := b.Start(t, wf, `{}`)
	end := b.WaitEnd(t, runID)
	require.Equal(t, event.RunSucceeded, end.Kind, "%s", end.Data)
	var got struct {
		Claim, Big, Status, Name, Own int
		Sockets, Token                []string
	}
	require.NoError(t, json.Unmarshal(data[event.RunSucceededData](t, end).Output, &got))
	require.Equal(t, 403, got.Claim)
	require.Equal(t, 413, got.Big)
	require.Equal(t, 400, got.Status)
	require.Equal(t, 400, got.Name)
	require.Equal(t, 200, got.Own)
	require.Equal(t, []string{"report.sock"}, got.Sockets)
	require.Empty(t, got.Token)

	evs := b.Events(t, runID)
	var names []string
	for _, ev := range find(evs, event.SubstepCompleted, "") {
		names = append(names, ev.StepID+":"+data[event.SubstepCompletedData](t, ev).Name)
	}
	require.Equal(t, []string{"a:mine", "b:mine"}, names)
}

func TestProcessMemoryLimitFailsTheStep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", nil)
	cmd, err := json.Marshal([]string{python, "-c", "b = b'x' * (512 * 1024 * 1024)\nprint('allocated')"})
	require.NoError(t, err)
	wf := fmt.Sprintf(`{"name":"hog","nodes":[{"id":"start","type":"trigger"},
	{"id":"hog","type":"process","data":{"command":%s,"limits":{"memoryMb":64}}}],
	"edges":[{"from":"start","to":"hog"}]}`, cmd)
	runID := b.Start(t, wf, `{}`)
	end := b.WaitEnd(t, runID)
	require.Equal(t, event.RunFailed, end.Kind)
	failed := find(b.Events(t, runID), event.StepFailed, "hog")
	require.Len(t, failed, 1)
	d := data[event.StepFailedData](t, failed[0])
	require.Contains(t, d.Error, "the process exceeded its memory limit of 64 MiB (limits.memoryMb)")
	require.NotContains(t, d.Error, "allocated")
	require.Equal(t, event.ClassTool, d.Class)
}

// TestProcessOutputAndStderr: the last stdout line is the output when fd 3
// is empty; stdin carries the rendered input; the stderr tail is journaled
// and bounded; the environment is the node's and PAL's.
func TestProcessOutputAndStderr(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", nil)
	script := `
import json, os, sys
params = json.load(sys.stdin)
sys.stderr.write("x" * 20000 + "\nthe end\n")
print("not the output")
print(json.dumps({"topic": params["topic"], "mine": os.environ.get("MINE"),
    "step": os.environ["PAL_STEP_ID"], "attempt": os.environ["PAL_ATTEMPT"],
    "pal": sorted(k for k in os.environ if k.startswith("PAL_")),
    "other": sorted(k for k in os.environ if not k.startswith("PAL_"))}))`
	cmd, err := json.Marshal([]string{"python3", "-c", script})
	require.NoError(t, err)
	wf := fmt.Sprintf(`{"name":"out","nodes":[{"id":"start","type":"trigger"},
	{"id":"work","type":"process","data":{"command":%s,"env":{"MINE":"{{input.topic}}!"},"input":{"topic":"{{input.topic}}"}}}],
	"edges":[{"from":"start","to":"work"}]}`, cmd)
	runID := b.Start(t, wf, `{"topic":"t1"}`)
	end := b.WaitEnd(t, runID)
	require.Equal(t, event.RunSucceeded, end.Kind, "%s", end.Data)
	var out struct {
		Topic, Mine, Step, Attempt string
		Pal, Other                 []string
	}
	require.NoError(t, json.Unmarshal(data[event.RunSucceededData](t, end).Output, &out))
	require.Equal(t, "t1", out.Topic)
	require.Equal(t, "t1!", out.Mine)
	require.Equal(t, "work", out.Step)
	require.Equal(t, "1", out.Attempt)
	// No PAL_RESUME: nothing before this process; nothing of the worker's
	// environment (Python may add LC_CTYPE itself).
	require.Equal(t, []string{"PAL_ATTEMPT", "PAL_IDEMPOTENCY_KEY", "PAL_REPORT_SOCKET", "PAL_RUN_ID", "PAL_STEP_ID"}, out.Pal)
	for _, k := range out.Other {
		require.Contains(t, []string{"PATH", "HOME", "LANG", "TMPDIR", "PWD", "MINE", "LC_CTYPE"}, k)
	}
	require.Contains(t, out.Other, "MINE")
	done := find(b.Events(t, runID), event.StepCompleted, "work")
	require.Len(t, done, 1)
	d := data[event.StepCompletedData](t, done[0])
	require.Len(t, d.Stderr, 8<<10)
	require.True(t, strings.HasSuffix(d.Stderr, "xxx\nthe end\n"))
}

// TestProcessExampleWorkflows: examples/process's workflows parse, and the
// Python one runs as the example says (the repository mounted at
// /opt/pal).
func TestProcessExampleWorkflows(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	for _, f := range []string{"substeps-python.json", "substeps-go.json"} {
		b, err := os.ReadFile(filepath.Join(root, "examples", "process", f))
		require.NoError(t, err)
		_, err = workflow.Parse(b)
		require.NoError(t, err, f)
	}
	dir := sharedDir(t)
	b := setup(t)
	b.Worker(t, "w1", paltest.Sandbox(runner(t, repoMount(t)+","+dir+":rw")))
	raw, err := os.ReadFile(filepath.Join(root, "examples", "process", "substeps-python.json"))
	require.NoError(t, err)
	side := filepath.Join(dir, "side-effects")
	in, err := json.Marshal(map[string]string{"topic": "demo", "sideEffects": side})
	require.NoError(t, err)
	runID := b.Start(t, string(raw), string(in))
	end := b.WaitEnd(t, runID)
	require.Equal(t, event.RunSucceeded, end.Kind, "%s", end.Data)
	require.Len(t, sideEffects(t, side), 5)
	require.Contains(t, string(data[event.RunSucceededData](t, end).Output), `"topic":"demo"`)
}

// TestProcessTimeoutKillsAChildThatIgnoresSIGTERM: past timeoutMs every
// process gets SIGTERM; a program that ignores it is killed after
// ProcessGrace, and the step fails as timed out.
func TestProcessTimeoutKillsAChildThatIgnoresSIGTERM(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", nil)
	mk, mv := newMark(t)
	cmd, err := json.Marshal([]string{"/bin/sh", "-c", `trap '' TERM; while :; do sleep 0.05; done`})
	require.NoError(t, err)
	wf := fmt.Sprintf(`{"name":"stubborn","nodes":[{"id":"start","type":"trigger"},
	{"id":"nap","type":"process","data":{"command":%s,"env":{%q:%q},"timeoutMs":10000}}],
	"edges":[{"from":"start","to":"nap"}]}`, cmd, mk, mv)
	start := time.Now()
	runID := b.Start(t, wf, `{}`)
	// Its first sleep: the trap is set (well within the timeout, which
	// counts from the sandbox's start).
	require.Eventually(t, func() bool { return len(alive(mv, "sleep 0.05")) > 0 }, 30*time.Second, 5*time.Millisecond)
	require.Equal(t, event.RunFailed, b.WaitEnd(t, runID).Kind)
	require.GreaterOrEqual(t, time.Since(start), workers.ProcessGrace, "SIGKILL only after the grace")
	requireNoneAlive(t, mv)
	failed := find(b.Events(t, runID), event.StepFailed, "nap")
	require.Len(t, failed, 1)
	require.Contains(t, data[event.StepFailedData](t, failed[0]).Error, "the process timed out after 10s and was stopped")
}
