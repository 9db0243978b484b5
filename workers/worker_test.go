package workers_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/connector/connectortest"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/runs"
	"github.com/palrun/pal/workers"
	"github.com/palrun/pal/workflow"
)

func TestRunJournalsEveryStep(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"process", "strict"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			var opts []paltest.Option
			if mode == "strict" {
				opts = append(opts, paltest.Strict())
			}
			b := setup(t, opts...)
			b.worker(t, "w1", nil)
			wf := fmt.Sprintf(`{"name":"summarise-and-notify","nodes":[
				{"id":"start","type":"trigger"},
				{"id":"draft","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"Summarise: {{input.text}}"}},
				{"id":"review","type":"ai-step","data":{"provider":"anthropic","model":"claude-sonnet-4-5","system":"You review.","prompt":"Check: {{steps.draft.output.text}}"}},
				{"id":"notify","type":"connector","data":{"kind":"webhook","url":%q,"body":{"summary":"{{steps.review.output.text}}"}}}],
				"edges":[{"from":"start","to":"draft"},{"from":"draft","to":"review"},{"from":"review","to":"notify"}]}`, b.Hook.URL()+"/hook")
			runID := b.Start(t, wf, `{"text":"the journal is the truth"}`)
			final := b.WaitEnd(t, runID)
			require.Equal(t, event.RunSucceeded, final.Kind)

			evs := b.Events(t, runID)
			var kinds []event.Kind
			for _, ev := range evs {
				kinds = append(kinds, ev.Kind)
			}
			require.Equal(t, []event.Kind{event.RunCreated, event.RunResumed,
				event.StepStarted, event.StepCompleted, event.StepStarted, event.StepCompleted,
				event.StepStarted, event.SideEffectClaimed, event.SideEffectDelivered, event.StepCompleted,
				event.RunSucceeded}, kinds)

			// Every provider call carried its step's key, once.
			keys := b.LLM.Keys()
			require.Equal(t, map[string]int{key(runID, "draft", 1): 1, key(runID, "review", 1): 1}, keys)
			calls := b.LLM.CallsWithKey(key(runID, "review", 1))
			require.Len(t, calls, 1)
			require.Equal(t, providertest.Anthropic, calls[0].Provider)
			require.Equal(t, "You review.", calls[0].System)
			require.Equal(t, "Check: echo: Summarise: the journal is the truth", calls[0].LastUser())

			// The webhook got the rendered body and the step's key, once.
			reqs := b.Hook.Requests()
			require.Len(t, reqs, 1)
			require.Equal(t, key(runID, "notify", 1), reqs[0].IdempotencyKey)
			require.Equal(t, runID, reqs[0].RunID)
			require.JSONEq(t, `{"summary":"echo: Check: echo: Summarise: the journal is the truth"}`, string(reqs[0].Body))

			// step_started carries the key; step_completed the output and usage.
			started := find(evs, event.StepStarted, "draft")[0]
			require.Equal(t, key(runID, "draft", 1), data[event.StepStartedData](t, started).IdempotencyKey)
			done := data[event.StepCompletedData](t, find(evs, event.StepCompleted, "draft")[0])
			require.NotNil(t, done.Usage)
			require.Positive(t, done.Usage.TotalTokens)
			require.Equal(t, event.DeliveryDelivered, data[event.StepCompletedData](t, find(evs, event.StepCompleted, "notify")[0]).Delivery)
			require.JSONEq(t, `{"delivery":"delivered","status":200}`, string(data[event.RunSucceededData](t, final).Output))
		})
	}
}

func TestConditionalEdges(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", nil)
	wf := `{"name":"branch","nodes":[
		{"id":"start","type":"trigger"},
		{"id":"check","type":"condition","data":{"expression":"input.score > 5"}},
		{"id":"high","type":"tool","data":{"tool":"echo","input":{"branch":"high"}}},
		{"id":"low","type":"tool","data":{"tool":"echo","input":{"branch":"low"}}},
		{"id":"join","type":"tool","data":{"tool":"echo","input":{"done":true}}}],
		"edges":[{"from":"start","to":"check"},
		{"from":"check","to":"high","condition":"steps.check.output.result"},
		{"from":"check","to":"low","condition":"!steps.check.output.result"},
		{"from":"high","to":"join"},{"from":"low","to":"join"}]}`
	for score, want := range map[int]string{9: "high", 1: "low"} {
		runID := b.Start(t, wf, fmt.Sprintf(`{"score":%d}`, score))
		require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
		evs := b.Events(t, runID)
		other := map[string]string{"high": "low", "low": "high"}[want]
		require.Len(t, find(evs, event.StepCompleted, want), 1, "score %d", score)
		require.Empty(t, find(evs, event.StepStarted, other), "score %d: dead branch ran", score)
		require.Len(t, find(evs, event.StepCompleted, "join"), 1, "join runs after the live branch")
	}
}

func TestRetryJournalsAttemptsAndKeys(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", nil)
	wf := `{"name":"retry","nodes":[{"id":"start","type":"trigger"},
		{"id":"draft","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"hi",
		 "retry":{"maxAttempts":4,"backoffMs":10,"retryableClasses":["llm"]}}}],
		"edges":[{"from":"start","to":"draft"}]}`
	// Two definite failures (HTTP 500): each retry is a new attempt with a
	// new key. Then a dropped connection (outcome unknown): the retry keeps
	// the attempt and the key.
	b.LLM.FailNext(nil, http.StatusInternalServerError, 2)
	var calls atomic.Int32
	b.LLM.SetResponder(func(c providertest.Call) providertest.Reply {
		calls.Add(1)
		return providertest.Reply{Text: "ok"}
	})
	runID := b.Start(t, wf, `{}`)
	_ = runID
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
	evs := b.Events(t, runID)
	retries := find(evs, event.StepRetrying, "draft")
	require.Len(t, retries, 2)
	require.Equal(t, 2, data[event.StepRetryingData](t, retries[0]).Attempt)
	require.Equal(t, 3, data[event.StepRetryingData](t, retries[1]).Attempt)
	require.Equal(t, 4, data[event.StepRetryingData](t, retries[1]).Of)
	require.Equal(t, map[string]int{key(runID, "draft", 1): 1, key(runID, "draft", 2): 1, key(runID, "draft", 3): 1}, b.LLM.Keys())
	done := find(evs, event.StepCompleted, "draft")
	require.Len(t, done, 1)
	require.Equal(t, 3, done[0].Attempt)

	// Unknown outcome: same attempt, same key.
	b.LLM.Reset()
	b.LLM.Drop(nil, 1)
	runID = b.Start(t, wf, `{}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
	evs = b.Events(t, runID)
	retries = find(evs, event.StepRetrying, "draft")
	require.Len(t, retries, 1)
	require.Equal(t, 1, data[event.StepRetryingData](t, retries[0]).Attempt, "an unknown outcome is retried with the same attempt")
	require.Equal(t, map[string]int{key(runID, "draft", 1): 2}, b.LLM.Keys())
}

func TestPermanentFailureFailsRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", nil)
	wf := `{"name":"fails","nodes":[{"id":"start","type":"trigger"},
		{"id":"draft","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"hi",
		 "retry":{"maxAttempts":3,"backoffMs":10,"retryableClasses":["any"]}}},
		{"id":"after","type":"tool","data":{"tool":"echo"}}],
		"edges":[{"from":"start","to":"draft"},{"from":"draft","to":"after"}]}`
	b.LLM.FailNext(nil, http.StatusBadRequest, 1)
	runID := b.Start(t, wf, `{}`)
	final := b.WaitEnd(t, runID)
	require.Equal(t, event.RunFailed, final.Kind)
	fd := data[event.RunFailedData](t, final)
	require.Equal(t, event.CodeStepFailed, fd.Code)
	require.Equal(t, "draft", fd.StepID)
	require.Contains(t, fd.Error, "400")
	evs := b.Events(t, runID)
	require.Empty(t, find(evs, event.StepRetrying, ""), "a 400 is permanent: no retry")
	require.Empty(t, find(evs, event.StepStarted, "after"))
	require.Len(t, b.LLM.Calls(), 1)
}

func TestRedriveOfFinishedRunAppendsNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := b.worker(t, "w1", nil)
	runID := b.Start(t, seqWorkflow(2, "openai"), `{"topic":"x"}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
	before := b.Events(t, runID)
	calls := len(b.LLM.Calls())

	// Directly, and through the queue.
	require.NoError(t, w.Drive(context.Background(), runID))
	require.NoError(t, b.Store.Enqueue(context.Background(), "", runID, "test"))
	require.Eventually(t, func() bool {
		p, err := b.Store.WorkPending(context.Background(), "", runID)
		return err == nil && !p
	}, 10*time.Second, 10*time.Millisecond, "the work message is acked")
	require.Equal(t, before, b.Events(t, runID))
	require.Len(t, b.LLM.Calls(), calls)
}

func TestInvalidStartsWriteNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	cases := []struct {
		name, runID, wf, input, want string
	}{
		{"unknown node type", "", `{"name":"x","nodes":[{"id":"start","type":"trigger"},{"id":"y","type":"teleport"}],"edges":[{"from":"start","to":"y"}]}`, `{}`, `node "y": unknown type "teleport"`},
		{"missing model", "", `{"name":"x","nodes":[{"id":"start","type":"trigger"},{"id":"draft","type":"ai-step","data":{"provider":"openai","prompt":"p"}}],"edges":[{"from":"start","to":"draft"}]}`, `{}`, `node "draft": data.model`},
		{"malformed JSON", "", `{"name":`, `{}`, "invalid JSON"},
		{"bad input", "", seqWorkflow(1, "openai"), `{"topic":`, "not valid JSON"},
		{"dot in run id", "run.x", seqWorkflow(1, "openai"), `{}`, "invalid run id"},
		{"star in run id", "run*", seqWorkflow(1, "openai"), `{}`, "invalid run id"},
		{"gt in run id", "run>", seqWorkflow(1, "openai"), `{}`, "invalid run id"},
		{"space in run id", "run x", seqWorkflow(1, "openai"), `{}`, "invalid run id"},
	}
	for _, tc := range cases {
		_, err := runs.New(b.Store).Start(ctx, runs.StartCommand{Rights: runs.AllRights, RunID: tc.runID, Workflow: json.RawMessage(tc.wf), Input: json.RawMessage(tc.input)})
		require.ErrorContains(t, err, tc.want, tc.name)
	}
	_, err := runs.New(b.Store).Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: json.RawMessage(cases[0].wf)})
	var ve *workflow.ValidationError
	require.ErrorAs(t, err, &ve)

	for _, s := range []string{eventstore.EventsStream, eventstore.WorkStream} {
		st, err := b.JS.Stream(ctx, s)
		require.NoError(t, err)
		require.Zero(t, st.CachedInfo().State.Msgs, "%s must be empty", s)
	}
}

func TestDuplicateStartCreatesOneRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	req := runs.StartCommand{Rights: runs.AllRights, Workflow: json.RawMessage(seqWorkflow(1, "openai")), IdempotencyKey: "order-42"}
	first, err := b.Runs.Start(ctx, req)
	require.NoError(t, err)
	require.True(t, first.Created)
	second, err := b.Runs.Start(ctx, req)
	require.NoError(t, err)
	require.False(t, second.Created)
	require.Equal(t, first.RunID, second.RunID)
	require.Len(t, b.Events(t, first.RunID), 1)

	// A caller-chosen run id is created once; reusing it is an error.
	req = runs.StartCommand{Rights: runs.AllRights, RunID: "my-run", Workflow: json.RawMessage(seqWorkflow(1, "openai"))}
	_, err = b.Runs.Start(ctx, req)
	require.NoError(t, err)
	_, err = b.Runs.Start(ctx, req)
	require.ErrorIs(t, err, eventstore.ErrRunExists)
}

func webhookWorkflow(url string) string {
	return fmt.Sprintf(`{"name":"notify","nodes":[{"id":"start","type":"trigger"},
		{"id":"notify","type":"connector","data":{"kind":"webhook","url":%q,"body":{"n":1}}},
		{"id":"after","type":"tool","data":{"tool":"echo","input":{"ok":true}}}],
		"edges":[{"from":"start","to":"notify"},{"from":"notify","to":"after"}]}`, url)
}

func TestClaimWithoutDeliveryIsNotSentAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	res, err := runs.New(b.Store).Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: json.RawMessage(webhookWorkflow(b.Hook.URL()))})
	require.NoError(t, err)
	runID := res.RunID
	k := key(runID, "notify", 1)
	// A worker claimed the delivery and died before confirming it.
	appendRaw(t, b, runID,
		event.MustNew(event.RunResumed, "", 0, event.RunResumedData{Worker: "crashed-worker", ResumeCount: 1}),
		event.MustNew(event.StepStarted, "notify", 1, event.StepStartedData{NodeID: "notify", NodeType: "connector",
			Input: json.RawMessage(fmt.Sprintf(`{"kind":"webhook","url":%q,"method":"POST","body":{"n":1}}`, b.Hook.URL())), IdempotencyKey: k}),
		event.MustNew(event.SideEffectClaimed, "notify", 1, event.SideEffectClaimedData{IdempotencyKey: k, Connector: "webhook", Target: b.Hook.URL()}),
	)
	b.worker(t, "w2", nil)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
	require.Zero(t, b.Hook.Count(k), "a claimed delivery is never sent again")
	evs := b.Events(t, runID)
	done := find(evs, event.StepCompleted, "notify")
	require.Len(t, done, 1)
	require.Equal(t, event.DeliveryUnconfirmed, data[event.StepCompletedData](t, done[0]).Delivery)
	require.True(t, data[event.RunResumedData](t, find(evs, event.RunResumed, "")[1]).Crashed)
}

func TestDeliveredButNotCompletedIsNotSentAgain(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	res, err := runs.New(b.Store).Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: json.RawMessage(webhookWorkflow(b.Hook.URL()))})
	require.NoError(t, err)
	runID := res.RunID
	k := key(runID, "notify", 1)
	appendRaw(t, b, runID,
		event.MustNew(event.RunResumed, "", 0, event.RunResumedData{Worker: "crashed-worker", ResumeCount: 1}),
		event.MustNew(event.StepStarted, "notify", 1, event.StepStartedData{NodeID: "notify", NodeType: "connector", IdempotencyKey: k,
			Input: json.RawMessage(fmt.Sprintf(`{"kind":"webhook","url":%q,"method":"POST","body":{"n":1}}`, b.Hook.URL()))}),
		event.MustNew(event.SideEffectClaimed, "notify", 1, event.SideEffectClaimedData{IdempotencyKey: k, Connector: "webhook", Target: b.Hook.URL()}),
		event.MustNew(event.SideEffectDelivered, "notify", 1, event.SideEffectDeliveredData{IdempotencyKey: k, Status: 202}),
	)
	b.worker(t, "w2", nil)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
	require.Zero(t, b.Hook.Count(k))
	done := find(b.Events(t, runID), event.StepCompleted, "notify")
	require.Len(t, done, 1)
	sd := data[event.StepCompletedData](t, done[0])
	require.Equal(t, event.DeliveryDelivered, sd.Delivery)
	require.JSONEq(t, `{"delivery":"delivered","status":202}`, string(sd.Output))
}

func TestWebhookRetriesWithReceipts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", nil)
	wf := fmt.Sprintf(`{"name":"notify","nodes":[{"id":"start","type":"trigger"},
		{"id":"notify","type":"connector","data":{"kind":"webhook","url":%q,"body":{"n":1},
		 "retry":{"maxAttempts":3,"backoffMs":5,"retryableClasses":["connector"]}}}],
		"edges":[{"from":"start","to":"notify"}]}`, b.Hook.URL())
	// A 503 (definite: new attempt, new key), then a cut connection
	// (unknown: same attempt, same key, claimed again).
	b.Hook.FailNext(nil, http.StatusServiceUnavailable, 1)
	b.Hook.Drop(func(r connectortest.Request) bool { return r.StepID == "notify" }, 1)
	runID := b.Start(t, wf, `{}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
	evs := b.Events(t, runID)
	retries := find(evs, event.StepRetrying, "notify")
	require.Len(t, retries, 2)
	require.Equal(t, 2, data[event.StepRetryingData](t, retries[0]).Attempt, "a 503 is definite: next attempt")
	require.Equal(t, 2, data[event.StepRetryingData](t, retries[1]).Attempt, "a cut connection is unknown: same attempt")
	require.Equal(t, 1, b.Hook.Count(key(runID, "notify", 1)))
	require.Equal(t, 2, b.Hook.Count(key(runID, "notify", 2)), "the unknown outcome is retried with the same key")
	require.Len(t, find(evs, event.SideEffectClaimed, "notify"), 3, "each try claims before it sends")
	require.Len(t, find(evs, event.SideEffectDelivered, "notify"), 1)
}

func TestCrashLoopFailsRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	res, err := runs.New(b.Store).Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: json.RawMessage(seqWorkflow(1, "openai"))})
	require.NoError(t, err)
	// Five drives in a row died at s1 without completing it; the sixth
	// gives up.
	var evs []event.Event
	for i := 1; i <= 5; i++ {
		evs = append(evs, event.MustNew(event.RunResumed, "", 0, event.RunResumedData{Worker: "w", ResumeCount: i, Crashed: i > 1, CrashesAtStep: i - 1}))
		if i == 1 {
			evs = append(evs, event.MustNew(event.StepStarted, "s1", 1, event.StepStartedData{NodeID: "s1", NodeType: "ai-step",
				IdempotencyKey: key(res.RunID, "s1", 1), Input: json.RawMessage(`{"provider":"openai","model":"m","messages":[{"role":"user","content":"x"}]}`)}))
		}
	}
	appendRaw(t, b, res.RunID, evs...)
	b.worker(t, "w1", nil)
	final := b.WaitEnd(t, res.RunID)
	require.Equal(t, event.RunFailed, final.Kind)
	fd := data[event.RunFailedData](t, final)
	require.Equal(t, event.CodeCrashLoop, fd.Code)
	require.Equal(t, "s1", fd.StepID)
	require.Contains(t, fd.Error, "crashed its workers 5 times")
	require.Empty(t, b.LLM.Calls())
}

func TestToolsAndHTTPTool(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var gotKey atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotKey.Store(r.Header.Get("Idempotency-Key"))
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"path":%q}`, r.URL.Path)
	}))
	t.Cleanup(srv.Close)
	b.worker(t, "w1", map[string]workers.Tool{
		"double": func(ctx context.Context, in json.RawMessage) (json.RawMessage, error) {
			var v struct{ N int }
			if err := json.Unmarshal(in, &v); err != nil {
				return nil, err
			}
			si, ok := workers.StepFromContext(ctx)
			if !ok || si.IdempotencyKey == "" {
				return nil, errors.New("no step info")
			}
			return json.Marshal(map[string]int{"n": v.N * 2})
		},
	})
	wf := fmt.Sprintf(`{"name":"tools","nodes":[{"id":"start","type":"trigger"},
		{"id":"d","type":"tool","data":{"tool":"double","input":{"n":"{{input.n}}"}}},
		{"id":"get","type":"tool","data":{"tool":"http","input":{"url":"%s/items/{{steps.d.output.n}}"}}},
		{"id":"missing","type":"tool","data":{"tool":"nope"}}],
		"edges":[{"from":"start","to":"d"},{"from":"d","to":"get"},{"from":"get","to":"missing"}]}`, srv.URL)
	runID := b.Start(t, wf, `{"n":21}`)
	final := b.WaitEnd(t, runID)
	evs := b.Events(t, runID)
	require.JSONEq(t, `{"n":42}`, string(data[event.StepCompletedData](t, find(evs, event.StepCompleted, "d")[0]).Output))
	var out struct {
		Status int             `json:"status"`
		Body   json.RawMessage `json:"body"`
	}
	require.NoError(t, json.Unmarshal(data[event.StepCompletedData](t, find(evs, event.StepCompleted, "get")[0]).Output, &out))
	require.Equal(t, 200, out.Status)
	require.JSONEq(t, `{"path":"/items/42"}`, string(out.Body))
	require.Equal(t, key(runID, "get", 1), gotKey.Load())
	// An unregistered tool fails the run with a clear error.
	require.Equal(t, event.RunFailed, final.Kind)
	require.Contains(t, data[event.RunFailedData](t, final).Error, `tool "nope" is not registered on worker w1`)
}
