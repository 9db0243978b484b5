package workers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/runs"
)

func TestApprovalWaitSurvivesRestartOfEveryProcess(t *testing.T) {
	t.Parallel()
	nproc := testenv.NATSProcess(t)
	nc := nproc.Conn(t)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := ctxFor(t, 3*time.Minute)
	require.NoError(t, eventstore.Setup(ctx, js, eventstore.Config{LeaseTTL: time.Second}))
	store, err := eventstore.Open(ctx, js)
	require.NoError(t, err)
	llm := providertest.NewServer(t)
	bin := testenv.PalBinary(t)
	worker := func(id string) *testenv.Process {
		env := append([]string{"PAL_NATS_URL=" + nproc.URL(), "PAL_WORKER_ID=" + id, "PAL_LEASE_TTL=1s", "PAL_LOG_LEVEL=debug"}, llm.Env()...)
		p := testenv.StartProcess(t, bin, []string{"worker"}, env)
		require.NoError(t, p.WaitForOutput(ctx, "worker ready"), p.Output())
		return p
	}
	pg := testenv.Postgres(t)
	pool := pg.Pool(t)
	projector := func() *testenv.Process {
		p := testenv.StartProcess(t, bin, []string{"projector"}, []string{"PAL_NATS_URL=" + nproc.URL(), "DATABASE_URL=" + pg.DSN()})
		require.NoError(t, p.WaitForOutput(ctx, "projector ready"), p.Output())
		return p
	}
	statusInPG := func(runID string) string {
		var s string
		_ = pool.QueryRow(ctx, "SELECT status FROM runs WHERE run_id = $1", runID).Scan(&s)
		return s
	}
	w1 := worker("w1")
	proj := projector()
	parked, err := runs.New(store).Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: json.RawMessage(approvalWorkflow("")), Input: json.RawMessage(`{"v":"7"}`)})
	require.NoError(t, err)
	// A second run will get its approval before it reaches the step.
	early := event.NewRunID()
	hold := llm.Hold(providertest.ByKey(key(early, "think", 1)))
	earlyWF := `{"name":"early","nodes":[{"id":"start","type":"trigger"},
		{"id":"think","type":"ai-step","data":{"provider":"openai","model":"m","prompt":"think"}},
		{"id":"ok","type":"approval"},{"id":"done","type":"tool","data":{"tool":"echo"}}],
		"edges":[{"from":"start","to":"think"},{"from":"think","to":"ok"},{"from":"ok","to":"done"}]}`
	_, err = runs.New(store).Start(ctx, runs.StartCommand{Rights: runs.AllRights, RunID: early, Workflow: json.RawMessage(earlyWF)})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		v, err := runs.New(store).Get(ctx, parked.RunID)
		return err == nil && v.Status == engine.StatusWaiting
	}, time.Minute, 20*time.Millisecond)
	_, err = hold.Wait(ctx)
	require.NoError(t, err)
	require.NoError(t, runs.New(store).Approve(ctx, runs.ApproveCommand{RunID: early, StepID: "ok", Decision: "approve", Approver: "ana"}))

	require.Eventually(t, func() bool { return statusInPG(parked.RunID) == "waiting" }, time.Minute, 20*time.Millisecond)

	// Kill everything: the worker, the projector, then the NATS server.
	w1.Kill()
	proj.Kill()
	nproc.Kill()
	nproc.Start(t)
	hold.Release()
	worker("w2")
	projector()
	v, err := runs.New(store).Get(ctx, parked.RunID)
	require.NoError(t, err)
	require.Equal(t, engine.StatusWaiting, v.Status, "the wait survived")
	require.NoError(t, runs.New(store).Approve(ctx, runs.ApproveCommand{RunID: parked.RunID, StepID: "ok", Decision: "approve", Approver: "bo"}))
	for _, id := range []string{parked.RunID, early} {
		evs := waitEndOn(t, ctx, store, id)
		require.Equal(t, event.RunSucceeded, evs[len(evs)-1].Kind, id)
	}
	evs, _, err := store.Read(ctx, early)
	require.NoError(t, err)
	require.Len(t, find(evs, event.StepCompleted, "ok"), 1)
	require.Empty(t, find(evs, event.StepWaiting, "ok"), "the early decision was applied when the run arrived")
	require.Eventually(t, func() bool { return statusInPG(parked.RunID) == "succeeded" && statusInPG(early) == "succeeded" },
		time.Minute, 20*time.Millisecond, "the restarted projector catches up")
	testenv.ReadJournal(t, nc)
}

func TestKill9MidLoopResumesAtTheIteration(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	wf := `{"name":"each","nodes":[{"id":"start","type":"trigger"},
		{"id":"each","type":"loop","data":{"over":"{{input.xs}}","body":{"name":"one","nodes":[{"id":"start","type":"trigger"},
			{"id":"ask","type":"ai-step","data":{"provider":"openai","model":"m","prompt":"item {{input.item}}"}}],
			"edges":[{"from":"start","to":"ask"}]}}}],"edges":[{"from":"start","to":"each"}]}`
	runID := event.NewRunID()
	hold := p.LLM.Hold(providertest.ByKey(key(runID, "each[2].ask", 1)))
	w1 := p.palWorker(t, "w1")
	_, err := runs.New(p.Store).Start(context.Background(), runs.StartCommand{Rights: runs.AllRights, RunID: runID, Workflow: json.RawMessage(wf), Input: json.RawMessage(`{"xs":[1,2,3,4,5]}`)})
	require.NoError(t, err)
	_, err = hold.Wait(ctxFor(t, 30*time.Second))
	require.NoError(t, err)
	w1.Kill()
	p.palWorker(t, "w2")
	hold.Release()
	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, runID).Kind)
	want := map[string]int{}
	for i := range 5 {
		want[key(runID, fmt.Sprintf("each[%d].ask", i), 1)] = 1
	}
	want[key(runID, "each[2].ask", 1)] = 2 // the iteration in flight, re-sent with its key
	require.Equal(t, want, p.LLM.Keys(), "earlier iterations ran once")
}

func TestKill9AfterChildCreatedAdoptsIt(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	child := `{"name":"child","nodes":[{"id":"start","type":"trigger"},
		{"id":"think","type":"ai-step","data":{"provider":"openai","model":"m","prompt":"child thinks about {{input.q}}"}}],
		"edges":[{"from":"start","to":"think"}]}`
	runID := event.NewRunID()
	childID := event.ChildRunID(runID, "kid")
	hold := p.LLM.Hold(providertest.ByKey(key(childID, "think", 1)))
	w1 := p.palWorker(t, "w1")
	_, err := runs.New(p.Store).Start(context.Background(), runs.StartCommand{Rights: runs.AllRights, RunID: runID,
		Workflow: json.RawMessage(subagentWorkflow(1, child)), Input: json.RawMessage(`{"q":"x"}`)})
	require.NoError(t, err)
	_, err = hold.Wait(ctxFor(t, 30*time.Second))
	require.NoError(t, err)
	// The child exists and is mid-step; the parent's step is not complete.
	require.Empty(t, find(p.Events(t, runID), event.StepCompleted, "kid"))
	w1.Kill()
	p.palWorker(t, "w2")
	hold.Release()
	final := p.WaitEnd(t, runID)
	require.Equal(t, event.RunSucceeded, final.Kind)
	require.JSONEq(t, `"echo: child thinks about x"`, string(mustField(t, data[event.RunSucceededData](t, final).Output, "text")))

	// Exactly one child run exists: the one named by (parent, step).
	j := testenv.ReadJournal(t, p.NC)
	var children []string
	for id, evs := range j {
		if cd := data[event.RunCreatedData](t, evs[0]); cd.ParentRunID == runID {
			children = append(children, id)
		}
	}
	require.Equal(t, []string{childID}, children)
	require.Len(t, find(j[childID], event.RunCreated, ""), 1)
	require.Len(t, find(j[runID], event.ChildRunCreated, ""), 1)
	require.Equal(t, 2, p.LLM.Keys()[key(childID, "think", 1)])
}

func TestKill9MidAgentTurnResumesAtThatTurn(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	// The model calls the built-in echo tool twice, then answers.
	p.LLM.SetResponder(func(c providertest.Call) providertest.Reply {
		tools := 0
		for _, m := range c.Messages {
			if m.Role == "tool" {
				tools++
			}
		}
		if tools < 2 {
			return providertest.Reply{ToolCalls: []provider.ToolCall{{ID: fmt.Sprintf("call_%d", tools), Name: "echo", Arguments: json.RawMessage(fmt.Sprintf(`{"n":%d}`, tools))}}}
		}
		return providertest.Reply{Text: "done after " + fmt.Sprint(tools) + " tools"}
	})
	wf := `{"name":"agent","nodes":[{"id":"start","type":"trigger"},
		{"id":"ask","type":"agent","data":{"provider":"openai","model":"m","prompt":"go","tools":[{"name":"echo"}]}}],
		"edges":[{"from":"start","to":"ask"}]}`
	runID := event.NewRunID()
	hold := p.LLM.Hold(providertest.ByKey(key(runID, "ask.turn[2]", 1)))
	w1 := p.palWorker(t, "w1")
	_, err := runs.New(p.Store).Start(context.Background(), runs.StartCommand{Rights: runs.AllRights, RunID: runID, Workflow: json.RawMessage(wf)})
	require.NoError(t, err)
	_, err = hold.Wait(ctxFor(t, 30*time.Second))
	require.NoError(t, err)
	w1.Kill()
	p.palWorker(t, "w2")
	hold.Release()
	final := p.WaitEnd(t, runID)
	require.Equal(t, event.RunSucceeded, final.Kind)
	require.JSONEq(t, `{"text":"done after 2 tools","turns":3}`, string(data[event.RunSucceededData](t, final).Output))
	require.Equal(t, map[string]int{
		key(runID, "ask.turn[0]", 1): 1,
		key(runID, "ask.turn[1]", 1): 1,
		key(runID, "ask.turn[2]", 1): 2, // the turn in flight, re-sent with its key
	}, p.LLM.Keys(), "earlier turns were not sent again")
	evs := p.Events(t, runID)
	require.Len(t, find(evs, event.StepCompleted, "ask.turn[0].tool[0]"), 1)
	require.Len(t, find(evs, event.StepCompleted, "ask.turn[1].tool[0]"), 1)
}

func mustField(t *testing.T, raw json.RawMessage, field string) json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(raw, &m))
	return m[field]
}
