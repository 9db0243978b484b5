package workers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/workers"
)

// TestFakeBlockScriptsAnAgent: an agent node's fake block reaches the
// fake provider through the real adapters (DevFake, as pal dev's worker
// has them), and the fake answers from it rather than as ToolUser would:
// the first request fails with the scripted 429 and is retried (a
// journaled step_retrying), turn 0
// calls the one tool the script names with its arguments (a journaled
// tool step), turn 1 gives the scripted answer. The block is not in the
// steps' journaled input.
func TestFakeBlockScriptsAnAgent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.LLM.SetResponder(providertest.ToolUser) // as pal dev's fake
	var other atomic.Int32
	b.worker(t, "w1", map[string]workers.Tool{"other": func(context.Context, json.RawMessage) (json.RawMessage, error) {
		other.Add(1)
		return json.RawMessage(`{}`), nil
	}})
	for _, prov := range []string{"openai", "anthropic"} {
		wf := fmt.Sprintf(`{"name":"fake-agent","nodes":[{"id":"start","type":"trigger"},
			{"id":"ask","type":"agent","data":{"provider":%q,"model":"m","prompt":"{{input.question}}",
			 "retry":{"maxAttempts":3,"backoffMs":10,"retryableClasses":["llm"]},
			 "tools":[{"name":"echo","parameters":{"type":"object","properties":{"text":{"type":"string"}}}},
			          {"name":"other","parameters":{"type":"object"}}],
			 "fake":{"turns":[{"toolCalls":[{"name":"echo","arguments":{"text":"2+2"}}]},{"text":"It is 4."}],
			         "fail":{"status":429,"times":1}}}}],
			"edges":[{"from":"start","to":"ask"}]}`, prov)
		runID := b.Start(t, wf, `{"question":"What is 2+2?"}`)
		final := b.WaitEnd(t, runID)
		require.Equal(t, event.RunSucceeded, final.Kind, "%s: %s", prov, final.Data)
		require.JSONEq(t, `{"text":"It is 4.","turns":2}`, string(data[event.RunSucceededData](t, final).Output), prov)

		evs := b.Events(t, runID)
		retried := find(evs, event.StepRetrying, "ask.turn[0]")
		require.Len(t, retried, 1, prov)
		r := data[event.StepRetryingData](t, retried[0])
		require.Contains(t, r.Error, "HTTP 429", prov)
		require.Equal(t, 1, r.Attempt, "%s: rate-limited, so the retry keeps the attempt and its key", prov)
		tool := find(evs, event.StepCompleted, "ask.turn[0].tool[0]")
		require.Len(t, tool, 1, prov)
		require.JSONEq(t, `{"text":"2+2"}`, string(data[event.StepCompletedData](t, tool[0]).Output), prov)
		started := find(evs, event.StepStarted, "ask.turn[0].tool[0]")
		require.Len(t, started, 1, prov)
		require.Contains(t, string(data[event.StepStartedData](t, started[0]).Input), `"2+2"`, prov)
		for _, ev := range find(evs, event.StepStarted, "") {
			require.NotContains(t, string(data[event.StepStartedData](t, ev).Input), "fake", "%s %s", prov, ev.StepID)
		}

		var turns []string
		for _, c := range b.LLM.Calls() {
			if c.Header.Get(provider.FakeStepHeader) == runID+"/ask" {
				turns = append(turns, c.Header.Get(provider.FakeTurnHeader))
				require.NotNil(t, c.Fake, prov)
			}
		}
		require.Equal(t, []string{"0", "0", "1"}, turns, "%s: the failure, turn 0 and turn 1, counted under the agent's step", prov)
	}
	require.Zero(t, other.Load(), "the script named echo alone; ToolUser would have called other too")
}

// TestFakeBlockScriptsAFewShotAIStep: an ai-step is answered by its fake
// block's turn 0 although its messages hold an assistant message (a
// few-shot prompt): the worker names the turn (X-Pal-Fake-Turn).
func TestFakeBlockScriptsAFewShotAIStep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", nil)
	runID := b.Start(t, `{"name":"few-shot","nodes":[{"id":"start","type":"trigger"},
		{"id":"label","type":"ai-step","data":{"provider":"anthropic","model":"m",
		 "messages":[{"role":"user","content":"Label: crash on start"},{"role":"assistant","content":"bug"},
		             {"role":"user","content":"Label: {{input.text}}"}],
		 "fake":{"turns":[{"text":"question"}]}}}],
		"edges":[{"from":"start","to":"label"}]}`, `{"text":"how do I deploy?"}`)
	final := b.WaitEnd(t, runID)
	require.Equal(t, event.RunSucceeded, final.Kind, "%s", final.Data)
	done := find(b.Events(t, runID), event.StepCompleted, "label")
	require.Len(t, done, 1)
	var out struct{ Text string }
	require.NoError(t, json.Unmarshal(data[event.StepCompletedData](t, done[0]).Output, &out))
	require.Equal(t, "question", out.Text)
	calls := b.LLM.CallsWithKey(key(runID, "label", 1))
	require.Len(t, calls, 1)
	require.Equal(t, "0", calls[0].Header.Get(provider.FakeTurnHeader))
	require.Equal(t, runID+"/label", calls[0].Header.Get(provider.FakeStepHeader))
}
