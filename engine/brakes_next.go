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

// brakesAt is what the brakes say about a step Next is about to
// dispatch: excessive_steps, a budget that the step's worst case would
// pass, or a warning due. nil: let it go.
func (st *RunState) brakesAt(p StepPlan, now time.Time) Action {
	if !planActs(p) {
		return nil
	}
	sp := st.Spent()
	if r := st.br.rules[event.AnomalyExcessiveSteps]; r.Threshold > 0 && float64(sp.Steps+1) > r.Threshold {
		if _, ok := st.Anomalies[anomalyKey(event.AnomalyExcessiveSteps, p.StepID)]; !ok && !st.anomalyTypeSeen(event.AnomalyExcessiveSteps) {
			action := r.Action
			if action == "" {
				action = event.ActionRecord
			}
			return Note{Kind: event.AnomalyDetected, StepID: p.StepID, Data: event.AnomalyDetectedData{
				Type: event.AnomalyExcessiveSteps, Observed: float64(sp.Steps + 1), Threshold: r.Threshold, Action: action,
				StepID: p.StepID, Detail: fmt.Sprintf("step %s would be step %d of the run", p.StepID, sp.Steps+1)}}
		}
	}
	b := st.Budget
	if b == nil {
		return nil
	}
	action := b.OnExceed
	if action == "" {
		action = event.OnExceedFail
	}
	exceeded := func(limit string, spent, max, need float64) Action {
		return Note{Kind: event.BudgetExceeded, StepID: p.StepID, Data: event.BudgetExceededData{
			Limit: limit, Spent: spent, Max: max, StepID: p.StepID, Action: action, Need: need}}
	}
	if b.MaxSteps > 0 && sp.Steps+1 > b.MaxSteps {
		return exceeded(event.LimitSteps, float64(sp.Steps), float64(b.MaxSteps), 1)
	}
	if b.MaxDurationMs > 0 {
		if age := now.Sub(st.CreatedAt).Milliseconds(); age >= b.MaxDurationMs {
			return exceeded(event.LimitDuration, float64(age), float64(b.MaxDurationMs), 0)
		}
	}
	var needTokens, needCost float64
	priced := true
	if p.Exec == ExecLLM {
		needTokens, needCost, priced = EstimateCall(p.Call(), st.Prices())
	}
	if b.MaxTokens > 0 && float64(sp.Tokens)+needTokens > float64(b.MaxTokens) || b.MaxTokens > 0 && sp.Tokens >= b.MaxTokens {
		return exceeded(event.LimitTokens, float64(sp.Tokens), float64(b.MaxTokens), needTokens)
	}
	// A model with no price is held only to the other limits.
	if priced && b.MaxCostUSD > 0 && (sp.CostUSD+needCost > b.MaxCostUSD || sp.CostUSD >= b.MaxCostUSD) {
		return exceeded(event.LimitCost, sp.CostUSD, b.MaxCostUSD, needCost)
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
				Spent: l.spent, Max: l.max, StepID: p.StepID}}
		}
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
