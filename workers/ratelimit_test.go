package workers_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/provider/providertest"
)

// TestRateLimitWaitsWhatTheProviderAsks: the provider answers a pal worker
// process 429 with Retry-After: 2. The step retries once, after the 2 s the
// provider asked for (journaled in step_retrying), with the same
// idempotency key: a refused request did no work.
func TestRateLimitWaitsWhatTheProviderAsks(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	wf := `{"name":"limited","nodes":[{"id":"start","type":"trigger"},
		{"id":"s1","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"hi",
		 "retry":{"maxAttempts":3,"backoffMs":10,"retryableClasses":["llm"]}}}],
		"edges":[{"from":"start","to":"s1"}]}`
	runID := event.NewRunID()
	k := key(runID, "s1", 1)
	p.LLM.RateLimit(providertest.ByKey(k), 1, 2*time.Second)
	p.palWorker(t, "w1")
	p.startAs(t, runID, wf, `{}`)
	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, runID).Kind)

	evs := p.Events(t, runID)
	retries := find(evs, event.StepRetrying, "s1")
	require.Len(t, retries, 1)
	rd := data[event.StepRetryingData](t, retries[0])
	require.Equal(t, int64(2000), rd.RetryAfterMs, "the provider's ask is journaled")
	require.Equal(t, int64(2000), rd.DelayMs, "within the 60s cap, the wait is what it asked")
	require.Equal(t, 1, rd.Attempt, "same attempt: same key")
	require.Contains(t, rd.Error, "429")

	require.Equal(t, map[string]int{k: 2}, p.LLM.Keys(), "the retry reused the key, once")
	calls := p.LLM.CallsWithKey(k)
	gap := calls[1].At.Sub(calls[0].At)
	require.GreaterOrEqual(t, gap, 2*time.Second)
	require.Less(t, gap, 20*time.Second)
}

// TestRetryAfterIsCapped: a provider asking for 30 s is waited
// PAL_RETRY_AFTER_MAX (here 300ms), and the ask is journaled as it was.
func TestRetryAfterIsCapped(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	wf := `{"name":"capped","nodes":[{"id":"start","type":"trigger"},
		{"id":"s1","type":"ai-step","data":{"provider":"anthropic","model":"claude-haiku-4-5","prompt":"hi",
		 "retry":{"maxAttempts":2,"retryableClasses":["llm"]}}}],
		"edges":[{"from":"start","to":"s1"}]}`
	runID := event.NewRunID()
	p.LLM.RateLimit(providertest.ByKey(key(runID, "s1", 1)), 1, 30*time.Second)
	p.palWorker(t, "w1", "PAL_RETRY_AFTER_MAX=300ms")
	p.startAs(t, runID, wf, `{}`)
	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, runID).Kind)
	rd := data[event.StepRetryingData](t, find(p.Events(t, runID), event.StepRetrying, "s1")[0])
	require.Equal(t, int64(30000), rd.RetryAfterMs)
	require.Equal(t, int64(300), rd.DelayMs)
}

// TestProviderConcurrencyLimit: ten runs on a pal worker process with
// PAL_PROVIDER_CONCURRENCY=openai=2; the fake provider, answering slowly,
// never sees more than two calls at once, and every run succeeds (waiting
// for a slot is not a failure).
func TestProviderConcurrencyLimit(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	p.LLM.SetLatency(150 * time.Millisecond)
	p.palWorker(t, "w1", "PAL_PROVIDER_CONCURRENCY=openai=2,anthropic=1")
	var ids []string
	for i := 0; i < 10; i++ {
		ids = append(ids, p.Start(t, seqWorkflow(2, "openai"), fmt.Sprintf(`{"topic":"t%d"}`, i)))
	}
	for _, id := range ids {
		require.Equal(t, event.RunSucceeded, p.WaitEnd(t, id).Kind)
		require.Empty(t, find(p.Events(t, id), event.StepRetrying, ""))
	}
	require.Len(t, p.LLM.Calls(), 20)
	require.Equal(t, 2, p.LLM.MaxConcurrent(), "the limit is reached and never passed")
}
