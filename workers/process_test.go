package workers_test

// Process steps with real processes: Python and Go programs using the SDK
// helpers, run by real `pal worker` processes that are killed with kill -9
// mid sub-step.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/runs"
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

// substepsProgram is the command of examples/process's program in one
// language: the Python script, or the Go program built for the test.
func substepsProgram(t *testing.T, lang string) ([]string, map[string]string) {
	t.Helper()
	root := repoRoot(t)
	if lang == "python" {
		if _, err := exec.LookPath("python3"); err != nil {
			t.Fatalf("python3 is needed for the Python SDK's test: %v", err)
		}
		return []string{"python3", filepath.Join(root, "examples", "process", "substeps.py")},
			map[string]string{"PYTHONPATH": filepath.Join(root, "sdk", "python")}
	}
	bin := filepath.Join(t.TempDir(), "substeps")
	build := exec.Command("go", "build", "-o", bin, "./examples/process/substeps")
	build.Dir = root
	out, err := build.CombinedOutput()
	require.NoError(t, err, "building examples/process/substeps:\n%s", out)
	return []string{bin}, nil
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

// holdPIDs waits until the hold file names n processes and returns them.
func holdPIDs(t *testing.T, path string, n int) []int {
	t.Helper()
	var pids []int
	require.Eventually(t, func() bool {
		b, _ := os.ReadFile(path)
		pids = pids[:0]
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				pids = append(pids, pid)
			}
		}
		return len(pids) >= n
	}, 60*time.Second, 20*time.Millisecond, "no process held at %s", path)
	return pids
}

// requireGone waits until pid no longer runs (gone, or a zombie).
func requireGone(t *testing.T, pid int) {
	t.Helper()
	require.Eventually(t, func() bool {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return true
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			return true
		}
		// The state follows the command name in parentheses.
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		return i > 0 && i+2 < len(s) && s[i+2] == 'Z'
	}, 10*time.Second, 10*time.Millisecond, "process %d outlived its worker", pid)
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
			dir := t.TempDir()
			side, hold := filepath.Join(dir, "side-effects"), filepath.Join(dir, "hold")
			if env == nil {
				env = map[string]string{}
			}
			env["SIDE_EFFECTS"], env["HOLD_AT"], env["HOLD_FILE"] = side, "s3", hold

			w1 := p.palWorker(t, "w1")
			runID := p.startWithID(t, processWorkflow(t, command, env, `,"maxResumes":3`), `{"topic":"crash"}`)
			pid := holdPIDs(t, hold, 1)[0]
			w1.Kill() // during sub-step 3, after its side effect
			requireGone(t, pid)

			p.palWorker(t, "w2")
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
	dir := t.TempDir()
	side, hold := filepath.Join(dir, "side-effects"), filepath.Join(dir, "hold")
	env["SIDE_EFFECTS"], env["HOLD_AT"], env["HOLD_FILE"], env["HOLD_ALWAYS"] = side, "s2", hold, "1"

	runID := p.startWithID(t, processWorkflow(t, command, env, ""), `{"topic":"loop"}`) // maxResumes: the default 3
	for i := 1; i <= 4; i++ {
		w := p.palWorker(t, fmt.Sprintf("w%d", i))
		pids := holdPIDs(t, hold, i)
		w.Kill()
		requireGone(t, pids[i-1])
	}
	p.palWorker(t, "w5")
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

// TestProcessReportTokenAuthorizesOneStep: step a hands its token to step
// b; b's reports with it, or with its own token naming step a, are refused,
// and so are reports over the bounds.
func TestProcessReportTokenAuthorizesOneStep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", nil)
	post := `
import json, os, urllib.request, urllib.error
def post(token, step, name, status="completed", output=1):
    req = urllib.request.Request(os.environ["PAL_REPORT_URL"], method="POST",
        data=json.dumps({"step_id": step, "name": name, "status": status, "output": output}).encode(),
        headers={"Authorization": "Bearer " + token})
    try:
        return urllib.request.urlopen(req).status
    except urllib.error.HTTPError as e:
        return e.code
`
	a := post + `
assert post(os.environ["PAL_REPORT_TOKEN"], "a", "mine") == 200
print(json.dumps({"token": os.environ["PAL_REPORT_TOKEN"]}))`
	bScript := post + `
own = os.environ["PAL_REPORT_TOKEN"]
print(json.dumps({"other": post(os.environ["A_TOKEN"], "a", "forged"),
                  "claim": post(own, "a", "forged2"),
                  "nobody": post("", "b", "forged3"),
                  "big": post(own, "b", "big", output="x" * (300 << 10)),
                  "status": post(own, "b", "odd", status="finished"),
                  "name": post(own, "b", "n" * 129),
                  "own": post(own, "b", "mine")}))`
	cmdA, err := json.Marshal([]string{"python3", "-c", a})
	require.NoError(t, err)
	cmdB, err := json.Marshal([]string{"python3", "-c", bScript})
	require.NoError(t, err)
	wf := fmt.Sprintf(`{"name":"tokens","nodes":[{"id":"start","type":"trigger"},
	{"id":"a","type":"process","data":{"command":%s}},
	{"id":"b","type":"process","data":{"command":%s,"env":{"A_TOKEN":"{{steps.a.output.token}}"}}}],
	"edges":[{"from":"start","to":"a"},{"from":"a","to":"b"}]}`, cmdA, cmdB)
	runID := b.Start(t, wf, `{}`)
	end := b.WaitEnd(t, runID)
	require.Equal(t, event.RunSucceeded, end.Kind, "%s", end.Data)
	var codes map[string]int
	require.NoError(t, json.Unmarshal(data[event.RunSucceededData](t, end).Output, &codes))
	require.Equal(t, map[string]int{"other": 401, "claim": 403, "nobody": 401, "big": 413, "status": 400, "name": 400,
		"own": 200}, codes)

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
	cmd, err := json.Marshal([]string{"python3", "-c", "b = bytearray(512 * 1024 * 1024)\nprint('allocated')"})
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
	require.Contains(t, d.Error, "exceeded its memory limit of 64 MiB (limits.memoryMb)")
	require.Contains(t, d.Stderr, "MemoryError")
	require.NotContains(t, d.Error, "allocated")
}

// TestProcessCancelStopsTheChild: cancelling the run sends the child's
// group SIGTERM; the child is gone and the run is cancelled.
func TestProcessCancelStopsTheChild(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", nil)
	pidFile := filepath.Join(t.TempDir(), "pid")
	cmd, err := json.Marshal([]string{"/bin/sh", "-c", `echo $$ > "$PID_FILE"; exec sleep 300`})
	require.NoError(t, err)
	env, err := json.Marshal(map[string]string{"PID_FILE": pidFile})
	require.NoError(t, err)
	wf := fmt.Sprintf(`{"name":"sleeper","nodes":[{"id":"start","type":"trigger"},
	{"id":"nap","type":"process","data":{"command":%s,"env":%s}}],
	"edges":[{"from":"start","to":"nap"}]}`, cmd, env)
	runID := b.Start(t, wf, `{}`)
	pid := holdPIDs(t, pidFile, 1)[0]
	require.NoError(t, b.Runs.Cancel(context.Background(), runs.CancelCommand{RunID: runID, Reason: "test"}))
	require.Equal(t, event.RunCancelled, b.WaitEnd(t, runID).Kind)
	requireGone(t, pid)
}

// TestProcessOutputAndStderr: the last stdout line is the output when fd 3
// is empty; stdin carries the rendered input; the stderr tail is journaled
// and bounded; the environment is clean.
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
	// The interpreter itself, not a shim (pyenv's adds to the environment).
	exe, err := exec.Command("python3", "-c", "import sys; print(sys.executable)").Output()
	require.NoError(t, err)
	cmd, err := json.Marshal([]string{strings.TrimSpace(string(exe)), "-c", script})
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
	// environment beyond the allowlist (Python may add LC_CTYPE itself).
	require.Equal(t, []string{"PAL_ATTEMPT", "PAL_IDEMPOTENCY_KEY", "PAL_REPORT_TOKEN", "PAL_REPORT_URL", "PAL_RUN_ID", "PAL_STEP_ID"}, out.Pal)
	require.Contains(t, out.Other, "MINE")
	for _, k := range out.Other {
		require.Contains(t, []string{"PATH", "HOME", "LANG", "TZ", "MINE", "LC_CTYPE"}, k)
	}
	done := find(b.Events(t, runID), event.StepCompleted, "work")
	require.Len(t, done, 1)
	d := data[event.StepCompletedData](t, done[0])
	require.Len(t, d.Stderr, 8<<10)
	require.True(t, strings.HasSuffix(d.Stderr, "xxx\nthe end\n"))
}

// TestProcessExampleWorkflows: examples/process's workflows parse, and the
// Python one runs (from the repository root, as the README says).
func TestProcessExampleWorkflows(t *testing.T) {
	t.Parallel()
	root := repoRoot(t)
	for _, f := range []string{"substeps-python.json", "substeps-go.json"} {
		b, err := os.ReadFile(filepath.Join(root, "examples", "process", f))
		require.NoError(t, err)
		_, err = workflow.Parse(b)
		require.NoError(t, err, f)
	}
	b := setup(t)
	b.worker(t, "w1", nil)
	raw, err := os.ReadFile(filepath.Join(root, "examples", "process", "substeps-python.json"))
	require.NoError(t, err)
	// The worker of this test runs in workers/: make the paths absolute.
	wf := strings.NewReplacer(`"examples/process/`, `"`+root+`/examples/process/`, `"sdk/python"`, `"`+root+`/sdk/python"`).Replace(string(raw))
	side := filepath.Join(t.TempDir(), "side-effects")
	in, err := json.Marshal(map[string]string{"topic": "demo", "sideEffects": side})
	require.NoError(t, err)
	runID := b.Start(t, wf, string(in))
	end := b.WaitEnd(t, runID)
	require.Equal(t, event.RunSucceeded, end.Kind, "%s", end.Data)
	require.Len(t, sideEffects(t, side), 5)
	require.Contains(t, string(data[event.RunSucceededData](t, end).Output), `"topic":"demo"`)
}

// TestProcessTimeoutKillsAChildThatIgnoresSIGTERM: past timeoutMs the group
// gets SIGTERM; a child that ignores it is killed after ProcessGrace, and
// the step fails as timed out.
func TestProcessTimeoutKillsAChildThatIgnoresSIGTERM(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", nil)
	pidFile := filepath.Join(t.TempDir(), "pid")
	cmd, err := json.Marshal([]string{"/bin/sh", "-c", `trap '' TERM; echo $$ > "$PID_FILE"; while :; do sleep 0.05; done`})
	require.NoError(t, err)
	env, err := json.Marshal(map[string]string{"PID_FILE": pidFile})
	require.NoError(t, err)
	wf := fmt.Sprintf(`{"name":"stubborn","nodes":[{"id":"start","type":"trigger"},
	{"id":"nap","type":"process","data":{"command":%s,"env":%s,"timeoutMs":300}}],
	"edges":[{"from":"start","to":"nap"}]}`, cmd, env)
	start := time.Now()
	runID := b.Start(t, wf, `{}`)
	pid := holdPIDs(t, pidFile, 1)[0]
	require.Equal(t, event.RunFailed, b.WaitEnd(t, runID).Kind)
	require.GreaterOrEqual(t, time.Since(start), workers.ProcessGrace, "SIGKILL only after the grace")
	requireGone(t, pid)
	failed := find(b.Events(t, runID), event.StepFailed, "nap")
	require.Len(t, failed, 1)
	require.Contains(t, data[event.StepFailedData](t, failed[0]).Error, "the process timed out after 300ms and was stopped")
}
