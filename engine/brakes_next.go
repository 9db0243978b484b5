package engine

import (
	"encoding/json"
	"fmt"
	"math"
	"time"

	"github.com/palrun/pal/event"
)

// The brakes' Next side: before Next walks the graph (brakesBefore) and
// before it lets an acting step go (brakesAt), what the fold kept becomes
// an action: a Note to journal, a Park, a Fail.

// planActs reports whether p dispatches an acting step that has not
// started yet: the point where the brakes look before letting it go.
func planActs(p StepPlan) bool {
	if p.Started || p.Pure || p.Wait != nil {
		return false
	}
	switch p.Exec {
	case ExecLLM, ExecTool, ExecConnector, ExecSubagent:
		return true
	}
	return false
}

// brakesBefore is what the brakes say before Next walks the graph: a
// pause still waiting, an anomaly to journal or act on, a budget
// exceeded. nil: nothing.
func (st *RunState) brakesBefore() Action {
	if p := st.Pause; p != nil {
		if r := p.Rejected; r != nil {
			a := st.Anomalies[p.Key]
			return Fail{Code: event.CodeAnomaly, StepID: p.StepID, Error: fmt.Sprintf(
				"anomaly %s at step %s (observed %s, threshold %s): %s rejected going on%s", a.Type, p.StepID,
				fmtNum(a.Observed), fmtNum(a.Threshold), r.Approver, suffix(r.Comment))}
		}
		return Park{Reason: p.Reason, StepID: p.StepID, Waiting: true}
	}
	for _, c := range st.br.candidates {
		if _, ok := st.Anomalies[anomalyKey(c.Type, c.StepID)]; !ok {
			return Note{Kind: event.AnomalyDetected, StepID: c.StepID, Data: c}
		}
	}
	for _, k := range st.AnomalyOrder {
		a := st.Anomalies[k]
		switch {
		case a.Action == event.ActionHalt:
			return Fail{Code: event.CodeAnomaly, StepID: a.StepID, Error: fmt.Sprintf(
				"anomaly %s at step %s: observed %s, threshold %s; halted%s", a.Type, a.StepID,
				fmtNum(a.Observed), fmtNum(a.Threshold), suffix(a.Detail))}
		case a.Action == event.ActionPause && !st.cleared[k]:
			return Park{Reason: event.WaitAnomaly, StepID: a.StepID}
		}
	}
	if x := st.Exceeded; x != nil {
		if x.Action == event.OnExceedPause {
			return Park{Reason: event.WaitBudget, StepID: x.StepID}
		}
		return Fail{Code: event.CodeBudgetExceeded, StepID: x.StepID, Error: fmt.Sprintf(
			"budget exceeded: %s is %s and step %s needs up to %s more; spent %s",
			x.Limit, fmtNum(x.Max), x.StepID, fmtNum(x.Need), fmtNum(x.Spent))}
	}
	return nil
}

func suffix(s string) string {
	if s == "" {
		return ""
	}
	return ": " + s
}

// reserve is what the steps of one set hold of a budget before their
// usage is journaled: the worst cases of the LLM steps in flight (and of
// those started by a drive that died, which the set sends again) and of
// the steps admitted ahead in the set.
type reserve struct {
	tokens, cost float64
	// steps counts the acting steps admitted ahead in the set; the ones
	// in flight are counted in StepsStarted already.
	steps int64
	// inFlight: some step is in flight (or is sent again by this set).
	inFlight bool
}

// hold reserves p, a step in flight.
func (r *reserve) hold(st *RunState, p StepPlan) {
	if p.Wait != nil || p.Pure || p.Gate != nil {
		return // it waits or acts on nothing: nothing in flight
	}
	r.inFlight = true
	if p.Exec == ExecLLM {
		tokens, cost, _ := EstimateCall(p.Call(), st.Prices())
		r.tokens, r.cost = r.tokens+tokens, r.cost+cost
	}
}

// brakesFor is what the brakes say about plans, the steps Frontier is
// about to dispatch beside flying (in flight in the caller's drive): the
// plans that may go, in order, as RunSteps, each LLM step with its output
// cap (capOutput); or, when none of them may, the Note of the first acting
// one (excessive_steps, a budget its worst case would pass, a warning
// due). Each acting step is checked with what is in
// flight and what is admitted ahead of it reserved, so the steps of a set
// never overshoot a limit together. The first that does not fit cuts the
// set there (the steps that act on nothing, and those sent again, stay);
// while anything is in flight, one that does not fit waits for it (its
// journaled usage may leave room), so budget_exceeded is journaled only
// with nothing in flight.
func (st *RunState) brakesFor(plans, flying []StepPlan, now time.Time) Action {
	var r reserve
	for _, p := range flying {
		r.hold(st, p)
	}
	for _, p := range plans {
		if p.Started {
			r.hold(st, p)
		}
	}
	out := make([]StepPlan, 0, len(plans))
	cut := false
	for _, p := range plans {
		if !planActs(p) {
			out = append(out, p)
			continue
		}
		if cut {
			continue
		}
		p = st.capOutput(p)
		a, tokens, cost := st.brakesAt(p, &r, now)
		if a == nil {
			r.steps++
			r.tokens, r.cost = r.tokens+tokens, r.cost+cost
			out = append(out, p)
			continue
		}
		if n, ok := a.(Note); len(out) == 0 && !(ok && n.Kind == event.BudgetExceeded && r.inFlight) {
			return a
		}
		cut = true
	}
	return RunSteps{Plans: out}
}

// brakesAt is what the brakes say about a step about to be dispatched,
// with r reserved: excessive_steps, a budget that the step's worst case
// would pass, or a warning due; nil, and the step's worst case in tokens
// and cost, to let it go.
func (st *RunState) brakesAt(p StepPlan, r *reserve, now time.Time) (Action, float64, float64) {
	sp := st.Spent()
	n := sp.Steps + r.steps + 1 // the step would be the run's nth
	if rule := st.br.rules[event.AnomalyExcessiveSteps]; rule.Threshold > 0 && float64(n) > rule.Threshold {
		if _, ok := st.Anomalies[anomalyKey(event.AnomalyExcessiveSteps, p.StepID)]; !ok && !st.anomalyTypeSeen(event.AnomalyExcessiveSteps) {
			action := rule.Action
			if action == "" {
				action = event.ActionRecord
			}
			return Note{Kind: event.AnomalyDetected, StepID: p.StepID, Data: event.AnomalyDetectedData{
				Type: event.AnomalyExcessiveSteps, Observed: float64(n), Threshold: rule.Threshold, Action: action,
				StepID: p.StepID, Detail: fmt.Sprintf("step %s would be step %d of the run", p.StepID, n)}}, 0, 0
		}
	}
	var needTokens, needCost float64
	priced := true
	if p.Exec == ExecLLM {
		needTokens, needCost, priced = EstimateCall(p.Call(), st.Prices())
	}
	b := st.Budget
	if b == nil {
		return nil, needTokens, needCost
	}
	if a := st.exceeded(p, sp, r, now, needTokens, needCost, priced); a != nil {
		return a, 0, 0
	}
	// The step fits. Warn, once per limit, when what is spent has reached
	// warnAt of it.
	warnAt := b.WarnAt
	if warnAt <= 0 {
		warnAt = DefaultWarnAt
	}
	for _, l := range []struct {
		name       string
		spent, max float64
	}{{event.LimitCost, sp.CostUSD, b.MaxCostUSD}, {event.LimitTokens, float64(sp.Tokens), float64(b.MaxTokens)},
		{event.LimitSteps, float64(sp.Steps), float64(b.MaxSteps)}} {
		if l.max > 0 && !st.Warned[l.name] && l.spent >= warnAt*l.max {
			return Note{Kind: event.BudgetWarning, StepID: p.StepID, Data: event.BudgetWarningData{Limit: l.name,
				Spent: l.spent, Max: l.max, StepID: p.StepID}}, 0, 0
		}
	}
	return nil, needTokens, needCost
}

// exceeded is the budget_exceeded Note of a step that does not fit the
// run's budget with r reserved (its worst case needTokens and needCost;
// priced: its model has a price), or nil.
func (st *RunState) exceeded(p StepPlan, sp Spend, r *reserve, now time.Time, needTokens, needCost float64, priced bool) Action {
	b := st.Budget
	action := b.OnExceed
	if action == "" {
		action = event.OnExceedFail
	}
	note := func(limit string, spent, max, need float64) Action {
		return Note{Kind: event.BudgetExceeded, StepID: p.StepID, Data: event.BudgetExceededData{
			Limit: limit, Spent: spent, Max: max, StepID: p.StepID, Action: action, Need: need}}
	}
	if b.MaxSteps > 0 && sp.Steps+r.steps+1 > b.MaxSteps {
		return note(event.LimitSteps, float64(sp.Steps), float64(b.MaxSteps), float64(r.steps+1))
	}
	if b.MaxDurationMs > 0 {
		if age := now.Sub(st.CreatedAt).Milliseconds(); age >= b.MaxDurationMs {
			return note(event.LimitDuration, float64(age), float64(b.MaxDurationMs), 0)
		}
	}
	tokens := float64(sp.Tokens) + r.tokens
	if b.MaxTokens > 0 && (tokens+needTokens > float64(b.MaxTokens) || tokens >= float64(b.MaxTokens)) {
		return note(event.LimitTokens, float64(sp.Tokens), float64(b.MaxTokens), needTokens+r.tokens)
	}
	// A model with no price is held only to the other limits.
	cost := sp.CostUSD + r.cost
	if priced && b.MaxCostUSD > 0 && (cost+needCost > b.MaxCostUSD || cost >= b.MaxCostUSD) {
		return note(event.LimitCost, sp.CostUSD, b.MaxCostUSD, needCost+r.cost)
	}
	return nil
}

func (st *RunState) anomalyTypeSeen(typ string) bool {
	for _, k := range st.AnomalyOrder {
		if st.Anomalies[k].Type == typ {
			return true
		}
	}
	return false
}

// EstimateCall is the worst case of an LLM step with the rendered input
// (an AIInput): its input tokens estimated as a quarter of the bytes of
// the request, plus its maxTokens (the cap the call sends, outcap.go;
// DefaultOutputTokens when unset), and what that costs at the model's
// price in prices (the run's, RunState.Prices), input at the dearer of the
// input and cache-write rates. priced is false for a model prices do not
// know: only token, step and time limits hold it.
func EstimateCall(input json.RawMessage, prices event.Prices) (tokens, costUSD float64, priced bool) {
	var in AIInput
	_ = json.Unmarshal(input, &in)
	inTok := math.Ceil(float64(len(input)) / 4)
	outTok := float64(in.MaxTokens)
	if outTok <= 0 {
		outTok = DefaultOutputTokens
	}
	p, ok := prices.Of(in.Model)
	if !ok {
		return inTok + outTok, 0, false
	}
	return inTok + outTok, (inTok*p.InputWorstPerMTok() + outTok*p.OutputPerMTok) / 1e6, true
}
