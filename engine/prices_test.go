package engine_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/provider"
)

// creatorPrices is the price table of the process that created
// runPrices: its price file makes review's model ten times its list
// price.
var creatorPrices = event.Prices{
	"gpt-4o-mini":       {InputPerMTok: 0.15, OutputPerMTok: 0.60},
	"claude-sonnet-4-5": {InputPerMTok: 30, OutputPerMTok: 150},
	"gpt-4o":            {InputPerMTok: 2.50, OutputPerMTok: 10},
}

// llmPriced journals an ai-step as llm does, its usage priced as the
// worker prices it: with the run's journaled prices.
func (h *history) llmPriced(stepID, text, model string, in, out int64) *history {
	h.t.Helper()
	h.start(stepID)
	o, err := json.Marshal(map[string]any{"text": text, "model": model, "finish_reason": "stop", "id": "resp_" + stepID})
	require.NoError(h.t, err)
	return h.complete(stepID, string(o), h.st.UsageOf(model, "", provider.Usage{InputTokens: in, OutputTokens: out}))
}

func buildBudgetJournaledPrices(t testing.TB) []event.Event {
	// $0.03 leaves review room for some 2,000 output tokens at list price,
	// but for fewer than engine.MinOutputRoom at the creator's (ten times
	// it): the run fails before review is sent, whatever table the worker
	// that drives it has.
	wf := withPolicy(t, wfSummarise, `{"budget":{"maxCostUsd":0.03}}`)
	h := newStartedPriced(t, runPrices, wf, inputSummarise, nil, creatorPrices).resume("worker-a")
	h.llmPriced("draft", "PAL journals each agent step.", "gpt-4o-mini-2024-07-18", 58, 14)
	h.brake(event.BudgetExceeded)
	return h.finish().events()
}

// TestWorkersWithOtherPricesDecideTheSame replays budget_journaled_prices
// as two workers whose PAL_PRICES files price review's model differently
// (free, and dearer than its creator priced it) would drive it: both take
// the journal's budget decision, to the letter, because Next prices a
// call with the run's journaled prices, not with the process's table.
// Not parallel: it loads price files into the process's table.
func TestWorkersWithOtherPricesDecideTheSame(t *testing.T) {
	evs := readHistory(t, filepath.Join("testdata", "budget_journaled_prices.jsonl"))
	var created event.RunCreatedData
	require.NoError(t, evs[0].DecodeData(&created))
	require.Equal(t, event.Prices{"gpt-4o-mini": creatorPrices["gpt-4o-mini"], "claude-sonnet-4-5": creatorPrices["claude-sonnet-4-5"]},
		created.Prices, "the models the workflow names, at the creator's prices")
	var exceeded event.BudgetExceededData
	for _, ev := range evs {
		if ev.Kind == event.BudgetExceeded {
			require.NoError(t, ev.DecodeData(&exceeded))
		}
	}
	require.Equal(t, "review", exceeded.StepID)
	require.Greater(t, exceeded.Need, 0.03, "priced at the creator's prices")

	t.Cleanup(provider.ResetPrices)
	for name, file := range map[string]string{
		"free":   `{"models": {"claude-sonnet-4-5": {"input_per_mtok": 0, "output_per_mtok": 0}}}`,
		"dearer": `{"models": {"claude-sonnet-4-5": {"input_per_mtok": 300, "output_per_mtok": 1500}}}`,
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "prices.json")
			require.NoError(t, os.WriteFile(path, []byte(file), 0o600))
			require.NoError(t, provider.LoadPrices(path))
			st := foldFollowingNext(t, evs)
			require.Equal(t, engine.StatusFailed, st.Status)
			require.Equal(t, event.CodeBudgetExceeded, st.ErrorCode)
		})
	}
}

// TestLegacyPrices: a run_created without prices (written before they
// were journaled) is priced with the list prices of that time, whatever
// the process's table, and a journaled empty table prices nothing.
func TestLegacyPrices(t *testing.T) {
	t.Parallel()
	legacy := newStarted(t, testRun, wfSummarise, inputSummarise, nil)
	require.Nil(t, legacy.st.Created.Prices)
	p, ok := legacy.st.Prices().Of("claude-sonnet-4-5-20250929")
	require.True(t, ok)
	require.Equal(t, event.Price{InputPerMTok: 3, OutputPerMTok: 15}, p)

	none := newStartedPriced(t, testRun, wfSummarise, inputSummarise, nil, event.Prices{"gpt-5": {InputPerMTok: 1}})
	require.NotNil(t, none.st.Created.Prices)
	require.Empty(t, none.st.Prices(), "no model of the workflow has a price")
	u := none.st.UsageOf("gpt-4o-mini", "gpt-4o-mini", provider.Usage{InputTokens: 10, OutputTokens: 5})
	require.True(t, u.CostUnknown)
	require.Zero(t, u.CostUSD)

	// Through a snapshot too: gob does not tell an empty table from none.
	for _, h := range []*history{legacy, none} {
		b, err := engine.EncodeState(h.st)
		require.NoError(t, err)
		got, err := engine.DecodeState(b)
		require.NoError(t, err)
		require.Equal(t, h.st.Created.Prices == nil, got.Created.Prices == nil)
		require.Equal(t, h.st.Prices(), got.Prices())
	}
}

// TestUsageOf: a call is priced with the run's journaled prices, by the
// model that answered (a dated snapshot as its model), else by the one
// asked for, as Next's budget check priced it.
func TestUsageOf(t *testing.T) {
	t.Parallel()
	h := newStartedPriced(t, testRun, wfSummarise, inputSummarise, nil, creatorPrices)
	for _, tt := range []struct {
		answered, requested string
		cost                float64
		unknown             bool
	}{
		{"claude-sonnet-4-5-20250929", "claude-sonnet-4-5", (1000*30 + 100*150.0) / 1e6, false},
		{"", "claude-sonnet-4-5", (1000*30 + 100*150.0) / 1e6, false},
		{"gpt-4o-mini", "claude-sonnet-4-5", (1000*0.15 + 100*0.6) / 1e6, false},
		{"house-model", "claude-sonnet-4-5", (1000*30 + 100*150.0) / 1e6, false},
		// gpt-4o is in the creator's table, but the workflow names it not:
		// it was not journaled, so the run does not price it.
		{"gpt-4o", "gpt-4o", 0, true},
	} {
		u := h.st.UsageOf(tt.answered, tt.requested, provider.Usage{InputTokens: 1000, OutputTokens: 100})
		require.Equal(t, event.Usage{InputTokens: 1000, OutputTokens: 100, TotalTokens: 1100, CostUSD: u.CostUSD, CostUnknown: tt.unknown}, *u, tt.answered)
		require.InDelta(t, tt.cost, u.CostUSD, 1e-12, tt.answered)
	}
}
