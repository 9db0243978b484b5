package workers_test

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/runs"
)

// TestResponseSchemaRetriesThenFeedsTheNextStep: a responseSchema step
// whose first answer does not match the schema and whose second does: two
// attempts (the first failed with class llm and the validation error, its
// usage journaled with it), the schema reached the provider natively, and
// the second answer's parsed output.json feeds the next step's template.
func TestResponseSchemaRetriesThenFeedsTheNextStep(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var n atomic.Int64
	b.LLM.SetResponder(func(c providertest.Call) providertest.Reply {
		if c.ResponseSchema == nil {
			return providertest.Reply{Text: "echo: " + c.LastUser()}
		}
		if n.Add(1) == 1 {
			return providertest.Reply{Text: `{"label":"bug"}`, InputTokens: 10, OutputTokens: 5} // no priority
		}
		return providertest.Reply{Text: `{"label":"bug","priority":2}`, InputTokens: 10, OutputTokens: 7}
	})
	b.worker(t, "w1", nil)
	schema := `{"type":"object","properties":{"label":{"type":"string"},"priority":{"type":"integer"}},
		"required":["label","priority"],"additionalProperties":false}`
	wf := `{"name":"triage","nodes":[{"id":"start","type":"trigger"},
		{"id":"classify","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"Classify: {{input.text}}",
		 "responseSchema":` + schema + `,"retry":{"maxAttempts":3,"retryableClasses":["llm"]}}},
		{"id":"route","type":"ai-step","data":{"provider":"anthropic","model":"claude-haiku-4-5",
		 "prompt":"Route {{steps.classify.output.json.label}} at priority {{steps.classify.output.json.priority}}"}}],
		"edges":[{"from":"start","to":"classify"},{"from":"classify","to":"route"}]}`
	runID := b.Start(t, wf, `{"text":"it crashes"}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)

	evs := b.Events(t, runID)
	retried := find(evs, event.StepRetrying, "classify")
	require.Len(t, retried, 1)
	r := data[event.StepRetryingData](t, retried[0])
	require.Equal(t, event.ClassLLM, r.Class)
	require.Equal(t, 2, r.Attempt, "a new attempt: the provider answered, the same key would give the same answer")
	require.Contains(t, r.Error, "does not match the step's responseSchema")
	require.Contains(t, r.Error, "missing property 'priority'")
	require.NotNil(t, r.Usage, "the answer that did not do was paid for")
	require.Equal(t, int64(15), r.Usage.TotalTokens)

	done := data[event.StepCompletedData](t, find(evs, event.StepCompleted, "classify")[0])
	var out engine.LLMOutput
	require.NoError(t, json.Unmarshal(done.Output, &out))
	require.JSONEq(t, `{"label":"bug","priority":2}`, string(out.JSON))
	require.Equal(t, 2, find(evs, event.StepCompleted, "classify")[0].Attempt)

	calls := b.LLM.Calls()
	require.Len(t, calls, 3)
	require.JSONEq(t, schema, string(calls[0].ResponseSchema), "sent natively")
	require.Equal(t, key(runID, "classify", 1), calls[0].IdempotencyKey)
	require.Equal(t, key(runID, "classify", 2), calls[1].IdempotencyKey)
	require.Equal(t, "Route bug at priority 2", calls[2].LastUser())

	view, err := b.Runs.Get(ctxFor(t, 10*time.Second), runID)
	require.NoError(t, err)
	require.Equal(t, int64(15+17)+view.Steps[1].Usage.TotalTokens, view.Usage.TotalTokens, "both attempts count")
}

// TestResponseSchemaFailsAfterItsRetries: an answer that never matches
// fails the step with the validation error once the policy is spent.
func TestResponseSchemaFailsAfterItsRetries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.LLM.SetResponder(func(providertest.Call) providertest.Reply { return providertest.Reply{Text: "not JSON at all"} })
	b.worker(t, "w1", nil)
	wf := `{"name":"strict","nodes":[{"id":"start","type":"trigger"},
		{"id":"a","type":"ai-step","data":{"provider":"anthropic","model":"claude-haiku-4-5","prompt":"hi",
		 "responseSchema":{"type":"object"},"retry":{"maxAttempts":2,"retryableClasses":["llm"]}}}],
		"edges":[{"from":"start","to":"a"}]}`
	runID := b.Start(t, wf, `{}`)
	end := b.WaitEnd(t, runID)
	require.Equal(t, event.RunFailed, end.Kind)
	evs := b.Events(t, runID)
	failed := data[event.StepFailedData](t, find(evs, event.StepFailed, "a")[0])
	require.Equal(t, event.ClassLLM, failed.Class)
	require.Contains(t, failed.Error, "the answer is not JSON")
	require.NotNil(t, failed.Usage)
	require.Len(t, b.LLM.Calls(), 2)
	require.NotNil(t, b.LLM.Calls()[0].ResponseSchema, "Anthropic's structured outputs")
}

// TestFallbackListMovesOnAnOutage: a step whose model list's first
// provider answers 503 to every call completes on the second model at
// once (an outage does not wait out the retry policy); the journal names
// both models, each attempt with its own key, and the read model gives the
// usage and cost of each model and says which answered.
func TestFallbackListMovesOnAnOutage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.LLM.SetResponder(func(c providertest.Call) providertest.Reply {
		if c.Provider == providertest.OpenAI {
			return providertest.Reply{Status: http.StatusServiceUnavailable}
		}
		return providertest.Reply{Text: "from claude", InputTokens: 1000, OutputTokens: 100}
	})
	b.worker(t, "w1", nil)
	wf := `{"name":"fallback","nodes":[{"id":"start","type":"trigger"},
		{"id":"a","type":"ai-step","data":{"model":["openai/gpt-4.1-mini","anthropic/claude-sonnet-4-5"],"prompt":"hi",
		 "retry":{"maxAttempts":3,"backoffMs":60000,"retryableClasses":["llm"]}}}],
		"edges":[{"from":"start","to":"a"}]}`
	runID := b.Start(t, wf, `{}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)

	evs := b.Events(t, runID)
	prices := data[event.RunCreatedData](t, evs[0]).Prices
	require.Contains(t, prices, "gpt-4.1-mini")
	require.Contains(t, prices, "claude-sonnet-4-5", "every model of the list is priced")

	started := find(evs, event.StepStarted, "a")
	require.Len(t, started, 2)
	var models []string
	for _, ev := range started {
		var in engine.AIInput
		require.NoError(t, json.Unmarshal(data[event.StepStartedData](t, ev).Input, &in))
		models = append(models, in.Provider+"/"+in.Model)
	}
	require.Equal(t, []string{"openai/gpt-4.1-mini", "anthropic/claude-sonnet-4-5"}, models)
	r := data[event.StepRetryingData](t, find(evs, event.StepRetrying, "a")[0])
	require.Equal(t, 1, r.Fallback)
	require.Equal(t, 2, r.Attempt)
	require.Zero(t, r.DelayMs, "an outage moves on at once, not after the 60 s backoff")
	require.Equal(t, map[string]int{key(runID, "a", 1): 1, key(runID, "a", 2): 1}, b.LLM.Keys())

	view, err := b.Runs.Get(ctxFor(t, 10*time.Second), runID)
	require.NoError(t, err)
	step := view.Steps[0]
	require.Equal(t, "anthropic/claude-sonnet-4-5", step.Model, "the model that answered")
	require.Len(t, step.Models, 2)
	require.Equal(t, runs.ModelUsage{Model: "openai/gpt-4.1-mini", Attempts: 1}, step.Models[0])
	require.Equal(t, "anthropic/claude-sonnet-4-5", step.Models[1].Model)
	require.Equal(t, int64(1100), step.Models[1].Usage.TotalTokens)
	require.InDelta(t, (1000*3.00+100*15.00)/1e6, step.Models[1].Usage.CostUSD, 1e-12)

	wf2, err := b.Runs.Waterfall(ctxFor(t, 10*time.Second), runID)
	require.NoError(t, err)
	row := wf2.Rows[0]
	require.Equal(t, "anthropic/claude-sonnet-4-5", row.Model)
	require.Equal(t, []string{"openai/gpt-4.1-mini", "anthropic/claude-sonnet-4-5"},
		[]string{row.Segments[0].Model, row.Segments[1].Model}, "each attempt's bar names its model")
}

// TestFallbackAfterTheRetryPolicy: a failure that is no outage (a 400) is
// retried on its model as its policy says (not at all, here: 400 is
// permanent), then the step moves to the next model.
func TestFallbackAfterTheRetryPolicy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.LLM.SetResponder(func(c providertest.Call) providertest.Reply {
		if c.Model == "gpt-4o" {
			return providertest.Reply{Status: http.StatusTooManyRequests}
		}
		return providertest.Reply{Text: "ok"}
	})
	b.worker(t, "w1", nil)
	wf := `{"name":"fallback","nodes":[{"id":"start","type":"trigger"},
		{"id":"a","type":"ai-step","data":{"model":["openai/gpt-4o","openai/gpt-4o-mini"],"prompt":"hi",
		 "retry":{"maxAttempts":2,"retryableClasses":["llm"]}}}],
		"edges":[{"from":"start","to":"a"}]}`
	runID := b.Start(t, wf, `{}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
	var models []string
	for _, c := range b.LLM.Calls() {
		models = append(models, c.Model)
	}
	require.Equal(t, []string{"gpt-4o", "gpt-4o", "gpt-4o-mini"}, models, "two tries (the policy), then the next model")
	evs := b.Events(t, runID)
	retries := find(evs, event.StepRetrying, "a")
	require.Len(t, retries, 2)
	require.Equal(t, 1, retries[0].Attempt, "a 429 keeps the attempt and its key")
	require.Equal(t, 0, data[event.StepRetryingData](t, retries[0]).Fallback)
	require.Equal(t, 1, data[event.StepRetryingData](t, retries[1]).Fallback)
	require.Equal(t, 2, data[event.StepRetryingData](t, retries[1]).Attempt)
}

// TestCachedTokensArePricedByClass: an Anthropic answer that read 600
// tokens from the prompt cache and wrote 300 to it, of 1,000 input tokens,
// is priced at the table's rates for each class (claude-sonnet-4-5:
// input $3, cache read $0.30, cache write $3.75, output $15 per million),
// and the classes are journaled and shown.
func TestCachedTokensArePricedByClass(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.LLM.SetResponder(func(providertest.Call) providertest.Reply {
		return providertest.Reply{Text: "cached", InputTokens: 1000, CacheReadTokens: 600, CacheWriteTokens: 300,
			OutputTokens: 200, ReasoningTokens: 50, Reasoning: "thinking first"}
	})
	b.worker(t, "w1", nil)
	wf := `{"name":"cached","nodes":[{"id":"start","type":"trigger"},
		{"id":"a","type":"ai-step","data":{"provider":"anthropic","model":"claude-sonnet-4-5","prompt":"hi"}}],
		"edges":[{"from":"start","to":"a"}]}`
	runID := b.Start(t, wf, `{}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
	u := data[event.StepCompletedData](t, find(b.Events(t, runID), event.StepCompleted, "a")[0]).Usage
	require.NotNil(t, u)
	// 100 uncached × $3 + 600 read × $0.30 + 300 written × $3.75 + 200 out × $15, per million:
	// 0.0003 + 0.00018 + 0.001125 + 0.003 = 0.004605.
	require.InDelta(t, 0.004605, u.CostUSD, 1e-12)
	require.Equal(t, event.Usage{InputTokens: 1000, OutputTokens: 200, TotalTokens: 1200, CacheReadTokens: 600,
		CacheWriteTokens: 300, ReasoningTokens: 50, CostUSD: u.CostUSD}, *u)

	view, err := b.Runs.Get(ctxFor(t, 10*time.Second), runID)
	require.NoError(t, err)
	require.Equal(t, *u, view.Usage)
	require.Equal(t, *u, *view.Steps[0].Usage)
}

// TestEveryCallSendsACap: an ai-step with no maxTokens sends the default
// cap, and under a budget the room the budget leaves; a provider that
// always answers with as many tokens as it may never takes the run over
// its budget: the run stops (budget_exceeded) before a call that would.
func TestEveryCallSendsACap(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.LLM.SetResponder(func(c providertest.Call) providertest.Reply {
		return providertest.Reply{Text: strings.Repeat("w ", min(c.MaxTokens, 64)), OutputTokens: int64(c.MaxTokens)}
	})
	b.worker(t, "w1", nil)

	one := `{"name":"one","nodes":[{"id":"start","type":"trigger"},
		{"id":"a","type":"ai-step","data":{"provider":"openai","model":"gpt-4o","prompt":"hi"}}],
		"edges":[{"from":"start","to":"a"}]}`
	runID := b.Start(t, one, `{}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
	require.Equal(t, engine.DefaultOutputTokens, b.LLM.CallsWithKey(key(runID, "a", 1))[0].MaxTokens)

	// gpt-4o: $2.50 in, $10 out per million. $0.10 buys about 10,000
	// output tokens: two full default caps, then less, then too little.
	many := `{"name":"many","nodes":[{"id":"start","type":"trigger"},
		{"id":"each","type":"loop","data":{"over":"{{input.xs}}","body":{"name":"b","nodes":[{"id":"start","type":"trigger"},
			{"id":"ask","type":"ai-step","data":{"provider":"openai","model":"gpt-4o","prompt":"go {{input.item}}"}}],
			"edges":[{"from":"start","to":"ask"}]}}}],
		"edges":[{"from":"start","to":"each"}],"policy":{"budget":{"maxCostUsd":0.1}}}`
	runID = b.Start(t, many, `{"xs":[1,2,3,4,5,6,7,8]}`)
	end := b.WaitEnd(t, runID)
	require.Equal(t, event.RunFailed, end.Kind)
	require.Equal(t, event.CodeBudgetExceeded, data[event.RunFailedData](t, end).Code)

	evs := b.Events(t, runID)
	spent := 0.0
	var caps []int
	for _, ev := range find(evs, event.StepCompleted, "") {
		spent += data[event.StepCompletedData](t, ev).Usage.CostUSD
	}
	for _, c := range b.LLM.Calls() {
		if strings.HasPrefix(c.LastUser(), "go ") {
			caps = append(caps, c.MaxTokens)
		}
	}
	require.GreaterOrEqual(t, len(caps), 3)
	require.Equal(t, engine.DefaultOutputTokens, caps[0])
	require.Less(t, caps[len(caps)-1], engine.DefaultOutputTokens, "the last call got the room that was left")
	require.LessOrEqual(t, spent, 0.1, "spend never passes the budget")
	require.Greater(t, spent, 0.1-float64(engine.MinOutputRoom)*10/1e6-0.001, "the budget was used up to what one more call needs")
	x := data[event.BudgetExceededData](t, find(evs, event.BudgetExceeded, "")[0])
	require.Equal(t, event.LimitCost, x.Limit)
}

// TestImagesFromTheRunsValues: an image part names a blob by its sha256:
// a value the run holds (here the output of an echo step, a JSON string of
// base64 bytes), whose bytes the worker sends in the provider's form; a
// URL goes as it is; a blob the run does not hold fails the step.
func TestImagesFromTheRunsValues(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(t, "w1", nil)
	png := []byte("\x89PNG\r\n\x1a\n" + strings.Repeat("pixels", 40))
	value, err := json.Marshal(base64.StdEncoding.EncodeToString(png))
	require.NoError(t, err)
	sum := sha256.Sum256(value)
	wf := func(blob string) string {
		return `{"name":"look","nodes":[{"id":"start","type":"trigger"},
		{"id":"fetch","type":"tool","data":{"tool":"echo","input":` + string(value) + `}},
		{"id":"look","type":"ai-step","data":{"provider":"anthropic","model":"claude-haiku-4-5","messages":[
		 {"role":"user","content":"what is this?","images":[{"url":"https://example.com/{{input.name}}.png"},
		  {"blob":"` + blob + `","mediaType":"image/png"}]}]}}],
		"edges":[{"from":"start","to":"fetch"},{"from":"fetch","to":"look"}]}`
	}
	runID := b.Start(t, wf(hex.EncodeToString(sum[:])), `{"name":"cat"}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
	calls := b.LLM.CallsWithKey(key(runID, "look", 1))
	require.Len(t, calls, 1)
	require.Equal(t, []provider.Image{{URL: "https://example.com/cat.png"}, {MediaType: "image/png", Data: png}},
		calls[0].Messages[0].Images)
	started := data[event.StepStartedData](t, find(b.Events(t, runID), event.StepStarted, "look")[0])
	require.NotContains(t, string(started.Input), base64.StdEncoding.EncodeToString(png)[:40],
		"the journal names the blob, it does not copy the bytes")

	other := sha256.Sum256([]byte(`"elsewhere"`))
	runID = b.Start(t, wf(hex.EncodeToString(other[:])), `{"name":"cat"}`)
	end := b.WaitEnd(t, runID)
	require.Equal(t, event.RunFailed, end.Kind)
	require.Contains(t, data[event.RunFailedData](t, end).Error, "is no value this run holds")
	require.Empty(t, b.LLM.CallsWithKey(key(runID, "look", 1)), "nothing is sent")
}
