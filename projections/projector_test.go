package projections_test

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/connector/connectortest"
	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/projections"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/readmodel"
)

// workload starts runs of every shape the workers produce, plus hand-made
// journals for states no workflow reaches yet (waiting, cancelled, a
// delivery in flight), and returns the ids of the runs that end.
func workload(t *testing.T, b *bundle) (ending []string) {
	t.Helper()
	// Two definite LLM failures on "retry": attempts 1 and 2 are retried,
	// attempt 3 completes. A 400 on "fails": the run fails.
	b.LLM.FailNext(func(c providertest.Call) bool { return c.LastUser() == "retry me" }, http.StatusInternalServerError, 2)
	b.LLM.FailNext(func(c providertest.Call) bool { return c.LastUser() == "fail me" }, http.StatusBadRequest, 1)
	// The webhook answers 503 once: its first attempt's receipt ends
	// unconfirmed, the second is delivered.
	b.Hook.FailNext(func(r connectortest.Request) bool { return r.StepID == "notify" }, http.StatusServiceUnavailable, 1)

	ending = append(ending,
		b.Start(t, seqWorkflow(3, "openai"), `{"topic":"projections"}`),
		b.Start(t, seqWorkflow(2, "anthropic"), `{"topic":"fold"}`),
		b.Start(t, webhookWorkflow(b.Hook.URL()), `{"n":1}`),
		b.Start(t, `{"name":"retry","nodes":[{"id":"start","type":"trigger"},
			{"id":"draft","type":"ai-step","data":{"provider":"openai","model":"m","prompt":"retry me",
			 "retry":{"maxAttempts":4,"backoffMs":10,"retryableClasses":["llm"]}}}],
			"edges":[{"from":"start","to":"draft"}]}`, `{}`),
		b.Start(t, `{"name":"fails","nodes":[{"id":"start","type":"trigger"},
			{"id":"draft","type":"ai-step","data":{"provider":"openai","model":"m","prompt":"fail me"}},
			{"id":"after","type":"tool","data":{"tool":"echo"}}],
			"edges":[{"from":"start","to":"draft"},{"from":"draft","to":"after"}]}`, `{}`),
		b.Start(t, echoChain(20), `{"v":"x"}`),
	)

	// Hand-made journals.
	ts := time.Now().UTC()
	created := ev(event.RunCreated, "", 0, event.RunCreatedData{WorkflowName: "manual", Input: json.RawMessage(`{"a":1}`),
		ParentRunID: "run_parent", ParentStepID: "sub", Depth: 1})
	created.TS = ts
	key := func(run, step string, attempt int) string { return event.IdempotencyKey(run, step, attempt) }

	waiting := event.NewRunID()
	b.AppendRaw(t, waiting, created,
		ev(event.RunResumed, "", 0, event.RunResumedData{Worker: "w9", ResumeCount: 1}),
		ev(event.StepStarted, "ask", 1, event.StepStartedData{NodeID: "ask", NodeType: "approval", IdempotencyKey: key(waiting, "ask", 1)}),
		ev(event.StepWaiting, "ask", 1, event.StepWaitingData{Reason: event.WaitApproval}))

	inFlight := event.NewRunID()
	b.AppendRaw(t, inFlight, created,
		ev(event.RunResumed, "", 0, event.RunResumedData{Worker: "w9", ResumeCount: 1}),
		ev(event.StepStarted, "mail", 1, event.StepStartedData{NodeID: "mail", NodeType: "connector", IdempotencyKey: key(inFlight, "mail", 1)}),
		ev(event.SideEffectClaimed, "mail", 1, event.SideEffectClaimedData{IdempotencyKey: key(inFlight, "mail", 1), Connector: "email", Target: "ops@example.test"}))

	cancelled := event.NewRunID()
	b.AppendRaw(t, cancelled, created,
		ev(event.RunResumed, "", 0, event.RunResumedData{Worker: "w9", ResumeCount: 1}),
		ev(event.AnomalyDetected, "", 0, event.AnomalyDetectedData{Type: event.AnomalyCostSpike, Observed: 2, Threshold: 1, Action: event.ActionRecord, StepID: "draft"}),
		ev(event.RunCancelled, "", 0, event.RunCancelledData{Reason: "operator", By: "ops"}))

	queued := event.NewRunID()
	b.AppendRaw(t, queued, created)
	return ending
}

func TestProjectorEndToEnd(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"process", "strict"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			var opts []bundleOpt
			if mode == "strict" {
				opts = append(opts, strictMode()) // packed messages
			}
			b := setup(t, opts...)
			p := b.projector(t, projections.Config{})
			b.worker(t, "w1")
			runs := workload(t, b)
			final := map[string]event.Kind{}
			for _, id := range runs {
				final[id] = b.WaitEnd(t, id).Kind
			}
			caughtUp(t, p)
			j := requireProjectionMatchesStream(t, b.pool, b.NC)
			requireRowsMatchFold(t, b.pool, j)

			// Spot checks on top of the fold comparison.
			q := projections.NewReader(b.pool)
			ctx := context.Background()
			statuses := map[engine.Status]int{}
			all, err := q.ListRuns(ctx, projections.RunFilter{Limit: 100})
			require.NoError(t, err)
			for _, r := range all {
				statuses[r.Status]++
			}
			require.Equal(t, map[engine.Status]int{engine.StatusSucceeded: 5, engine.StatusFailed: 1,
				engine.StatusWaiting: 1, engine.StatusRunning: 1, engine.StatusCancelled: 1, engine.StatusQueued: 1}, statuses)
			d, err := q.GetRun(ctx, runs[3]) // retry
			require.NoError(t, err)
			require.Len(t, d.Steps, 3)
			for i, want := range []engine.StepStatus{engine.StepRetried, engine.StepRetried, engine.StepCompleted} {
				require.Equal(t, i+1, d.Steps[i].Attempt)
				require.Equal(t, want, d.Steps[i].Status)
				require.Equal(t, event.IdempotencyKey(runs[3], "draft", i+1), d.Steps[i].IdempotencyKey)
			}
			var receipts []string
			rows, err := b.pool.Query(ctx, "SELECT status FROM side_effect_receipts WHERE run_id = $1 ORDER BY attempt", runs[2])
			require.NoError(t, err)
			for rows.Next() {
				var s string
				require.NoError(t, rows.Scan(&s))
				receipts = append(receipts, s)
			}
			require.NoError(t, rows.Err())
			// The receiver answered 503 to the first attempt: that delivery
			// definitely failed; the second was delivered.
			require.Equal(t, []string{readmodel.ReceiptFailed, readmodel.ReceiptDelivered}, receipts)
			require.Zero(t, p.Stats().FoldErrors)
			require.Equal(t, event.RunFailed, final[runs[4]])
		})
	}
}
