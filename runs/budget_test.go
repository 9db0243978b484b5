package runs_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/runs"
	"github.com/palrun/pal/workflow"
)

// A durable pal.cmd.runs.budget raises a paused run's budget, and the run
// goes on; the bounds of the command are checked before anything is
// written.
func TestBudgetCommandRaisesAPausedRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(echoChain(3)), &m))
	m["policy"] = json.RawMessage(`{"budget":{"maxSteps":3,"onExceed":"pause"}}`)
	wf, err := json.Marshal(m)
	require.NoError(t, err)

	_, err = b.Runs.Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: wf, Budget: &workflow.Budget{MaxSteps: 4}})
	var ie *runs.InputError
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "budget", ie.Field)
	_, err = b.Runs.Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: wf, Budget: &workflow.Budget{WarnAt: 2}})
	require.ErrorAs(t, err, &ie)
	require.Equal(t, "budget.warnAt", ie.Field)

	res, err := b.Runs.Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: wf, Budget: &workflow.Budget{MaxSteps: 2}})
	require.NoError(t, err)
	runID := res.RunID
	created := data[event.RunCreatedData](t, b.Events(t, runID)[0])
	require.Equal(t, &event.Budget{MaxSteps: 2, OnExceed: event.OnExceedPause}, created.Budget)
	require.Equal(t, engine.DefaultAnomalies, created.Anomalies)

	b.worker(t, "w1", nil)
	b.WaitFor(t, runID, "the budget wait", func(ev event.Event) bool { return ev.Kind == event.StepWaiting })
	for _, bad := range []runs.BudgetCommand{
		{RunID: runID},
		{RunID: runID, AddSteps: -1},
		{RunID: runID, AddUSD: 1}, // the run has no cost limit
		{RunID: "a.b", AddSteps: 1},
	} {
		require.ErrorAs(t, b.Runs.RaiseBudget(ctx, bad), &ie, "%+v", bad)
	}
	require.ErrorIs(t, b.Runs.RaiseBudget(ctx, runs.BudgetCommand{RunID: "run_nope", AddSteps: 1}), eventstore.ErrRunNotFound)
	require.Empty(t, find(b.Events(t, runID), event.BudgetRaised, ""), "nothing written")

	b.commands(t)
	_, err = b.JS.Publish(ctx, "pal.cmd.runs.budget", []byte(`{"run_id":"`+runID+`","add_steps":1,"by":"ops"}`))
	require.NoError(t, err)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
	raised := find(b.Events(t, runID), event.BudgetRaised, "")
	require.Len(t, raised, 1)
	require.Equal(t, "ops", raised[0].WorkerID)
	v, err := b.Runs.Get(ctx, runID)
	require.NoError(t, err)
	require.Equal(t, int64(3), v.Budget.MaxSteps)
	require.Equal(t, int64(3), v.Spent.Steps)
	require.ErrorIs(t, b.Runs.RaiseBudget(ctx, runs.BudgetCommand{RunID: runID, AddSteps: 1}), runs.ErrRunFinished)
}

// TestStartJournalsPrices: a start journals the prices of the models its
// workflow names, from the client's price table (the process's when none
// is given), and says so when it names none with a price.
func TestStartJournalsPrices(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	wf := `{"name":"priced","nodes":[{"id":"start","type":"trigger"},
		{"id":"a","type":"ai-step","data":{"provider":"openai","model":"GPT-4o-mini","prompt":"x"}},
		{"id":"b","type":"ai-step","data":{"provider":"openai","model":"house-model","prompt":"y"}}],
		"edges":[{"from":"start","to":"a"},{"from":"a","to":"b"}]}`
	house := event.Price{InputPerMTok: 100, OutputPerMTok: 1000}
	mini := event.Price{InputPerMTok: 0.15, OutputPerMTok: 0.6, CacheReadPerMTok: 0.075}
	for _, tt := range []struct {
		client *runs.Client
		want   event.Prices
	}{
		{b.Runs, event.Prices{"gpt-4o-mini": mini}}, // the embedded table knows no house-model
		{runs.New(b.Store, runs.WithPrices(event.Prices{"house-model": house, "gpt-4o-mini": mini, "gpt-4o": mini})),
			event.Prices{"gpt-4o-mini": mini, "house-model": house}},
	} {
		res, err := tt.client.Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: json.RawMessage(wf)})
		require.NoError(t, err)
		require.Equal(t, tt.want, data[event.RunCreatedData](t, b.Events(t, res.RunID)[0]).Prices)
	}
	res, err := b.Runs.Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: json.RawMessage(echoChain(1))})
	require.NoError(t, err)
	prices := data[event.RunCreatedData](t, b.Events(t, res.RunID)[0]).Prices
	require.NotNil(t, prices, "journaled, empty: no model to price")
	require.Empty(t, prices)
}
