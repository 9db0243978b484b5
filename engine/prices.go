package engine

import (
	"strings"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/workflow"
)

// Prices are an input of the run, journaled once: run_created.prices holds
// the prices of the models its workflow names, taken from the table of
// the process that created it (PricesFor). Every budget check Next makes
// and every call's cost the worker journals price from there
// (RunState.Prices), never from a process's own table, so two workers
// with different price files decide the same for the same journal.

// legacyPrices price a run whose run_created has no prices: one created
// before prices were journaled. They are provider/prices.json as it stood
// then, frozen here rather than read from the provider's table, so such a
// journal replays to the same decisions in every process whatever price
// file it loads and however prices.json changes later. A worker that had
// a PAL_PRICES file priced such a run by its file; the journal does not
// say so, and it is not followed. Never modified.
var legacyPrices = event.Prices{
	"gpt-4o":            {InputPerMTok: 2.50, OutputPerMTok: 10.00},
	"gpt-4o-mini":       {InputPerMTok: 0.15, OutputPerMTok: 0.60},
	"gpt-4.1":           {InputPerMTok: 2.00, OutputPerMTok: 8.00},
	"gpt-4.1-mini":      {InputPerMTok: 0.40, OutputPerMTok: 1.60},
	"gpt-4.1-nano":      {InputPerMTok: 0.10, OutputPerMTok: 0.40},
	"gpt-5":             {InputPerMTok: 1.25, OutputPerMTok: 10.00},
	"gpt-5-mini":        {InputPerMTok: 0.25, OutputPerMTok: 2.00},
	"gpt-5-nano":        {InputPerMTok: 0.05, OutputPerMTok: 0.40},
	"claude-opus-4-1":   {InputPerMTok: 15.00, OutputPerMTok: 75.00},
	"claude-opus-4-5":   {InputPerMTok: 5.00, OutputPerMTok: 25.00},
	"claude-sonnet-4":   {InputPerMTok: 3.00, OutputPerMTok: 15.00},
	"claude-sonnet-4-5": {InputPerMTok: 3.00, OutputPerMTok: 15.00},
	"claude-haiku-4-5":  {InputPerMTok: 1.00, OutputPerMTok: 5.00},
}

// PricesFor is the part of table that prices the models wf names
// (workflow.Models), by name in lower case: what a run of wf journals in
// run_created.prices. A model table does not know is left out, and is
// unpriced in the run. Never nil, so a run whose models have no price
// says so in its journal.
func PricesFor(table event.Prices, wf *workflow.Workflow) event.Prices {
	out := event.Prices{}
	for _, m := range wf.Models() {
		if p, ok := table.Of(m); ok {
			out[strings.ToLower(m)] = p
		}
	}
	return out
}

// Prices are the prices st is priced with: its journaled
// run_created.prices, or for a run created before prices were journaled,
// the legacy table. Not to be modified.
func (st *RunState) Prices() event.Prices {
	if st.Created.Prices == nil {
		return legacyPrices
	}
	return st.Created.Prices
}

// UsageOf is the journaled usage of one call of st that asked for model
// requested and was answered by model answered (empty when the provider
// named none), priced with st's prices: by the answered model when they
// know it (a dated snapshot as its model), else by the requested one, as
// Next's budget check priced the call before it was sent; cached input at
// the cache rates (event.Price.CostOf). A model they do not know is
// cost_unknown, not a price of 0.
func (st *RunState) UsageOf(answered, requested string, pu provider.Usage) *event.Usage {
	return UsageAt(st.Prices(), answered, requested, pu)
}

// UsageAt is UsageOf with the run's prices given (RunState.Prices): what
// a step in flight away from the state's goroutine charges its call at.
func UsageAt(prices event.Prices, answered, requested string, pu provider.Usage) *event.Usage {
	u := pu.Event()
	p, ok := prices.Of(answered)
	if !ok {
		p, ok = prices.Of(requested)
	}
	u.CostUSD, u.CostUnknown = p.CostOf(u), !ok
	return &u
}
