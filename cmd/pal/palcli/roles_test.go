package palcli_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/eventstore/natsauth"
	"github.com/palrun/pal/paltest/testenv"
)

// pal worker, pal projector and pal server, each a process with its role's
// PAL_NATS_CREDS (an nkey seed file), run a workflow end to end through
// REST and the projection, and none of them is refused anything.
func TestProcessesWithRoles(t *testing.T) {
	t.Parallel()
	bin := testenv.PalBinary(t)
	nats := testenv.NATS(t, testenv.Roles())
	pg := testenv.Postgres(t)
	dir := t.TempDir()
	creds := func(r natsauth.Role) string { return roleCreds(t, nats, dir, r) }
	common := []string{"PAL_NATS_URL=" + nats.URL(), "DATABASE_URL=" + pg.DSN(), "PAL_DATA_DIR=" + dir}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	// Without credentials a process is refused, and says what to set.
	r := runPal(t, bin, common, "run", "events", "run_x")
	require.Equal(t, 2, r.code, "%s", r)
	require.Contains(t, r.stderr, "Authorization Violation")
	require.Contains(t, r.stderr, "PAL_NATS_CREDS")
	r = runPal(t, bin, append(common, "PAL_NATS_CREDS="+filepath.Join(dir, "missing.nk")), "run", "events", "run_x")
	require.Equal(t, 2, r.code, "%s", r)
	require.Contains(t, r.stderr, "PAL_NATS_CREDS=")

	// A password in the URL is used, and never shown.
	r = runPal(t, bin, []string{"PAL_NATS_URL=" + strings.Replace(nats.URL(), "nats://", "nats://client:sekret@", 1), "PAL_DATA_DIR=" + dir},
		"run", "events", "run_x")
	require.Equal(t, 2, r.code, "%s", r)
	require.Contains(t, r.stderr, "Authorization Violation")
	require.NotContains(t, r.stderr, "sekret")

	worker := testenv.StartProcess(t, bin, []string{"worker", "--worker-id", "w1"}, append(common, creds(natsauth.Worker)))
	require.NoError(t, worker.WaitForOutput(ctx, "worker ready"), worker.Output())
	proj := testenv.StartProcess(t, bin, []string{"projector"}, append(common, creds(natsauth.Projector)))
	require.NoError(t, proj.WaitForOutput(ctx, "projector ready"), proj.Output())
	port := testenv.FreePort(t)
	url := fmt.Sprintf("http://127.0.0.1:%d", port)
	srv := testenv.StartProcess(t, bin, []string{"server"}, append(common, creds(natsauth.API),
		fmt.Sprintf("PAL_HTTP_ADDR=127.0.0.1:%d", port), "PAL_API_TOKENS=ci=secret-1"))
	require.NoError(t, srv.WaitForOutput(ctx, `msg="server ready"`), srv.Output())

	call := func(method, path, body string) (int, string) {
		req, err := http.NewRequestWithContext(ctx, method, url+path, strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer secret-1")
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res.StatusCode, string(b)
	}
	wf := `{"name":"echo","nodes":[{"id":"start","type":"trigger"},{"id":"t1","type":"tool","data":{"tool":"echo","input":{"i":1}}}],"edges":[{"from":"start","to":"t1"}]}`
	code, body := call(http.MethodPost, "/v1/runs", `{"workflow":`+wf+`,"input":{}}`)
	require.Equal(t, http.StatusCreated, code, body)
	id := decodeJSON[map[string]any](t, body)["run_id"].(string)
	require.Eventually(t, func() bool {
		code, body = call(http.MethodGet, "/v1/runs?status=succeeded", "")
		return code == 200 && strings.Contains(body, id)
	}, 30*time.Second, 50*time.Millisecond, "the run, succeeded, in the projection: %d %s", code, body)
	// The SSE feed (an ordered consumer on the api role) replays the run.
	code, body = call(http.MethodGet, "/v1/runs/"+id+"/events", "")
	require.Equal(t, 200, code)
	require.Contains(t, body, "run_succeeded")

	for name, p := range map[string]*testenv.Process{"worker": worker, "projector": proj, "server": srv} {
		require.NotContains(t, p.Output(), "NATS error", "%s was refused something", name)
		require.NotContains(t, strings.ToLower(p.Output()), "permissions violation", name)
	}
}

// roleCreds writes role r's nkey seed of the server n into dir and
// returns the PAL_NATS_CREDS setting naming it, for a pal process that
// runs as that role.
func roleCreds(t *testing.T, n *testenv.NATSServer, dir string, r natsauth.Role) string {
	t.Helper()
	path := filepath.Join(dir, natsauth.SeedFile(r))
	require.NoError(t, os.WriteFile(path, n.Keys().Seed(r), 0o600))
	return "PAL_NATS_CREDS=" + path
}

// TestCommandsAsWorkerRole: under pal dev the pal commands act as the
// worker role (dev.env gives them its seed). None of them is refused
// anything, and a watch (start --wait, run watch, events --follow) sees
// its run end at once, not at the watch's 10 s resync.
func TestCommandsAsWorkerRole(t *testing.T) {
	t.Parallel()
	bin := testenv.PalBinary(t)
	nats := testenv.NATS(t, testenv.Roles())
	pg := testenv.Postgres(t)
	dir := t.TempDir()
	common := []string{"PAL_NATS_URL=" + nats.URL(), "DATABASE_URL=" + pg.DSN(), "PAL_DATA_DIR=" + dir}
	asWorker := append(slices.Clone(common), roleCreds(t, nats, dir, natsauth.Worker))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	worker := testenv.StartProcess(t, bin, []string{"worker", "--worker-id", "w1"}, asWorker)
	require.NoError(t, worker.WaitForOutput(ctx, "worker ready"), worker.Output())
	proj := testenv.StartProcess(t, bin, []string{"projector"}, append(slices.Clone(common), roleCreds(t, nats, dir, natsauth.Projector)))
	require.NoError(t, proj.WaitForOutput(ctx, "projector ready"), proj.Output())

	refused := func(out string) bool { return strings.Contains(strings.ToLower(out), "permissions violation") }
	pal := func(want int, args ...string) result {
		t.Helper()
		r := runPal(t, bin, asWorker, args...)
		require.Equal(t, want, r.code, "pal %s: %s", strings.Join(args, " "), r)
		require.False(t, refused(r.stderr), "pal %s: %s", strings.Join(args, " "), r)
		return r
	}
	file := func(name, content string) string {
		p := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
		return p
	}
	// live is how long a watch may take to see what was just appended:
	// well under the 10 s resync.
	const live = 5 * time.Second
	startRun := func(wf string) string {
		t.Helper()
		r := pal(0, "run", "start", "--workflow", wf, "--input", `{}`)
		return strings.TrimSpace(r.stdout)
	}
	waiting := func(id string) {
		t.Helper()
		require.Eventually(t, func() bool {
			r := pal(0, "run", "events", id)
			return strings.Contains(r.stdout, "step_waiting")
		}, 30*time.Second, 50*time.Millisecond, "run %s never waited", id)
	}

	echo := file("echo.json", `{"name":"echo","nodes":[{"id":"start","type":"trigger"},{"id":"t1","type":"tool","data":{"tool":"echo","input":{"i":1}}}],"edges":[{"from":"start","to":"t1"}]}`)
	begin := time.Now()
	r := pal(0, "run", "start", "--workflow", echo, "--input", `{}`, "--wait", "--json")
	require.Less(t, time.Since(begin), live, "start --wait waited for the resync")
	id, _ := decodeJSON[map[string]any](t, r.stdout)["run_id"].(string)
	require.Regexp(t, `^run_`, id)
	r = pal(0, "run", "events", id, "--follow")
	require.Contains(t, r.stdout, "run_succeeded")
	pal(0, "run", "watch", id)
	pal(0, "run", "get", id)
	pal(0, "run", "export", id)
	require.Eventually(t, func() bool {
		return strings.Contains(pal(0, "run", "list").stdout, id)
	}, 30*time.Second, 50*time.Millisecond)
	r = pal(0, "run", "fork", id, "--from", "t1", "--json")
	fork, _ := decodeJSON[map[string]any](t, r.stdout)["run_id"].(string)
	pal(0, "run", "watch", fork)

	// A run waiting for approval: resumed, watched, approved.
	gate := startRun(file("gate.json", `{"name":"gate","nodes":[{"id":"start","type":"trigger"},
		{"id":"ok","type":"approval","data":{"prompt":"go?","approvers":["ana"]}},
		{"id":"t1","type":"tool","data":{"tool":"echo","input":{"i":1}}}],
		"edges":[{"from":"start","to":"ok"},{"from":"ok","to":"t1"}]}`))
	waiting(gate)
	pal(0, "run", "resume", gate)
	watch := testenv.StartProcess(t, bin, []string{"run", "watch", gate}, asWorker)
	require.NoError(t, watch.WaitForOutput(ctx, "step_waiting"), watch.Output())
	pal(0, "run", "approve", gate, "--step", "ok", "--approver", "ana")
	approved := time.Now()
	wctx, wcancel := context.WithTimeout(ctx, live)
	defer wcancel()
	require.NoError(t, watch.Wait(wctx), "run watch did not see the approved run end live:\n%s", watch.Output())
	require.Less(t, time.Since(approved), live)
	require.False(t, refused(watch.Output()), watch.Output())

	// A run waiting for a signal, and one paused on its budget.
	sig := startRun(file("wait.json", `{"name":"wait-go","nodes":[{"id":"start","type":"trigger"},
		{"id":"hold","type":"wait","data":{"signal":"go"}},{"id":"done","type":"tool","data":{"tool":"echo"}}],
		"edges":[{"from":"start","to":"hold"},{"from":"hold","to":"done"}]}`))
	waiting(sig)
	pal(0, "run", "signal", sig, "go")
	pal(0, "run", "watch", sig)
	budget := startRun(file("budget.json", `{"name":"two","nodes":[{"id":"start","type":"trigger"},
		{"id":"a","type":"tool","data":{"tool":"echo"}},{"id":"b","type":"tool","data":{"tool":"echo"}}],
		"edges":[{"from":"start","to":"a"},{"from":"a","to":"b"}],
		"policy":{"budget":{"maxSteps":1,"onExceed":"pause"}}}`))
	waiting(budget)
	pal(0, "run", "budget", budget, "--add-steps", "1")
	pal(0, "run", "watch", budget)

	// Cancelled while it waits (run watch exits 1 for a cancelled run).
	gone := startRun(file("gate2.json", `{"name":"gate","nodes":[{"id":"start","type":"trigger"},
		{"id":"ok","type":"approval","data":{"prompt":"go?","approvers":["ana"]}}],"edges":[{"from":"start","to":"ok"}]}`))
	waiting(gone)
	pal(0, "run", "cancel", gone)
	pal(1, "run", "watch", gone)

	for name, p := range map[string]*testenv.Process{"worker": worker, "projector": proj} {
		require.False(t, refused(p.Output()), "%s: %s", name, p.Output())
	}
}

// As a client user the CLI's run commands are refused by NATS (a
// permissions violation, reported asynchronously): the command fails at
// once, not at its request's timeout, saying which credentials NATS
// refused and which role the command needs; the api role's credentials
// run it.
func TestRunCommandRefusedForRole(t *testing.T) {
	t.Parallel()
	bin := testenv.PalBinary(t)
	nats := testenv.NATS(t, testenv.Roles())
	js, err := jetstream.New(nats.ConnAs(t, natsauth.Admin))
	require.NoError(t, err)
	require.NoError(t, eventstore.Setup(context.Background(), js, eventstore.Config{}))
	dir := t.TempDir()
	wf := filepath.Join(dir, "wf.json")
	require.NoError(t, os.WriteFile(wf, []byte(seqWorkflow(1)), 0o644))
	common := []string{"PAL_NATS_URL=" + nats.URL(), "PAL_DATA_DIR=" + dir}

	client := roleCreds(t, nats, dir, natsauth.Client)
	began := time.Now()
	r := runPal(t, bin, append(common, client), "run", "start", "--workflow", wf)
	took := time.Since(began)
	require.Equal(t, 2, r.code, "%s", r)
	require.Contains(t, r.stderr, "NATS refused this command for the credentials in PAL_NATS_CREDS ("+strings.TrimPrefix(client, "PAL_NATS_CREDS=")+")")
	require.Contains(t, r.stderr, "Permissions Violation for")
	require.Contains(t, r.stderr, "need the api role")
	require.NotContains(t, r.stderr, "deadline exceeded")
	require.Less(t, took, 4*time.Second, "the command waited for its request's timeout (5s)\n%s", r)
	r = runPal(t, bin, append(common, client), "run", "start", "--workflow", wf, "--json")
	require.Equal(t, 2, r.code, "%s", r)
	require.Equal(t, "forbidden", decodeJSON[map[string]any](t, r.stdout)["error"])

	// No credentials at all: NATS refuses the login, also for good.
	r = runPal(t, bin, common, "run", "start", "--workflow", wf)
	require.Equal(t, 2, r.code, "%s", r)
	require.Contains(t, strings.ToLower(r.stderr), "authorization violation", "%s", r)
	require.Contains(t, r.stderr, "NATS refused the login of the user of PAL_NATS_URL", "%s", r)
	require.Contains(t, r.stderr, "PAL_NATS_CREDS", "%s", r)
	r = runPal(t, bin, common, "run", "start", "--workflow", wf, "--json")
	require.Equal(t, 2, r.code, "%s", r)
	require.Equal(t, "forbidden", decodeJSON[map[string]any](t, r.stdout)["error"])

	r = runPal(t, bin, append(common, roleCreds(t, nats, dir, natsauth.API)), "run", "start", "--workflow", wf)
	require.Equal(t, 0, r.code, "%s", r)
}

// pal worker without credentials against a server that needs them stops
// with the server's reason, instead of waiting on a closed connection.
func TestWorkerWithoutCredentialsSaysWhy(t *testing.T) {
	t.Parallel()
	bin := testenv.PalBinary(t)
	nats := testenv.NATS(t, testenv.Roles())
	r := runPal(t, bin, []string{"PAL_NATS_URL=" + nats.URL(), "PAL_DATA_DIR=" + t.TempDir()}, "worker")
	require.Equal(t, 4, r.code, "%s", r)
	require.Contains(t, strings.ToLower(r.stderr), "authorization violation", "%s", r)
	require.Contains(t, r.stderr, "PAL_NATS_CREDS", "%s", r)
}
