package workers_test

// Tests that break things: real `pal worker` processes killed with kill -9,
// frozen with SIGSTOP, told to stop with SIGTERM, and a NATS server killed
// with kill -9 mid-run.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/connector/connectortest"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/runs"
)

// procBundle is a bundle whose workers are real pal processes.
type procBundle struct {
	*bundle
	natsURL string
	bin     string
	ttl     string
}

func setupProc(t *testing.T, ttl time.Duration) *procBundle {
	t.Helper()
	b := setup(t, paltest.LeaseTTL(ttl))
	return &procBundle{bundle: b, natsURL: b.NATS.URL(), bin: testenv.PalBinary(t), ttl: ttl.String()}
}

// palWorker starts `pal worker` and waits until it is taking work.
func (p *procBundle) palWorker(t *testing.T, id string, env ...string) *testenv.Process {
	t.Helper()
	env = append([]string{
		"PAL_NATS_URL=" + p.natsURL,
		"PAL_WORKER_ID=" + id,
		"PAL_LOG_LEVEL=debug",
		"PAL_EGRESS_ALLOW=127.0.0.0/8", // the receivers listen on loopback
	}, env...)
	if p.ttl != "" {
		env = append(env, "PAL_LEASE_TTL="+p.ttl)
	}
	env = append(env, p.LLM.Env()...)
	proc := testenv.StartProcess(t, p.bin, []string{"worker"}, env)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(t, proc.WaitForOutput(ctx, "worker ready"), "worker %s did not start:\n%s", id, proc.Output())
	return proc
}

// startWithID starts a run under a chosen id, so holds can be keyed on it
// before the run begins.
func (p *procBundle) startWithID(t *testing.T, wf, input string) string {
	t.Helper()
	runID := event.NewRunID()
	res, err := runs.New(p.Store).Start(context.Background(), runs.StartCommand{Rights: runs.AllRights,
		RunID: runID, Workflow: json.RawMessage(wf), Input: json.RawMessage(input), By: "test"})
	require.NoError(t, err)
	return res.RunID
}

// startAs starts a run under the given id.
func (p *procBundle) startAs(t *testing.T, runID, wf, input string) {
	t.Helper()
	_, err := runs.New(p.Store).Start(context.Background(), runs.StartCommand{Rights: runs.AllRights,
		RunID: runID, Workflow: json.RawMessage(wf), Input: json.RawMessage(input), By: "test"})
	require.NoError(t, err)
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func resumesOf(t *testing.T, evs []event.Event) []event.RunResumedData {
	var out []event.RunResumedData
	for _, ev := range find(evs, event.RunResumed, "") {
		out = append(out, data[event.RunResumedData](t, ev))
	}
	return out
}

func TestKill9MidStepResumesOnAnotherWorker(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	runID := event.NewRunID()
	hold := p.LLM.Hold(providertest.ByKey(key(runID, "s3", 1)))
	w1 := p.palWorker(t, "w1")
	_, err := runs.New(p.Store).Start(context.Background(), runs.StartCommand{Rights: runs.AllRights,
		RunID: runID, Workflow: json.RawMessage(seqWorkflow(6, "openai")), Input: json.RawMessage(`{"topic":"crash"}`)})
	require.NoError(t, err)

	_, err = hold.Wait(ctxFor(t, 30*time.Second))
	require.NoError(t, err, "w1 never reached step 3:\n%s", w1.Output())
	w1.Kill() // mid-step: the provider holds step 3's call
	p.palWorker(t, "w2")
	hold.Release()

	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, runID).Kind)
	want := map[string]int{}
	for i := 1; i <= 6; i++ {
		want[key(runID, fmt.Sprintf("s%d", i), 1)] = 1
	}
	want[key(runID, "s3", 1)] = 2 // re-sent once, with the same key
	require.Equal(t, want, p.LLM.Keys())

	evs := p.Events(t, runID)
	rs := resumesOf(t, evs)
	require.Len(t, rs, 2)
	require.Equal(t, "w2", rs[1].Worker)
	require.True(t, rs[1].Crashed)
	for _, s := range []string{"s1", "s2", "s3", "s4", "s5", "s6"} {
		require.Len(t, find(evs, event.StepCompleted, s), 1, s)
	}
	j := testenv.ReadJournal(t, p.NC) // gapless, one terminal, schema-valid
	require.Equal(t, 1, j.Count(runID, event.RunSucceeded, "")+j.Count(runID, event.RunFailed, "")+j.Count(runID, event.RunCancelled, ""))
}

func TestFrozenWorkerAppendsNothingAfterLosingTheRun(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	runID := event.NewRunID()
	hold := p.LLM.Hold(providertest.ByKey(key(runID, "s3", 1)))
	w1 := p.palWorker(t, "w1")
	_, err := runs.New(p.Store).Start(context.Background(), runs.StartCommand{Rights: runs.AllRights,
		RunID: runID, Workflow: json.RawMessage(seqWorkflow(5, "openai")), Input: json.RawMessage(`{"topic":"freeze"}`)})
	require.NoError(t, err)
	_, err = hold.Wait(ctxFor(t, 30*time.Second))
	require.NoError(t, err)

	require.NoError(t, w1.Stop()) // SIGSTOP: frozen past its lease
	p.palWorker(t, "w2")
	hold.Release() // both calls may now complete; w1 is frozen
	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, runID).Kind)
	before := p.Events(t, runID)

	require.NoError(t, w1.Cont())
	require.NoError(t, w1.WaitForOutput(ctxFor(t, 30*time.Second), "drive interrupted"), w1.Output())
	after := p.Events(t, runID)
	require.Equal(t, before, after, "the frozen worker appended after losing the run")
	rs := resumesOf(t, after)
	require.Len(t, rs, 2)
	require.Equal(t, "w2", rs[1].Worker)
	// Nothing from w1 after w2's fencing token.
	seen := false
	for _, ev := range after {
		if ev.Kind == event.RunResumed && ev.WorkerID == "w2" {
			seen = true
		}
		if seen {
			require.NotEqual(t, "w1", ev.WorkerID, "seq %d %s", ev.Seq, ev.Kind)
		}
	}
}

func TestDeliveryCrashBetweenClaimAndDelivery(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	hookHold := p.Hook.Hold(func(r connectortest.Request) bool { return r.StepID == "notify" })
	w1 := p.palWorker(t, "w1")
	runID := p.startWithID(t, webhookWorkflow(p.Hook.URL()), `{}`)
	_, err := hookHold.Wait(ctxFor(t, 30*time.Second))
	require.NoError(t, err)
	w1.Kill() // claimed, POST in flight, no confirmation
	p.palWorker(t, "w2")
	hookHold.Release()

	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, runID).Kind)
	require.Equal(t, 1, p.Hook.Count(key(runID, "notify", 1)), "no second POST")
	require.Len(t, p.Hook.Requests(), 1)
	evs := p.Events(t, runID)
	require.Len(t, find(evs, event.SideEffectClaimed, "notify"), 1)
	require.Empty(t, find(evs, event.SideEffectDelivered, "notify"))
	require.Equal(t, event.DeliveryUnconfirmed, data[event.StepCompletedData](t, find(evs, event.StepCompleted, "notify")[0]).Delivery)
}

func TestDeliveryCrashAfterDelivery(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	wf := fmt.Sprintf(`{"name":"notify-then-think","nodes":[{"id":"start","type":"trigger"},
		{"id":"notify","type":"connector","data":{"kind":"webhook","url":%q,"body":{"n":1}}},
		{"id":"think","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"after the webhook"}}],
		"edges":[{"from":"start","to":"notify"},{"from":"notify","to":"think"}]}`, p.Hook.URL())
	runID := event.NewRunID()
	hold := p.LLM.Hold(providertest.ByKey(key(runID, "think", 1)))
	w1 := p.palWorker(t, "w1")
	_, err := runs.New(p.Store).Start(context.Background(), runs.StartCommand{Rights: runs.AllRights, RunID: runID, Workflow: json.RawMessage(wf)})
	require.NoError(t, err)
	_, err = hold.Wait(ctxFor(t, 30*time.Second))
	require.NoError(t, err)
	w1.Kill() // the webhook was delivered and journaled; the next step is in flight
	p.palWorker(t, "w2")
	hold.Release()

	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, runID).Kind)
	require.Equal(t, 1, p.Hook.Count(key(runID, "notify", 1)), "no second POST")
	evs := p.Events(t, runID)
	require.Len(t, find(evs, event.StepCompleted, "notify"), 1)
	require.Equal(t, event.DeliveryDelivered, data[event.StepCompletedData](t, find(evs, event.StepCompleted, "notify")[0]).Delivery)
}

func TestSIGTERMHandsRunToAnotherWorkerAtOnce(t *testing.T) {
	t.Parallel()
	// A 30 s lease: another worker can only resume quickly if the stopping
	// worker releases the lease and hands the work back.
	p := setupProc(t, 30*time.Second)
	runID := event.NewRunID()
	s2 := key(runID, "s2", 1)
	hold := p.LLM.Hold(providertest.ByKey(s2))
	w1 := p.palWorker(t, "w1")
	_, err := runs.New(p.Store).Start(context.Background(), runs.StartCommand{Rights: runs.AllRights,
		RunID: runID, Workflow: json.RawMessage(seqWorkflow(3, "openai")), Input: json.RawMessage(`{"topic":"term"}`)})
	require.NoError(t, err)
	_, err = hold.Wait(ctxFor(t, 30*time.Second))
	require.NoError(t, err)
	p.palWorker(t, "w2")

	// SIGTERM while w1's call for s2 is still held: w1 cannot finish the
	// step, so the only way forward is the hand-off.
	sent := time.Now()
	require.NoError(t, w1.Term())
	require.NoError(t, w1.Wait(ctxFor(t, 30*time.Second)), "w1 exits cleanly on SIGTERM:\n%s", w1.Output())
	require.Contains(t, w1.Output(), "handed run back")

	// The hold still matches, so w2's re-sent call for s2 arrives here.
	_, err = hold.Wait(ctxFor(t, 30*time.Second))
	require.NoError(t, err, "w2 never re-sent s2")
	require.Less(t, time.Since(sent), 20*time.Second, "w2 resumed without waiting out w1's 30 s lease")
	hold.Release()

	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, runID).Kind)
	require.Equal(t, map[string]int{key(runID, "s1", 1): 1, s2: 2, key(runID, "s3", 1): 1}, p.LLM.Keys())
	rs := resumesOf(t, p.Events(t, runID))
	require.Len(t, rs, 2)
	require.Equal(t, "w1", rs[0].Worker)
	require.Equal(t, "w2", rs[1].Worker)
	require.True(t, rs[1].Crashed, "w1's drive ended without finishing or parking the run")
}

// TestBrokerKill9MidRun kills the NATS server process with kill -9 while
// runs are appending and while one waits on a held LLM call, restarts it,
// and checks that every event acknowledged before the kill is still there
// and every run finishes with a gapless journal.
func TestBrokerKill9MidRun(t *testing.T) {
	t.Parallel()
	brokerKill9MidRun(t, false)
}

// TestBrokerKill9MidRunStrict is TestBrokerKill9MidRun in strict mode: the
// server fsyncs before every ack (sync_interval: always) and the worker
// packs each step boundary into one message and commits the appends of its
// runs in atomic batches (eventstore's group commit; 12 runs append at
// once, and the worker's metrics must show committed groups). No event the
// server had stored before the kill is lost or changed, and every run ends
// once.
func TestBrokerKill9MidRunStrict(t *testing.T) {
	t.Parallel()
	brokerKill9MidRun(t, true)
}

// brokerKill9MidRun kills -9 the NATS server while five runs are in
// flight (one parked on an LLM call) and restarts it.
func brokerKill9MidRun(t *testing.T, strict bool) {
	var opts []testenv.NATSOption
	durability := "process"
	if strict {
		opts, durability = append(opts, testenv.Strict()), "strict"
	}
	nproc := testenv.NATSProcess(t, opts...)
	nc := nproc.Conn(t)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := ctxFor(t, 3*time.Minute)
	require.NoError(t, eventstore.Setup(ctx, js, eventstore.Config{LeaseTTL: time.Second}))
	store, err := eventstore.Open(ctx, js)
	require.NoError(t, err)
	llm := providertest.NewServer(t)
	// The journal is checked below, not on cleanup: restarting the server
	// registers a cleanup that stops it before a cleanup check would run.

	env := append([]string{"PAL_NATS_URL=" + nproc.URL(), "PAL_WORKER_ID=w1", "PAL_LEASE_TTL=1s", "PAL_LOG_LEVEL=debug",
		"PAL_DURABILITY=" + durability, "PAL_METRICS_ADDR=127.0.0.1:0"}, llm.Env()...)
	w := testenv.StartProcess(t, testenv.PalBinary(t), []string{"worker"}, env)
	require.NoError(t, w.WaitForOutput(ctx, "worker ready"))
	metrics := metricsURL.FindString(w.Output())
	require.NotEmpty(t, metrics, "the worker logged no metrics address:\n%s", w.Output())
	nfast := 4
	if strict {
		nfast = 12
	}

	// Run A parks on a held LLM call at s4; the others append 150 tool
	// steps each as fast as they can.
	heldID := event.NewRunID()
	hold := llm.Hold(providertest.ByKey(key(heldID, "s4", 1)))
	wfA := strings.Replace(seqWorkflow(6, "openai"), `"name":"seq-6"`, `"name":"held"`, 1)
	_, err = runs.New(store).Start(ctx, runs.StartCommand{Rights: runs.AllRights, RunID: heldID, Workflow: json.RawMessage(wfA), Input: json.RawMessage(`{"topic":"broker"}`)})
	require.NoError(t, err)
	var fast []string
	for range nfast {
		res, err := runs.New(store).Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: json.RawMessage(echoChain(150))})
		require.NoError(t, err)
		fast = append(fast, res.RunID)
	}
	_, err = hold.Wait(ctx)
	require.NoError(t, err)

	// Observe stored events through an ordered consumer: what it delivers
	// was acknowledged by the server.
	seen := observe(t, ctx, js, 200)
	nproc.Kill()
	nproc.Start(t)
	hold.Release()

	for _, id := range append(fast, heldID) {
		evs := waitEndOn(t, ctx, store, id)
		require.Equal(t, event.RunSucceeded, evs[len(evs)-1].Kind, "run %s", id)
	}
	j := testenv.ReadJournal(t, nc)
	for _, ev := range seen {
		got := j[ev.RunID]
		require.GreaterOrEqual(t, len(got), int(ev.Seq), "run %s lost seq %d", ev.RunID, ev.Seq)
		require.Equal(t, ev, got[ev.Seq-1], "run %s seq %d changed", ev.RunID, ev.Seq)
	}
	require.Equal(t, map[string]int{key(heldID, "s1", 1): 1, key(heldID, "s2", 1): 1, key(heldID, "s3", 1): 1,
		key(heldID, "s4", 1): llm.Keys()[key(heldID, "s4", 1)], key(heldID, "s5", 1): 1, key(heldID, "s6", 1): 1}, llm.Keys())
	require.LessOrEqual(t, llm.Keys()[key(heldID, "s4", 1)], 2)
	m := testenv.Scrape(t, metrics, nil)
	committed, _ := m.Value("pal_append_groups_total", "result=committed")
	grouped, _ := m.Value("pal_append_grouped_total")
	t.Logf("%s: %v groups committed, holding %v appends", durability, committed, grouped)
	if strict {
		require.Positive(t, committed, "strict mode committed no group")
		require.GreaterOrEqual(t, grouped, 4*committed)
	} else {
		require.Zero(t, committed, "process mode publishes each event alone")
	}
}

// observe reads stored events of all runs until it has seen at least n.
func observe(t testing.TB, ctx context.Context, js jetstream.JetStream, n int) []event.Event {
	t.Helper()
	cons, err := js.OrderedConsumer(ctx, eventstore.EventsStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{eventstore.EventsPrefix + "*"}})
	require.NoError(t, err)
	it, err := cons.Messages()
	require.NoError(t, err)
	defer it.Stop()
	var seen []event.Event
	for len(seen) < n {
		m, err := it.Next()
		require.NoError(t, err)
		evs, err := event.Decode(m.Data())
		require.NoError(t, err)
		seen = append(seen, evs...)
	}
	return seen
}

// waitEndOn waits for a run's terminal event, tolerating a restarting
// server, and returns the journal.
func waitEndOn(t testing.TB, ctx context.Context, store *eventstore.Store, runID string) []event.Event {
	t.Helper()
	for {
		evs, _, err := store.Read(ctx, runID)
		if err == nil && evs[len(evs)-1].Kind.Terminal() {
			return evs
		}
		select {
		case <-ctx.Done():
			t.Fatalf("run %s did not end: %v", runID, err)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
