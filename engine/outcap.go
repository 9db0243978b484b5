package engine

import (
	"encoding/json"
	"math"
)

// The output cap. Every LLM call sends a cap on its output (AIInput's
// MaxTokens): the node's maxTokens; else, under a token or cost budget,
// the room the budget leaves after the call's input (at most
// DefaultOutputTokens, at least MinOutputRoom: a budget with less room
// than that stops the step, budget_exceeded, rather than send a call
// whose answer is cut off at a few tokens); else DefaultOutputTokens.
// The cap is decided
// before the step is dispatched and journaled with its input, so the
// budget's worst case (EstimateCall) is the cap the provider is sent, and
// a provider that answers with as many tokens as it may cannot take the
// run over its budget (input tokens are estimated, see EstimateCall).
//
// The room is what the journal leaves (what is spent), not what the steps
// in flight beside it reserve: the cap does not depend on which steps the
// drive has in flight, and a step whose cap does not fit beside them waits
// for them to end (brakesFor), to be sent whole rather than cut short.

// capOutput gives an LLM step about to be dispatched its output cap, when
// its node sets none. A journaled input is left as it is: a resumed call
// sends what was journaled.
func (st *RunState) capOutput(p StepPlan) StepPlan {
	if p.Exec != ExecLLM || !planActs(p) {
		return p
	}
	var in AIInput
	if json.Unmarshal(p.Input, &in) != nil || in.MaxTokens > 0 {
		return p
	}
	p = withCap(p, DefaultOutputTokens)
	if room := st.outputRoom(p.Call(), in.Model); room < DefaultOutputTokens {
		// A cap with fewer digits makes the request shorter, never longer:
		// the room stays within the budget. Below MinOutputRoom the step
		// does not fit, and brakesAt says so.
		p = withCap(p, max(room, MinOutputRoom))
	}
	return p
}

// withCap sets the output cap of p's input and request.
func withCap(p StepPlan, maxTokens int) StepPlan {
	set := func(raw json.RawMessage) json.RawMessage {
		if raw == nil {
			return nil
		}
		var in AIInput
		if json.Unmarshal(raw, &in) != nil {
			return raw
		}
		in.MaxTokens = maxTokens
		b, err := json.Marshal(in)
		if err != nil {
			return raw
		}
		return b
	}
	p.Input, p.Request = set(p.Input), set(p.Request)
	return p
}

// outputRoom is how many output tokens the run's budget leaves a call
// with the request call (an AIInput) on model: what its token and cost
// limits leave after what is spent and the call's estimated input, at the
// worst input rate. It is math.MaxInt when no limit applies, and may be 0
// or less when the budget is spent.
func (st *RunState) outputRoom(call json.RawMessage, model string) int {
	b := st.Budget
	if b == nil {
		return math.MaxInt
	}
	sp := st.Spent()
	inTok := math.Ceil(float64(len(call)) / 4)
	room := math.Inf(1)
	if b.MaxTokens > 0 {
		room = float64(b.MaxTokens) - float64(sp.Tokens) - inTok
	}
	if p, ok := st.Prices().Of(model); ok && b.MaxCostUSD > 0 && p.OutputPerMTok > 0 {
		left := b.MaxCostUSD - sp.CostUSD - inTok*p.InputWorstPerMTok()/1e6
		room = math.Min(room, math.Floor(left*1e6/p.OutputPerMTok))
	}
	if math.IsInf(room, 1) || room > math.MaxInt32 {
		return math.MaxInt
	}
	return int(room)
}
