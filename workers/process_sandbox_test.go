package workers_test

// What a process step's sandbox keeps from a hostile program and hostile
// input, with real processes in real bubblewrap sandboxes.

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/internal/egress"
	"github.com/palrun/pal/internal/sandbox"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/runs"
	"github.com/palrun/pal/workflow"
)

// oneProcess is a workflow of one process node "work" with data d (JSON).
func oneProcess(d string) string {
	return `{"name":"p","nodes":[{"id":"start","type":"trigger"},{"id":"work","type":"process","data":` + d +
		`}],"edges":[{"from":"start","to":"work"}]}`
}

// processData is a process node's data: argv, env and more fields (JSON).
func processData(t *testing.T, argv []string, env map[string]string, extra string) string {
	t.Helper()
	c, err := json.Marshal(argv)
	require.NoError(t, err)
	if env == nil {
		env = map[string]string{}
	}
	e, err := json.Marshal(env)
	require.NoError(t, err)
	return fmt.Sprintf(`{"command":%s,"env":%s%s}`, c, e, extra)
}

// stepFailure is the error of step "work" of a failed run.
func stepFailure(t *testing.T, b *bundle, runID string) event.StepFailedData {
	t.Helper()
	failed := find(b.Events(t, runID), event.StepFailed, "work")
	require.Len(t, failed, 1)
	return data[event.StepFailedData](t, failed[0])
}

// hostileProbes tries what a hostile program would try; each entry says
// what it got: an error, or "GOT: …".
const hostileProbes = `
import json, os, socket
out = {}
def attempt(name, fn):
    try:
        out[name] = "GOT: " + str(fn())[:200]
    except Exception as e:
        out[name] = type(e).__name__ + ": " + str(e)[:200]
def read(p):
    with open(p, "rb") as f:
        return f.read()
def write(p, n=1):
    with open(p, "wb") as f:
        f.write(b"x" * n)
    return p
def connect(host, port):
    socket.create_connection((host, port), timeout=2).close()
    return "connected"
def environs():
    found = [p for p in os.listdir("/proc") if p.isdigit() and os.access("/proc/%s/environ" % p, os.R_OK)
             and b"NEIGHBOUR" in read("/proc/%s/environ" % p)]
    if not found:
        raise LookupError("no process with the neighbour's environment")
    return found
data = os.environ["DATA_DIR"]
for f in ["nats-admin.nk", "pal.key", "dev.env"]:
    attempt("read " + f, lambda f=f: read(os.path.join(data, f)))
    attempt("read mounted " + f, lambda f=f: read("/srv/repo/.pal/" + f))
attempt("list data dir", lambda: os.listdir(data))
def nonempty(x):
    if not x:
        raise LookupError("empty")
    return x
attempt("list mounted data dir", lambda: nonempty(os.listdir("/srv/repo/.pal")))
attempt("worker environ", lambda: read("/proc/%s/environ" % os.environ["WORKER_PID"]))
attempt("parent environ", lambda: read("/proc/%d/environ" % os.getppid()))
attempt("other environs", environs)
attempt("kill worker", lambda: os.kill(int(os.environ["WORKER_PID"]), 9))
attempt("connect nats", lambda: connect("127.0.0.1", int(os.environ["NATS_PORT"])))
attempt("connect metadata", lambda: connect("169.254.169.254", 80))
for p in ["/escape", "/usr/escape", "/etc/escape", "/srv/repo/escape", "/run/pal/ipc/escape", data + "/escape"]:
    attempt("write " + p, lambda p=p: write(p))
try:
    write("/home/pal/big", 3 << 20)
    out["write past the file size limit"] = "GOT: %d bytes" % os.path.getsize("/home/pal/big")
except OSError as e:
    out["write past the file size limit"] = "%s: %d bytes written" % (e, os.path.getsize("/home/pal/big"))
out["big file"] = os.path.getsize("/home/pal/big")
print(json.dumps(out))
`

// TestProcessStepGetsNothingOfTheWorker: a process step of a real pal
// worker tries to read the data directory's keys (at their path, and under
// a mount of the directory holding it), the worker's environment and
// another step's, to list the data directory, to connect to the NATS port
// and to the metadata address, to kill the worker, to write outside its
// work directory and past its file size limit: it gets nothing, and
// nothing of it reaches the journal.
func TestProcessStepGetsNothingOfTheWorker(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	repo := sharedDir(t)
	require.NoError(t, os.Chmod(repo, 0o755))
	dataDir := filepath.Join(repo, ".pal")
	require.NoError(t, os.Mkdir(dataDir, 0o700))
	for name, content := range map[string]string{"nats-admin.nk": "SUASECRETADMINSEED\n", "pal.key": "-----BEGIN PRIVATE KEY-----\nSECRETKEY\n",
		"dev.env": "PAL_API_TOKENS=SECRET-token:admin\n"} {
		require.NoError(t, os.WriteFile(filepath.Join(dataDir, name), []byte(content), 0o600))
	}
	w := p.palWorker(t, "w1", "PAL_DATA_DIR="+dataDir, "PAL_PROCESS_MOUNTS="+repo+"=/srv/repo", "PAL_SECRET_DEMO=SECRET-demo")

	// A neighbour: another run's step, whose environment holds a secret.
	mk, mv := newMark(t)
	neighbour := p.startWithID(t, oneProcess(processData(t, []string{"/bin/sleep", "600"},
		map[string]string{"NEIGHBOUR": "SECRET-neighbour", mk: mv}, "")), `{}`)
	require.Eventually(t, func() bool { return len(alive(mv, "/bin/sleep")) == 1 }, 60*time.Second, 10*time.Millisecond)

	natsURL, err := url.Parse(p.natsURL)
	require.NoError(t, err)
	runID := p.startWithID(t, oneProcess(processData(t, []string{python, "-c", hostileProbes}, map[string]string{
		"DATA_DIR": dataDir, "WORKER_PID": strconv.Itoa(w.PID()), "NATS_PORT": natsURL.Port()},
		`,"limits":{"fileSizeMb":1}`)), `{}`)
	end := p.WaitEnd(t, runID)
	require.Equal(t, event.RunSucceeded, end.Kind, "%s", end.Data)
	var got map[string]any
	require.NoError(t, json.Unmarshal(data[event.RunSucceededData](t, end).Output, &got))
	t.Logf("%v", got)
	for k, v := range got {
		switch k {
		case "big file":
			require.LessOrEqual(t, v, float64(1<<20), "no more than the file size limit")
		case "write past the file size limit":
			require.Contains(t, v, "File too large")
		default:
			require.NotContains(t, v, "GOT:", k)
		}
	}
	require.Len(t, got, 22)
	select {
	case <-w.Exited():
		t.Fatal("the worker died")
	default:
	}
	// Nothing of the worker's secrets in the probe's journal.
	for _, ev := range p.Events(t, runID) {
		require.NotContains(t, string(ev.Data), "SECRET", "%s", ev.Kind)
	}
	require.NoError(t, p.Runs.Cancel(context.Background(), runs.CancelCommand{RunID: neighbour, Reason: "test"}))
	require.Equal(t, event.RunCancelled, p.WaitEnd(t, neighbour).Kind)
	requireNoneAlive(t, mv)
}

// TestProcessInputIsData: a workflow whose program, shell code or loader
// variable would come from input is refused before it runs; input that
// tries shell, argument and environment injection into a valid one runs
// nothing it names.
func TestProcessInputIsData(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", nil)
	for _, d := range []string{
		processData(t, []string{"{{input.prog}}", "-c", "id"}, nil, ""),
		processData(t, []string{"/bin/sh", "-c", "echo hello {{input.name}}"}, nil, ""),
		processData(t, []string{"/bin/echo"}, map[string]string{"LD_PRELOAD": "{{input.lib}}"}, ""),
		processData(t, []string{"/bin/echo"}, map[string]string{"PATH": "/tmp"}, ""),
		processData(t, []string{"/usr/bin/env", "{{input.prog}}"}, nil, ""),
	} {
		_, err := b.Runs.Start(context.Background(), runs.StartCommand{Workflow: json.RawMessage(oneProcess(d)),
			Input: json.RawMessage(`{"prog":"/bin/sh","name":"x; id","lib":"/tmp/x.so"}`)})
		var ve *workflow.ValidationError
		require.ErrorAs(t, err, &ve, d)
	}

	script := `printf 'arg1=%s\n' "$1" >&2; printf 'arg2=%s\n' "$2" >&2
if test -e /home/pal/pwned || test -e /tmp/pwned; then echo pwned; else echo clean; fi`
	wf := fmt.Sprintf(`{"name":"p","nodes":[{"id":"start","type":"trigger"},
	{"id":"shell","type":"process","data":%s},
	{"id":"env","type":"process","data":%s}],
	"edges":[{"from":"start","to":"shell"},{"from":"shell","to":"env"}]}`,
		processData(t, []string{"/bin/sh", "-c", script, "sh", "{{input.name}}", "{{input.sub}}"}, nil, ""),
		processData(t, []string{python, "-c", "import json, os; print(json.dumps({k: os.environ.get(k) for k in ['GREETING', 'LD_PRELOAD', 'PATH']}))"},
			map[string]string{"GREETING": "{{input.env}}"}, ""))
	in, err := json.Marshal(map[string]string{"name": "world; touch /home/pal/pwned; echo pwned", "sub": "$(touch /tmp/pwned)`touch /home/pal/pwned`",
		"env": "x\nLD_PRELOAD=/tmp/evil.so\nPATH=/tmp"})
	require.NoError(t, err)
	runID := b.Start(t, wf, string(in))
	end := b.WaitEnd(t, runID)
	require.Equal(t, event.RunSucceeded, end.Kind, "%s", end.Data)
	shell := data[event.StepCompletedData](t, find(b.Events(t, runID), event.StepCompleted, "shell")[0])
	require.JSONEq(t, `"clean"`, string(shell.Output))
	require.Equal(t, "arg1=world; touch /home/pal/pwned; echo pwned\narg2=$(touch /tmp/pwned)`touch /home/pal/pwned`\n", shell.Stderr)
	var env map[string]*string
	require.NoError(t, json.Unmarshal(data[event.RunSucceededData](t, end).Output, &env))
	require.Equal(t, "x\nLD_PRELOAD=/tmp/evil.so\nPATH=/tmp", *env["GREETING"])
	require.Nil(t, env["LD_PRELOAD"])
	require.Equal(t, sandbox.PATH, *env["PATH"])
}

// TestProcessGrandchildDies: a grandchild that left with setsid and
// sleeps forever is gone after its step ends, after a cancel, and after
// kill -9 of the worker.
func TestProcessGrandchildDies(t *testing.T) {
	t.Parallel()
	t.Run("step ends", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		dir := sharedDir(t)
		b.Worker(t, "w1", paltest.Sandbox(runner(t, dir+":rw")))
		mk, mv := newMark(t)
		gc := filepath.Join(dir, "grandchild")
		runID := b.Start(t, oneProcess(processData(t, []string{"/bin/sh", "-c",
			`setsid sh -c 'echo $$ > "$GC"; exec sleep 1000' & while ! test -s "$GC"; do sleep 0.01; done; echo done`},
			map[string]string{"GC": gc, mk: mv}, "")), `{}`)
		require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
		require.FileExists(t, gc) // it was started
		requireNoneAlive(t, mv)
	})
	const forever = "setsid sleep 1000 & exec sleep 1000"
	t.Run("cancel", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		b.worker(t, "w1", nil)
		mk, mv := newMark(t)
		runID := b.Start(t, oneProcess(processData(t, []string{"/bin/sh", "-c", forever}, map[string]string{mk: mv}, "")), `{}`)
		require.Eventually(t, func() bool { return len(alive(mv, "sleep 1000")) == 2 }, 60*time.Second, 10*time.Millisecond)
		require.NoError(t, b.Runs.Cancel(context.Background(), runs.CancelCommand{RunID: runID, Reason: "test"}))
		require.Equal(t, event.RunCancelled, b.WaitEnd(t, runID).Kind)
		requireNoneAlive(t, mv)
	})
	t.Run("kill -9 of the worker", func(t *testing.T) {
		t.Parallel()
		p := setupProc(t, time.Second)
		mk, mv := newMark(t)
		w := p.palWorker(t, "w1")
		runID := p.startWithID(t, oneProcess(processData(t, []string{"/bin/sh", "-c", forever}, map[string]string{mk: mv}, "")), `{}`)
		require.Eventually(t, func() bool { return len(alive(mv, "sleep 1000")) == 2 }, 60*time.Second, 10*time.Millisecond)
		w.Kill()
		requireNoneAlive(t, mv)
		// The next worker starts the step again; a cancel ends it.
		p.palWorker(t, "w2")
		require.Eventually(t, func() bool { return len(alive(mv, "sleep 1000")) == 2 }, 60*time.Second, 10*time.Millisecond)
		require.NoError(t, p.Runs.Cancel(context.Background(), runs.CancelCommand{RunID: runID, Reason: "test"}))
		require.Equal(t, event.RunCancelled, p.WaitEnd(t, runID).Kind)
		requireNoneAlive(t, mv)
	})
}

// TestProcessLimitsStopBombsWhileOthersRun: a fork bomb and a disk filler
// are stopped by their limits and fail their steps with the limit named,
// while the worker drives another run's step, which goes on until the
// test lets it end.
func TestProcessLimitsStopBombsWhileOthersRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dir := sharedDir(t)
	b.Worker(t, "w1", paltest.Sandbox(runner(t, dir+":rw")))
	mk, mv := newMark(t)
	release := filepath.Join(dir, "release")
	other := b.Start(t, oneProcess(processData(t, []string{"/bin/sh", "-c",
		`while ! test -e "$RELEASE"; do sleep 0.05; done; echo '{"ok":true}'`},
		map[string]string{mk: mv, "RELEASE": release}, "")), `{}`)
	require.Eventually(t, func() bool { return len(alive(mv, "/bin/sh")) == 1 }, 60*time.Second, 10*time.Millisecond)
	bomb := b.Start(t, oneProcess(processData(t, []string{python, "-c", "import os\nwhile True:\n  try: os.fork()\n  except OSError: pass"},
		nil, `,"limits":{"maxProcesses":16}`)), `{}`)
	filler := b.Start(t, oneProcess(processData(t, []string{"/bin/sh", "-c",
		"i=0; while :; do head -c 1048576 /dev/zero > /home/pal/f$i; i=$((i+1)); done"}, nil, `,"limits":{"workdirMb":8}`)), `{}`)

	require.Equal(t, event.RunFailed, b.WaitEnd(t, bomb).Kind)
	require.Contains(t, stepFailure(t, b, bomb).Error, "the process exceeded its process limit of 16 (limits.maxProcesses) and was stopped")
	require.Equal(t, event.RunFailed, b.WaitEnd(t, filler).Kind)
	require.Contains(t, stepFailure(t, b, filler).Error, "the process exceeded its work directory limit of 8 MiB (limits.workdirMb) and was stopped")
	// The other run's step was running all along; now it may end.
	require.Len(t, alive(mv, "/bin/sh"), 1)
	require.NoError(t, os.WriteFile(release, nil, 0o644))
	end := b.WaitEnd(t, other)
	require.Equal(t, event.RunSucceeded, end.Kind, "%s", end.Data)
	require.JSONEq(t, `{"ok":true}`, string(data[event.RunSucceededData](t, end).Output))
}

// TestProcessEgress: a step with network "egress" reaches what the
// worker's egress policy allows, through the worker, and nothing else; a
// step without it reaches nothing.
func TestProcessEgress(t *testing.T) {
	t.Parallel()
	var hits atomic.Int64
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		fmt.Fprint(w, "hello")
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	b := setup(t)
	b.Worker(t, "w1", paltest.Egress((*egress.Policy)(nil).With(netip.MustParsePrefix("127.0.0.2/32"))))
	natsURL, err := url.Parse(b.NATS.URL())
	require.NoError(t, err)
	script := `
import json, sys, urllib.request, urllib.error
def get(url):
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return "%d %s" % (r.status, r.read().decode())
    except urllib.error.HTTPError as e:
        return "%d %s" % (e.code, e.read().decode().strip()[:200])
    except Exception as e:
        return type(e).__name__
print(json.dumps({"allowed": get(sys.argv[1]), "nats": get(sys.argv[2]), "metadata": get("http://169.254.169.254/")}))`
	argv := []string{python, "-c", script, "http://" + ln.Addr().String() + "/", "http://127.0.0.1:" + natsURL.Port() + "/"}
	var got map[string]string
	for _, network := range []string{"egress", "none"} {
		runID := b.Start(t, oneProcess(processData(t, argv, nil, `,"network":"`+network+`"`)), `{}`)
		end := b.WaitEnd(t, runID)
		require.Equal(t, event.RunSucceeded, end.Kind, "%s", end.Data)
		require.NoError(t, json.Unmarshal(data[event.RunSucceededData](t, end).Output, &got))
		if network == "egress" {
			require.Equal(t, "200 hello", got["allowed"])
			require.Contains(t, got["nats"], "403")
			require.Contains(t, got["nats"], egress.EnvAllow)
			require.Contains(t, got["metadata"], "403")
			continue
		}
		for k, v := range got {
			require.NotContains(t, v, "200", k)
		}
	}
	require.EqualValues(t, 1, hits.Load())
}

// TestProcessStepWithoutSandbox: a worker where bubblewrap cannot run
// fails process steps, naming the fix, without starting anything; the
// programs a worker may start are the ones PAL_PROCESS_PROGRAMS lists.
func TestProcessStepWithoutSandbox(t *testing.T) {
	t.Parallel()
	dir := sharedDir(t)
	script := []string{python, "-c", "open('" + filepath.Join(dir, "ran") + "', 'w').write('ran')"}
	noBwrap, err := sandbox.New(sandbox.Config{Bwrap: "/nonexistent/bwrap"})
	require.NoError(t, err)
	b := setup(t)
	b.Worker(t, "w1", paltest.Sandbox(noBwrap))
	runID := b.Start(t, oneProcess(processData(t, script, nil, "")), `{}`)
	require.Equal(t, event.RunFailed, b.WaitEnd(t, runID).Kind)
	f := stepFailure(t, b, runID)
	require.Contains(t, f.Error, "this worker has none")
	require.Contains(t, f.Error, "apt-get install bubblewrap")
	require.Contains(t, f.Error, "PAL_PROCESS_SANDBOX=off")
	require.Equal(t, event.ClassTool, f.Class)
	require.Empty(t, find(b.Events(t, runID), event.StepRetrying, "work"))

	only := runner(t, dir+":rw", "/bin/echo")
	b2 := setup(t)
	b2.Worker(t, "w1", paltest.Sandbox(only))
	runID = b2.Start(t, oneProcess(processData(t, script, nil, "")), `{}`)
	require.Equal(t, event.RunFailed, b2.WaitEnd(t, runID).Kind)
	f = stepFailure(t, b2, runID)
	require.Contains(t, f.Error, "/usr/bin/python3 is not one of the programs this worker runs: add it to PAL_PROCESS_PROGRAMS")
	require.NoFileExists(t, filepath.Join(dir, "ran"))
	runID = b2.Start(t, oneProcess(processData(t, []string{"echo", `{"echoed":1}`}, nil, "")), `{}`)
	end := b2.WaitEnd(t, runID)
	require.Equal(t, event.RunSucceeded, end.Kind, "%s", end.Data)
	require.JSONEq(t, `{"echoed":1}`, string(data[event.RunSucceededData](t, end).Output))
}

// TestProcessSandboxOffIsUnsafe: PAL_PROCESS_SANDBOX=off runs process
// steps without a sandbox, and the worker says so when it starts.
func TestProcessSandboxOffIsUnsafe(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	w := p.palWorker(t, "w1", "PAL_PROCESS_SANDBOX=off")
	require.Contains(t, w.Output(), "UNSAFE: PAL_PROCESS_SANDBOX=off: process steps run without a sandbox")
	runID := p.startWithID(t, oneProcess(processData(t, []string{python, "-c",
		"import json, os; print(json.dumps({'uid': os.getuid(), 'pid1': os.path.exists('/proc/1')}))"}, nil, "")), `{}`)
	end := p.WaitEnd(t, runID)
	require.Equal(t, event.RunSucceeded, end.Kind, "%s", end.Data)
	require.JSONEq(t, fmt.Sprintf(`{"uid":%d,"pid1":true}`, os.Getuid()), string(data[event.RunSucceededData](t, end).Output))
}
