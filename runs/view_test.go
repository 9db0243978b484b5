package runs_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/internal/sandbox"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/projections"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/runs"
	"github.com/palrun/pal/workers"
)

// TestRunViewIsTheSameFromJournalAndPostgres renders runs in every state
// the read model distinguishes from both sources and requires identical
// JSON: a run in retry backoff, a waiting approval, an approval that
// waited and went on, and a plain finished run.
func TestRunViewIsTheSameFromJournalAndPostgres(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	pool := testenv.Postgres(t).Pool(t)
	_, err := projections.Migrate(ctx, pool)
	require.NoError(t, err)
	p := projections.New(pool, b.Store, projections.Config{Logger: paltest.Logger(t)})
	require.NoError(t, p.Start(ctx))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, p.Stop(ctx))
	})
	reader := projections.NewReader(pool)
	bigValue := strings.Repeat("v", 2*eventstore.DefaultBlobThreshold)
	// The process step below imports the Python SDK, which its sandbox
	// sees where it is.
	sdkPath, err := filepath.Abs(filepath.Join("..", "sdk", "python"))
	require.NoError(t, err)
	sb, err := sandbox.New(sandbox.Config{Mounts: []sandbox.Mount{{Host: sdkPath}}})
	require.NoError(t, err)
	b.Worker(t, "w1", paltest.Sandbox(sb), paltest.Tools(map[string]workers.Tool{"big": func(context.Context, json.RawMessage) (json.RawMessage, error) {
		return json.Marshal(map[string]any{"z": 1, "big": bigValue, "a": []int{2, 1}})
	}}))

	// In retry backoff: the first call fails, the retry waits a minute.
	b.LLM.FailNext(func(c providertest.Call) bool { return strings.Contains(c.LastUser(), "flaky") }, 500, 1)
	retrying := b.Start(t, `{"name":"retry","nodes":[{"id":"start","type":"trigger"},
		{"id":"draft","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"flaky {{input.topic}}",
		 "retry":{"maxAttempts":3,"backoffMs":60000,"retryableClasses":["llm"]}}}],
		"edges":[{"from":"start","to":"draft"}]}`, `{"topic":"t","z":{"b":1,"a":2}}`)
	b.WaitFor(t, retrying, "the retry", func(ev event.Event) bool { return ev.Kind == event.StepRetrying })

	approval := `{"name":"ship","nodes":[{"id":"start","type":"trigger"},
		{"id":"draft","type":"tool","data":{"tool":"echo","input":{"v":"{{input.v}}","a":[1,2]}}},
		{"id":"ok","type":"approval","data":{"prompt":"Ship {{steps.draft.output.v}}?","approvers":["ana"]}},
		{"id":"ship","type":"tool","data":{"tool":"echo","input":{"shipped":"{{steps.draft.output.v}}"}}}],
		"edges":[{"from":"start","to":"draft"},{"from":"draft","to":"ok"},{"from":"ok","to":"ship"}]}`
	waiting := b.Start(t, approval, `{"v":"7"}`)
	b.WaitFor(t, waiting, "the wait", func(ev event.Event) bool { return ev.Kind == event.StepWaiting })

	decided := b.Start(t, approval, `{"v":"8"}`)
	b.WaitFor(t, decided, "the wait", func(ev event.Event) bool { return ev.Kind == event.StepWaiting })
	require.NoError(t, b.Runs.Approve(ctx, runs.ApproveCommand{RunID: decided, StepID: "ok", Decision: "approve", Approver: "ana"}))
	b.WaitEnd(t, decided)

	plain := b.Start(t, seqWorkflow(2, "anthropic"), `{"topic":"plain"}`)
	b.WaitEnd(t, plain)
	// A fork of it from its second step: s1 is copied, s2 runs again.
	fork, err := b.Runs.Fork(ctx, runs.ForkCommand{RunID: plain, From: "s2", By: "ana"})
	require.NoError(t, err)
	forked := fork.RunID
	b.WaitEnd(t, forked)

	// A process step whose child reported sub-steps (the Python SDK).
	script, err := json.Marshal([]string{"python3", "-c", `import palsdk
palsdk.step("one", lambda: {"z": 1, "a": [1, 2]})
palsdk.step("two", lambda: "done")
print("{}")`})
	require.NoError(t, err)
	processed := b.Start(t, `{"name":"proc","nodes":[{"id":"start","type":"trigger"},
		{"id":"work","type":"process","data":{"command":`+string(script)+`,"env":{"PYTHONPATH":"`+sdkPath+`"}}}],
		"edges":[{"from":"start","to":"work"}]}`, `{}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, processed).Kind)
	// Paused on its budget: one of two steps allowed.
	paused := b.Start(t, `{"name":"capped","nodes":[{"id":"start","type":"trigger"},
		{"id":"a","type":"tool","data":{"tool":"echo"}},{"id":"b","type":"tool","data":{"tool":"echo"}}],
		"edges":[{"from":"start","to":"a"},{"from":"a","to":"b"}],
		"policy":{"budget":{"maxSteps":1,"maxCostUsd":0.25,"onExceed":"pause"}}}`, `{}`)
	b.WaitFor(t, paused, "the budget wait", func(ev event.Event) bool { return ev.Kind == event.StepWaiting })

	// Big values (PAL_BLOBS): big's output, echo's input made from it
	// and echo's output, which is also the run's.
	big := b.Start(t, `{"name":"big","nodes":[{"id":"start","type":"trigger"},
		{"id":"big","type":"tool","data":{"tool":"big"}},
		{"id":"echo","type":"tool","data":{"tool":"echo","input":{"got":"{{steps.big.output}}"}}}],
		"edges":[{"from":"start","to":"big"},{"from":"big","to":"echo"}]}`, `{}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, big).Kind)

	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	require.NoError(t, p.WaitCaughtUp(ctx))

	views := map[string]*runs.RunView{}
	for _, id := range []string{retrying, waiting, decided, plain, forked, processed, paused, big} {
		fromJournal, err := b.Runs.Get(ctx, id)
		require.NoError(t, err)
		d, err := reader.GetRun(ctx, id)
		require.NoError(t, err)
		fromPG := runs.ViewOfDetail(d)
		j, err := json.MarshalIndent(fromJournal, "", "  ")
		require.NoError(t, err)
		pg, err := json.MarshalIndent(fromPG, "", "  ")
		require.NoError(t, err)
		require.JSONEq(t, string(j), string(pg))
		require.Equal(t, string(j), string(pg), "byte for byte")
		views[id] = fromJournal
	}

	bv := views[big]
	require.Len(t, bv.Steps, 2)
	wantBig := `{"a":[2,1],"big":"` + bigValue + `","z":1}`
	require.True(t, wantBig == string(bv.Steps[0].Output), "big's output: %.100s", bv.Steps[0].Output)
	require.True(t, strings.Contains(string(bv.Steps[1].Input), `{"got":`+wantBig+`}`), "echo's input: %.100s", bv.Steps[1].Input)
	require.True(t, strings.Contains(string(bv.Output), bigValue), "the run's output: %.100s", bv.Output)
	refs := 0
	for _, ev := range testenv.ReadJournal(t, b.NC)[big] {
		if _, ok, _ := event.BlobOf(ev); ok {
			refs++
		}
	}
	require.Equal(t, 4, refs, "big's output, echo's input and output, and the run's output are blobs")

	fv := views[forked]
	require.Equal(t, &runs.ForkPoint{RunID: plain, StepID: "s2", Seq: fork.ForkedFrom.Seq}, fv.ForkedFrom)
	require.Positive(t, fv.ForkedFrom.Seq)
	require.Len(t, fv.Steps, 2)
	require.NotNil(t, fv.Steps[0].CopiedFrom, "s1 is copied")
	require.Equal(t, plain, fv.Steps[0].CopiedFrom.RunID)
	require.Equal(t, views[plain].Steps[0].Output, fv.Steps[0].Output)
	require.Nil(t, fv.Steps[1].CopiedFrom, "s2 ran")
	require.Nil(t, views[plain].ForkedFrom)

	pv := views[paused]
	require.Equal(t, engine.StatusWaiting, pv.Status)
	require.Equal(t, event.WaitBudget, pv.PausedOn)
	require.Equal(t, &event.Budget{MaxSteps: 1, MaxCostUSD: 0.25, OnExceed: event.OnExceedPause}, pv.Budget)
	require.Equal(t, int64(1), pv.Spent.Steps)

	r := views[retrying]
	require.Equal(t, engine.StatusRunning, r.Status)
	require.Len(t, r.Steps, 1)
	require.Equal(t, engine.StepRetrying, r.Steps[0].Status)
	require.Equal(t, 1, r.Steps[0].Attempts)
	require.Equal(t, `{"topic":"t","z":{"a":2,"b":1}}`, string(r.Input), "keys sorted the same from both sources")

	w := views[waiting]
	require.Equal(t, engine.StatusWaiting, w.Status)
	require.Equal(t, engine.StepWaiting, w.Steps[1].Status)
	require.NotEmpty(t, w.Steps[1].WaitingSince)
	require.Empty(t, w.Steps[1].EndedAt)

	d := views[decided]
	require.Equal(t, engine.StatusSucceeded, d.Status)
	ok := d.Steps[1]
	require.Equal(t, "ok", ok.StepID)
	require.Equal(t, engine.StepCompleted, ok.Status)
	waitedAt := find(b.Events(t, decided), event.StepWaiting, "ok")[0].TS
	doneAt := find(b.Events(t, decided), event.StepCompleted, "ok")[0].TS
	require.Equal(t, doneAt.Truncate(time.Microsecond).Sub(waitedAt.Truncate(time.Microsecond)).Milliseconds(), ok.WaitMs,
		"the approval's wait is its real duration")
	require.GreaterOrEqual(t, ok.DurationMs, ok.WaitMs)
	for i := 1; i < len(d.Steps); i++ {
		require.LessOrEqual(t, d.Steps[i-1].StartedAt, d.Steps[i].StartedAt, "steps in journal order")
	}

	pl := views[plain]
	require.Equal(t, []string{"s1", "s2"}, []string{pl.Steps[0].StepID, pl.Steps[1].StepID})
	require.NotNil(t, pl.Steps[0].Usage)
	require.Positive(t, pl.Steps[0].Usage.TotalTokens)
	require.Equal(t, event.IdempotencyKey(plain, "s1", 1), pl.Steps[0].Key)

	pr := views[processed]
	require.Len(t, pr.Steps, 1)
	require.Equal(t, []runs.SubstepView{
		{Name: "one", Status: engine.StepCompleted, Output: json.RawMessage(`{"a":[1,2],"z":1}`)},
		{Name: "two", Status: engine.StepCompleted, Output: json.RawMessage(`"done"`)},
	}, pr.Steps[0].Substeps)
}
