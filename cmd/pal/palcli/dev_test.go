package palcli_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/eventstore/natsauth"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/runs"
)

// pal dev writes .pal/dev.env; a worker and the one-shot commands run in
// that directory find NATS, Postgres and the fake provider through it, and
// what their own environment or flags set wins over it.
func TestDevWritesItsSettingsForTheOtherCommands(t *testing.T) {
	t.Parallel()
	bin := testenv.PalBinary(t)
	pg := testenv.Postgres(t)
	dir := t.TempDir()
	dataDir := filepath.Join(dir, ".pal")
	envPath := filepath.Join(dataDir, "dev.env")
	// What an earlier pal dev left behind is neither read nor kept.
	require.NoError(t, os.MkdirAll(dataDir, 0o755))
	require.NoError(t, os.WriteFile(envPath, []byte("DATABASE_URL='postgres://stale@127.0.0.1:1/x'\nPAL_NATS_URL=nats://127.0.0.1:1\n"), 0o644))

	natsURL := fmt.Sprintf("nats://127.0.0.1:%d", testenv.FreePort(t))
	dev := testenv.StartProcess(t, bin, []string{"dev", "--no-worker"}, []string{
		"PAL_HOME=" + dataDir, "PAL_NATS_URL=" + natsURL, "DATABASE_URL=" + pg.DSN(),
		"PAL_HTTP_ADDR=127.0.0.1:0", "PAL_LEASE_TTL=1s"})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	require.NoError(t, dev.WaitForOutput(ctx, "PAL dev is running"))
	require.NoError(t, dev.WaitForOutput(ctx, "Press Ctrl-C"))

	fi, err := os.Stat(envPath)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	// The file is shell-sourceable, and a shell reads what pal dev meant.
	sh := exec.Command("sh", "-c", `. "$1" && printf '%s\n' "$PAL_NATS_URL" "$DATABASE_URL" "$PAL_LEASE_TTL" "$OPENAI_API_KEY" "$PAL_EGRESS_ALLOW" "$OPENAI_BASE_URL" "$PAL_API_TOKEN" "$PAL_API_TOKENS" "$PAL_DEV_FAKE"`, "sh", envPath)
	out, err := sh.Output()
	require.NoError(t, err)
	got := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	require.Len(t, got, 9, "%s", out)
	// Loopback egress, as pal dev's own worker has it, for the workers
	// started beside pal dev --no-worker.
	require.Equal(t, []string{natsURL, pg.DSN(), "1s", "pal-dev", "127.0.0.0/8,::1/128"}, got[:5])
	require.Regexp(t, `^http://127\.0\.0\.1:\d+/v1$`, got[5])
	require.Regexp(t, `^pal_`, got[6])
	require.Equal(t, "dev="+got[6]+":admin", got[7])
	require.Equal(t, "1", got[8], "the workers send the nodes' fake blocks to the fake")
	// The data directory is not ./.pal: pal dev says how to reach it.
	abs, err := filepath.Abs(dataDir)
	require.NoError(t, err)
	require.Contains(t, dev.Output(), "pal commands use them with PAL_HOME='"+abs+"' set")
	require.Contains(t, dev.Output(), "after export PAL_HOME='"+abs+"'")

	// A second worker, with no NATS URL and no provider settings of its own,
	// takes pal dev's: no warning, and its LLM steps reach the fake. It
	// names the data directory by PAL_HOME's earlier name, still read.
	worker := testenv.StartProcess(t, bin, []string{"worker", "--worker-id", "w2"}, []string{"PAL_DATA_DIR=" + dataDir})
	require.NoError(t, worker.WaitForOutput(ctx, "worker ready"))
	require.Contains(t, worker.Output(), "nats="+natsURL)
	require.Contains(t, worker.Output(), "egress_allow=127.0.0.0/8,::1/128")
	require.NotContains(t, worker.Output(), "are unset")

	// In the directory, without a single variable: start (hello.json calls
	// both providers), list from Postgres.
	hello, err := filepath.Abs("../../../examples/hello.json")
	require.NoError(t, err)
	r := runPalIn(t, bin, dir, nil, "run", "start", "--workflow", hello, "--input", `{"text":"from dev.env"}`, "--wait", "--json")
	require.Equal(t, 0, r.code, "%s", r)
	started := decodeJSON[map[string]any](t, r.stdout)
	require.Equal(t, true, started["created"])
	id, _ := started["run_id"].(string)
	require.Regexp(t, `^run_`, id)
	require.Contains(t, r.stderr, "run_resumed", "progress goes to stderr")
	require.Contains(t, r.stderr, "worker=w2")

	// The tour's agent, on pal dev's fake: the model calls the echo tool
	// (a journaled step), then answers with its result.
	agent, err := filepath.Abs("../../../examples/agent.json")
	require.NoError(t, err)
	r = runPalIn(t, bin, dir, nil, "run", "start", "--workflow", agent, "--input", `{"question":"What is PAL?"}`, "--wait", "--json")
	require.Equal(t, 0, r.code, "%s", r)
	agentRun, _ := decodeJSON[map[string]any](t, r.stdout)["run_id"].(string)
	r = runPalIn(t, bin, dir, nil, "run", "events", agentRun, "--json")
	require.Equal(t, 0, r.code, "%s", r)
	var toolDone bool
	for _, line := range strings.Split(strings.TrimSpace(r.stdout), "\n") {
		ev := decodeJSON[event.Event](t, line)
		toolDone = toolDone || (ev.Kind == event.StepCompleted && ev.StepID == "ask.turn[0].tool[0]")
	}
	require.True(t, toolDone, "the agent called its tool: %s", r.stdout)
	r = runPalIn(t, bin, dir, nil, "run", "get", agentRun, "--json", "--journal")
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stdout, `echo returned {\"text\":\"What is PAL?\"}`, "the answer uses the tool's result")

	require.Eventually(t, func() bool {
		r = runPalIn(t, bin, dir, nil, "run", "list", "--json")
		if r.code != 0 {
			return false
		}
		list := decodeJSON[runs.RunList](t, r.stdout)
		return len(list.Runs) == 2 && list.Runs[1].RunID == id && list.Runs[1].Status == "succeeded"
	}, 30*time.Second, 100*time.Millisecond, "pal run list in the directory: %s", r)

	// pal dev made a signing key under .pal/ and gave it to the worker
	// through dev.env: the run has a receipt that verifies with .pal/pal.pub.
	fi, err = os.Stat(filepath.Join(dataDir, "pal.key"))
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	rpath := filepath.Join(dir, "receipt.json")
	require.Eventually(t, func() bool {
		r = runPalIn(t, bin, dir, nil, "run", "receipt", id, "-o", rpath)
		return r.code == 0
	}, 30*time.Second, 100*time.Millisecond, "pal run receipt in the directory: %s", r)
	r = runPalIn(t, bin, dir, nil, "run", "export", id)
	require.Equal(t, 0, r.code, "%s", r)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "run.jsonl"), []byte(r.stdout), 0o644))
	r = runPalIn(t, bin, dir, nil, "receipt", "verify", rpath, "--journal", "run.jsonl", "--pubkey", filepath.Join(dataDir, "pal.pub"))
	require.Equal(t, 0, r.code, "%s", r)

	// A node's fake block scripts pal dev's fake, through the pal worker
	// that read PAL_DEV_FAKE=1 from dev.env (this pal dev drives no runs):
	// the tool call it names, with its arguments, then its answer.
	scripted := filepath.Join(dir, "scripted.json")
	require.NoError(t, os.WriteFile(scripted, []byte(`{"name":"scripted","nodes":[{"id":"start","type":"trigger"},
		{"id":"ask","type":"agent","data":{"provider":"anthropic","model":"m","prompt":"{{input.question}}",
		 "tools":[{"name":"echo","parameters":{"type":"object","properties":{"text":{"type":"string"}}}}],
		 "fake":{"turns":[{"toolCalls":[{"name":"echo","arguments":{"text":"2+2"}}]},{"text":"It is 4."}]}}}],
		"edges":[{"from":"start","to":"ask"}]}`), 0o644))
	r = runPalIn(t, bin, dir, nil, "run", "start", "--workflow", scripted, "--input", `{"question":"What is 2+2?"}`, "--wait", "--json")
	require.Equal(t, 0, r.code, "%s", r)
	scriptedRun, _ := decodeJSON[map[string]any](t, r.stdout)["run_id"].(string)
	r = runPalIn(t, bin, dir, nil, "run", "get", scriptedRun, "--json", "--journal")
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stdout, `"text":"It is 4."`)
	require.Contains(t, r.stdout, `{\"text\":\"2+2\"}`, "the scripted arguments, journaled")

	// The environment wins over the file, and a flag over the environment.
	r = runPalIn(t, bin, dir, []string{"PAL_NATS_URL=nats://127.0.0.1:1"}, "run", "events", id)
	require.Equal(t, 4, r.code, "%s", r)
	require.Contains(t, r.stderr, "nats://127.0.0.1:1")
	r = runPalIn(t, bin, dir, []string{"PAL_NATS_URL=nats://127.0.0.1:1"}, "run", "events", id, "--nats-url", natsURL)
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stdout, "run_succeeded")

	// Stopping pal dev takes the file with it.
	require.NoError(t, worker.Term())
	require.NoError(t, worker.Wait(ctx))
	require.NoError(t, dev.Term())
	require.NoError(t, dev.Wait(ctx))
	_, err = os.Stat(envPath)
	require.ErrorIs(t, err, os.ErrNotExist)
}

// A worker that would send LLM steps to the public APIs without a key says
// so when it starts.
func TestWorkerWarnsWithoutProviderSettings(t *testing.T) {
	t.Parallel()
	bin := testenv.PalBinary(t)
	nats := testenv.NATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	w := testenv.StartProcess(t, bin, []string{"worker"}, []string{"PAL_NATS_URL=" + nats.URL(), "PAL_DATA_DIR=" + t.TempDir()})
	require.NoError(t, w.WaitForOutput(ctx, "worker ready"))
	require.Contains(t, w.Output(), "OPENAI_API_KEY and OPENAI_BASE_URL are unset")
	require.Contains(t, w.Output(), "ANTHROPIC_API_KEY and ANTHROPIC_BASE_URL are unset")

	// A base URL of one's own needs no key; a key for the public API is fine.
	w = testenv.StartProcess(t, bin, []string{"worker"}, []string{"PAL_NATS_URL=" + nats.URL(), "PAL_DATA_DIR=" + t.TempDir(),
		"OPENAI_BASE_URL=http://127.0.0.1:1/v1", "ANTHROPIC_API_KEY=k"})
	require.NoError(t, w.WaitForOutput(ctx, "worker ready"))
	require.NotContains(t, w.Output(), "are unset")
}

func TestVersion(t *testing.T) {
	t.Parallel()
	bin := testenv.PalBinary(t)
	r := runPal(t, bin, nil, "version")
	require.Equal(t, 0, r.code, "%s", r)
	require.Regexp(t, `^pal (\(devel\)|v\S+)( commit [0-9a-f]+( \(modified\))?)?( of \S+)?, `+strings.ReplaceAll(runtime.Version(), ".", `\.`)+"\n$", r.stdout)
	r = runPal(t, bin, nil, "version", "--json")
	require.Equal(t, 0, r.code, "%s", r)
	v := decodeJSON[map[string]any](t, r.stdout)
	require.Equal(t, runtime.Version(), v["go"])
	require.NotEmpty(t, v["version"])
}

// pal run id gives the id a start with an idempotency key gets, without a
// connection; pal run start --json says whether it created the run.
func TestRunIDOfAKey(t *testing.T) {
	t.Parallel()
	b := setup(t)
	r := runPal(t, b.bin, nil, "run", "id", "--key", "order-42")
	require.Equal(t, 0, r.code, "%s", r)
	id := strings.TrimSpace(r.stdout)
	require.Equal(t, runs.RunIDForKey("order-42"), id)

	wf := b.file(t, "wf.json", seqWorkflow(1))
	for _, created := range []bool{true, false} {
		r = b.pal(t, nil, "run", "start", "--workflow", wf, "--idempotency-key", "order-42", "--json")
		require.Equal(t, 0, r.code, "%s", r)
		require.Equal(t, map[string]any{"run_id": id, "created": created}, decodeJSON[map[string]any](t, r.stdout))
	}
	b.WaitEnd(t, id)

	r = runPal(t, b.bin, nil, "run", "id")
	require.Equal(t, 2, r.code, "%s", r)
	r = b.pal(t, nil, "run", "start", "--workflow", b.file(t, "bad.json", `{"name":"x"}`), "--json")
	require.Equal(t, 2, r.code, "%s", r)
	require.Equal(t, "bad_input", decodeJSON[map[string]any](t, r.stdout)["error"])
}

// pal dev turns NATS authentication on with PAL's accounts: each role's
// and client user's nkey seed is in the data directory, readable by its
// owner only; pal dev's own client user starts a run through the NATS
// service and cannot write the journal; a client user of PAL_NATS_USERS
// acts as itself within its scopes; dev.env tells the other pal commands
// who the users are; an anonymous connection is refused.
func TestDevNATSRoles(t *testing.T) {
	t.Parallel()
	bin := testenv.PalBinary(t)
	pg := testenv.Postgres(t)
	dataDir := filepath.Join(t.TempDir(), ".pal")
	natsURL := fmt.Sprintf("nats://127.0.0.1:%d", testenv.FreePort(t))
	dev := testenv.StartProcess(t, bin, []string{"dev"}, []string{
		"PAL_DATA_DIR=" + dataDir, "PAL_NATS_URL=" + natsURL, "DATABASE_URL=" + pg.DSN(), "PAL_HTTP_ADDR=127.0.0.1:0",
		natsauth.EnvUsers + "=bot:read+start"})
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	require.NoError(t, dev.WaitForOutput(ctx, "PAL dev is running"))
	require.NoError(t, dev.WaitForOutput(ctx, "Press Ctrl-C"))

	for _, f := range []string{natsauth.SeedFile(natsauth.Worker), natsauth.SeedFile(natsauth.Projector), natsauth.SeedFile(natsauth.API),
		natsauth.SeedFile(natsauth.Admin), natsauth.SeedFile(natsauth.Client), natsauth.UserSeedFile("bot")} {
		fi, err := os.Stat(filepath.Join(dataDir, f))
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o600), fi.Mode().Perm(), "%s", f)
	}
	abs, err := filepath.Abs(filepath.Join(dataDir, natsauth.SeedFile(natsauth.Client)))
	require.NoError(t, err)
	require.Contains(t, dev.Output(), "nats context save pal-dev --server "+natsURL+" --nkey '"+abs+"' --select")
	require.Contains(t, dev.Output(), "leave it out and give each nats command --context pal-dev", "how to keep one's own default context")
	envVars, err := os.ReadFile(filepath.Join(dataDir, "dev.env"))
	require.NoError(t, err)
	require.Contains(t, string(envVars), "PAL_NATS_CREDS='"+filepath.Join(filepath.Dir(abs), natsauth.SeedFile(natsauth.Worker))+"'")
	users := regexp.MustCompile(natsauth.EnvUsers + `='?([^'\n]*)`).FindStringSubmatch(string(envVars))
	require.NotNil(t, users, "%s", envVars)
	known, err := natsauth.ParseUsers(users[1])
	require.NoError(t, err)
	bot, ok := known.ByName("bot")
	require.True(t, ok, "%s", users[1])
	require.Equal(t, natsauth.ScopeRead|natsauth.ScopeStart, bot.Scopes)
	require.NotEmpty(t, bot.Nkey, "pal dev's workers beside it know the user's key")
	self, ok := known.ByName(natsauth.DefaultUser)
	require.True(t, ok)
	require.Equal(t, natsauth.ClientScopes, self.Scopes, "pal dev's client user does all but deploy and admin")

	_, err = nats.Connect(natsURL, nats.Timeout(3*time.Second))
	require.ErrorIs(t, err, nats.ErrAuthorization, "an anonymous connection")

	viol := make(chan error, 10)
	creds, err := natsauth.CredsOption(abs)
	require.NoError(t, err)
	nc, err := nats.Connect(natsURL, creds, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { viol <- err }))
	require.NoError(t, err)
	defer nc.Close()
	wf := `{"name":"echo","nodes":[{"id":"start","type":"trigger"},{"id":"t1","type":"tool","data":{"tool":"echo","input":{"i":1}}}],"edges":[{"from":"start","to":"t1"}]}`
	// The client user starts deployed workflows only: it may not deploy
	// (the server refuses the request), and PAL refuses its inline
	// definitions. pal workflow deploy, under dev.env, may.
	require.NoError(t, nc.Publish(eventstore.WorkflowDeploySubject, []byte(wf)))
	require.NoError(t, nc.Flush())
	select {
	case err := <-viol:
		require.ErrorIs(t, err, nats.ErrPermissionViolation)
		require.Contains(t, err.Error(), `"`+eventstore.WorkflowDeploySubject+`"`)
	case <-ctx.Done():
		t.Fatal("no permissions violation for the client's deploy")
	}
	m, err := nc.RequestWithContext(ctx, "pal.api.runs.start", []byte(`{"workflow":`+wf+`,"input":{}}`))
	require.NoError(t, err)
	require.Equal(t, "403", m.Header.Get(micro.ErrorCodeHeader), "%s", m.Data)
	require.Equal(t, "forbidden", decodeJSON[map[string]any](t, string(m.Data))["code"])
	wfFile := filepath.Join(t.TempDir(), "echo.json")
	require.NoError(t, os.WriteFile(wfFile, []byte(wf), 0o644))
	r := runPal(t, bin, []string{"PAL_DATA_DIR=" + dataDir}, "workflow", "deploy", wfFile)
	require.Equal(t, 0, r.code, "%s", r)
	require.Equal(t, "echo@1\n", r.stdout)
	m, err = nc.RequestWithContext(ctx, "pal.api.runs.start", []byte(`{"workflow":"echo","input":{}}`))
	require.NoError(t, err)
	started := decodeJSON[map[string]any](t, string(m.Data))
	id, _ := started["run_id"].(string)
	require.Regexp(t, `^run_`, id, "%s", m.Data)
	require.Eventually(t, func() bool {
		m, err := nc.RequestWithContext(ctx, "pal.api.runs.get", []byte(`{"run_id":"`+id+`"}`))
		return err == nil && strings.Contains(string(m.Data), `"status":"succeeded"`)
	}, 30*time.Second, 50*time.Millisecond)

	require.NoError(t, nc.Publish("pal.events."+id, []byte(`{"forged":true}`)))
	require.NoError(t, nc.Flush())
	select {
	case err := <-viol:
		require.ErrorIs(t, err, nats.ErrPermissionViolation)
		require.Contains(t, err.Error(), `"pal.events.`+id+`"`)
	case <-ctx.Done():
		t.Fatal("no permissions violation for a publish to pal.events")
	}
	r = runPal(t, bin, []string{"PAL_DATA_DIR=" + dataDir}, "run", "events", id, "--json")
	require.Equal(t, 0, r.code, "%s", r)
	require.NotContains(t, r.stdout, "forged")
	require.Contains(t, r.stdout, `"worker_id":"`+natsauth.DefaultUser+`"`, "pal dev's client user started the run")

	// bot starts as itself, and may not cancel.
	botCreds, err := natsauth.CredsOption(filepath.Join(dataDir, natsauth.UserSeedFile("bot")))
	require.NoError(t, err)
	bviol := make(chan error, 10)
	bnc, err := nats.Connect(natsURL, botCreds, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { bviol <- err }))
	require.NoError(t, err)
	defer bnc.Close()
	m, err = bnc.RequestWithContext(ctx, "pal.api.runs.start", []byte(`{"workflow":"echo@1","input":{}}`))
	require.NoError(t, err)
	botRun, _ := decodeJSON[map[string]any](t, string(m.Data))["run_id"].(string)
	require.Regexp(t, `^run_`, botRun, "%s", m.Data)
	r = runPal(t, bin, []string{"PAL_DATA_DIR=" + dataDir}, "run", "events", botRun, "--json")
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stdout, `"worker_id":"bot"`)
	require.NoError(t, bnc.Publish("pal.api.runs.cancel", []byte(`{"run_id":"`+botRun+`","by":"root"}`)))
	require.NoError(t, bnc.Flush())
	select {
	case err := <-bviol:
		require.Contains(t, err.Error(), `"pal.api.runs.cancel"`)
	case <-ctx.Done():
		t.Fatal("bot may cancel")
	}
	require.NotContains(t, dev.Output(), "NATS error", "pal dev's own roles were refused something")
	require.NoError(t, dev.Term())
	require.NoError(t, dev.Wait(ctx))
}

// freePortRun returns the first of n consecutive free loopback ports.
func freePortRun(t *testing.T, n int) int {
	t.Helper()
	for range 50 {
		base := testenv.FreePort(t)
		ok := true
		for i := 1; i < n && ok; i++ {
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", base+i))
			if err != nil {
				ok = false
				continue
			}
			ln.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatalf("no %d consecutive free ports", n)
	return 0
}

// pal dev --cluster 3: three NATS node processes, two worker processes,
// streams with three replicas; a run succeeds, and goes on succeeding
// after kill -9 of a node and of a worker, and pal dev starts the node
// again. Stopping pal dev leaves no child behind.
func TestDevCluster(t *testing.T) {
	t.Parallel()
	bin := testenv.PalBinary(t)
	pg := testenv.Postgres(t)
	dataDir := filepath.Join(t.TempDir(), ".pal")
	base := freePortRun(t, 3)
	dev := testenv.StartProcess(t, bin, []string{"dev", "--cluster", "3"}, []string{
		"PAL_DATA_DIR=" + dataDir, fmt.Sprintf("PAL_NATS_URL=nats://127.0.0.1:%d", base), "DATABASE_URL=" + pg.DSN(),
		"PAL_HTTP_ADDR=127.0.0.1:0", "PAL_LEASE_TTL=1s"})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	require.NoError(t, dev.WaitForOutput(ctx, "Press Ctrl-C"), "%s", dev.Output())
	out := dev.Output()
	pids := func(re string) []int {
		m := regexp.MustCompile(re).FindAllStringSubmatch(out, -1)
		var ids []int
		for _, x := range m {
			n, _ := strconv.Atoi(x[1])
			ids = append(ids, n)
		}
		return ids
	}
	nodes := pids(`node\d pid (\d+)`)
	workers := pids(`-\d pid (\d+)`)
	require.Len(t, nodes, 3, "%s", out)
	require.Len(t, workers, 2, "%s", out)
	env := []string{"PAL_DATA_DIR=" + dataDir}
	wf := filepath.Join(t.TempDir(), "wf.json")
	require.NoError(t, os.WriteFile(wf, []byte(seqWorkflow(2)), 0o644))
	startOK := func(what string) {
		r := runPal(t, bin, env, "run", "start", "--workflow", wf, "--input", `{"text":"cluster"}`, "--wait")
		require.Equal(t, 0, r.code, "%s: %s\n%s", what, r, dev.Output())
	}
	startOK("on the cluster")

	nc, err := nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d,nats://127.0.0.1:%d", base, base+1),
		func() nats.Option {
			o, err := natsauth.CredsOption(filepath.Join(dataDir, natsauth.SeedFile(natsauth.Admin)))
			require.NoError(t, err)
			return o
		}(), natsauth.InboxOption())
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	info, err := js.Stream(ctx, "PAL_EVENTS")
	require.NoError(t, err)
	require.Equal(t, 3, info.CachedInfo().Config.Replicas)

	// A run in flight across the kills: it keeps a step going for ~3 s.
	sleepy := filepath.Join(t.TempDir(), "sleepy.json")
	require.NoError(t, os.WriteFile(sleepy, []byte(`{"name":"sleepy","nodes":[{"id":"start","type":"trigger"},
		{"id":"nap","type":"tool","data":{"tool":"sleep","input":{"ms":3000}}}],"edges":[{"from":"start","to":"nap"}]}`), 0o644))
	r := runPal(t, bin, env, "run", "start", "--workflow", sleepy, "--input", `{}`)
	require.Equal(t, 0, r.code, "%s", r)
	inFlight := strings.TrimSpace(r.stdout)

	require.NoError(t, syscall.Kill(nodes[2], syscall.SIGKILL))
	require.NoError(t, syscall.Kill(workers[0], syscall.SIGKILL))
	require.NoError(t, dev.WaitForOutput(ctx, "NATS node started again"))
	// A killed stream leader is replaced after nats-server's election
	// (4-9 s); one-shot commands in that window may time out, as with
	// any JetStream client, so this retries until the cluster answers.
	var last result
	require.Eventually(t, func() bool {
		last = runPal(t, bin, env, "run", "watch", inFlight)
		return last.code == 0
	}, 90*time.Second, time.Second, "the run in flight did not finish after the kills: %s", &last)
	require.Eventually(t, func() bool {
		last = runPal(t, bin, env, "run", "start", "--workflow", wf, "--input", `{"text":"after"}`, "--wait")
		return last.code == 0
	}, 90*time.Second, time.Second, "no run succeeded after the kills: %s", &last)

	require.NoError(t, dev.Term())
	require.NoError(t, dev.Wait(ctx))
	for _, pid := range append(nodes[:2], workers[1]) {
		require.Eventually(t, func() bool { return syscall.Kill(pid, 0) != nil }, 20*time.Second, 50*time.Millisecond,
			"pid %d outlived pal dev", pid)
	}
}
