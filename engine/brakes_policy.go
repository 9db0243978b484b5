package engine

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/workflow"
)

// The brakes: a run's budget and its anomaly detection. Both are pure
// functions of the journal. The fold keeps what was spent and what was
// seen; Next turns that into an action before it dispatches the next
// step (a Note to journal, a Park, a Fail), so a stopped run makes no
// further call, and what it decided is journaled once and read back on
// every replay. The fold's side is brakes_fold.go, Next's brakes_next.go;
// this file is their policy: the rules a run is held to, decided when it
// is created and journaled in its run_created (DefaultAnomalies overlaid
// by the settings and the workflow, EffectiveAnomalies; the budget
// narrowed by the start request, NarrowBudget, or by what a parent has
// left, ChildBudget).

// DefaultWarnAt is a budget's warnAt when it sets none.
const DefaultWarnAt = 0.8

// DefaultOutputTokens is the output cap a call sends when its node sets no
// maxTokens and no budget leaves it less room (outcap.go).
const DefaultOutputTokens = 4096

// MinOutputRoom is the least output cap a budget's room gives a call
// whose node sets no maxTokens: with less room the step does not fit its
// budget (outcap.go).
const MinOutputRoom = 256

// DefaultAnomalies are the built-in anomaly rules, which settings
// (PAL_ANOMALY_<TYPE>) and a workflow's policy.anomalies override:
//
//   - runaway_loop: one agent asks for the same tool with identical
//     arguments 5 times (threshold), or the run sends an identical LLM
//     request 10 times (requests); halt.
//   - excessive_steps: the run would start more than 1000 steps; record.
//   - retry_storm: 50 retries in the run (threshold) or 10 in one step
//     (perStep); record.
//   - cost_spike: an LLM step costs more than 10× the median of the run's
//     earlier LLM steps (at least 3 of them) and more than $0.50; record.
//   - token_spike: the same with tokens, floor 50000; record.
var DefaultAnomalies = map[string]event.AnomalyRule{
	event.AnomalyRunawayLoop:    {Threshold: 5, Requests: 10, Action: event.ActionHalt},
	event.AnomalyExcessiveSteps: {Threshold: 1000, Action: event.ActionRecord},
	event.AnomalyRetryStorm:     {Threshold: 50, PerStep: 10, Action: event.ActionRecord},
	event.AnomalyCostSpike:      {Threshold: 10, Floor: 0.5, Action: event.ActionRecord},
	event.AnomalyTokenSpike:     {Threshold: 10, Floor: 50000, Action: event.ActionRecord},
}

// AnomalyTypes lists the anomaly types in a stable order.
var AnomalyTypes = []string{event.AnomalyRunawayLoop, event.AnomalyExcessiveSteps, event.AnomalyRetryStorm,
	event.AnomalyCostSpike, event.AnomalyTokenSpike}

// spikeSamples is how many earlier LLM steps a spike needs to compare with.
const spikeSamples = 3

// overlay sets the fields of r that o sets.
func overlay(r, o event.AnomalyRule) event.AnomalyRule {
	if o.Threshold > 0 {
		r.Threshold = o.Threshold
	}
	if o.PerStep > 0 {
		r.PerStep = o.PerStep
	}
	if o.Requests > 0 {
		r.Requests = o.Requests
	}
	if o.Floor > 0 {
		r.Floor = o.Floor
	}
	if o.Action != "" {
		r.Action = o.Action
	}
	return r
}

// EffectiveAnomalies is the anomaly policy a run records in run_created:
// DefaultAnomalies, overridden by defaults (the settings), overridden by
// the workflow's policy.anomalies.
func EffectiveAnomalies(defaults map[string]event.AnomalyRule, wf *workflow.Workflow) map[string]event.AnomalyRule {
	out := make(map[string]event.AnomalyRule, len(AnomalyTypes))
	for _, t := range AnomalyTypes {
		r := overlay(DefaultAnomalies[t], defaults[t])
		if wf != nil && wf.Policy != nil {
			if w, ok := wf.Policy.Anomalies[t]; ok {
				r = overlay(r, event.AnomalyRule{Threshold: w.Threshold, PerStep: w.PerStep, Requests: w.Requests,
					Floor: w.Floor, Action: w.Action})
			}
		}
		out[t] = r
	}
	return out
}

// BudgetOf converts a workflow or request budget to the journal's form;
// nil for nil.
func BudgetOf(b *workflow.Budget) *event.Budget {
	if b == nil {
		return nil
	}
	return &event.Budget{MaxCostUSD: b.MaxCostUSD, MaxTokens: b.MaxTokens, MaxSteps: b.MaxSteps,
		MaxDurationMs: b.MaxDurationMs, WarnAt: b.WarnAt, OnExceed: b.OnExceed}
}

// WideningError says a start request's budget asks for more than the
// workflow allows.
type WideningError struct {
	Limit     string
	Requested float64
	Allowed   float64
}

func (e *WideningError) Error() string {
	if e.Limit == "on_exceed" {
		return `budget.onExceed: "pause" widens the workflow's "fail"; a start request may only narrow the budget`
	}
	return fmt.Sprintf("budget.%s: %v widens the workflow's limit of %v; a start request may only narrow the budget",
		camelLimit(e.Limit), fmtNum(e.Requested), fmtNum(e.Allowed))
}

func camelLimit(l string) string {
	return map[string]string{event.LimitCost: "maxCostUsd", event.LimitTokens: "maxTokens",
		event.LimitSteps: "maxSteps", event.LimitDuration: "maxDurationMs"}[l]
}

func fmtNum(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// NarrowBudget is the effective budget of a run of a workflow whose
// policy.budget is base, started with the request budget req: each limit
// of req must be at most base's (a limit base leaves unset may be set);
// req's warnAt replaces base's, and its onExceed may turn pause into
// fail (not fail into pause, which would let a run go on). A request that widens a limit
// is refused with a *WideningError: nothing is clamped silently.
func NarrowBudget(base, req *event.Budget) (*event.Budget, error) {
	if req == nil {
		return base, nil
	}
	out := event.Budget{}
	if base != nil {
		out = *base
	}
	narrow := func(limit string, want, have float64, set func()) error {
		if want == 0 {
			return nil
		}
		if have > 0 && want > have {
			return &WideningError{Limit: limit, Requested: want, Allowed: have}
		}
		set()
		return nil
	}
	for _, err := range []error{
		narrow(event.LimitCost, req.MaxCostUSD, out.MaxCostUSD, func() { out.MaxCostUSD = req.MaxCostUSD }),
		narrow(event.LimitTokens, float64(req.MaxTokens), float64(out.MaxTokens), func() { out.MaxTokens = req.MaxTokens }),
		narrow(event.LimitSteps, float64(req.MaxSteps), float64(out.MaxSteps), func() { out.MaxSteps = req.MaxSteps }),
		narrow(event.LimitDuration, float64(req.MaxDurationMs), float64(out.MaxDurationMs), func() { out.MaxDurationMs = req.MaxDurationMs }),
	} {
		if err != nil {
			return nil, err
		}
	}
	if req.WarnAt > 0 {
		out.WarnAt = req.WarnAt
	}
	if req.OnExceed == event.OnExceedPause && base != nil && base.OnExceed != event.OnExceedPause {
		return nil, &WideningError{Limit: "on_exceed"}
	}
	if req.OnExceed != "" {
		out.OnExceed = req.OnExceed
	}
	return &out, nil
}

// ChildBudget is the budget of the child run a subagent step of st
// starts with the workflow wf: wf's own policy.budget, narrowed to what
// st has left of each of its limits at the time (now); warnAt and
// onExceed are the child's own, else the parent's. nil when neither has
// a budget. The parent counts the child's spend in its own when the
// child ends (the subagent step's usage).
func ChildBudget(st *RunState, wf *workflow.Workflow, now time.Time) *event.Budget {
	var own *event.Budget
	if wf != nil && wf.Policy != nil {
		own = BudgetOf(wf.Policy.Budget)
	}
	pb := st.Budget
	if pb == nil {
		return own
	}
	out := event.Budget{}
	if own != nil {
		out = *own
	}
	sp := st.Spent()
	left := func(limit, spent float64) float64 { return math.Max(limit-spent, 0) }
	capAt := func(have, cap float64) float64 {
		if cap <= 0 {
			return have
		}
		if have == 0 || have > cap {
			// A limit used up entirely still has to stay a limit.
			return math.Max(cap, math.SmallestNonzeroFloat64)
		}
		return have
	}
	if pb.MaxCostUSD > 0 {
		out.MaxCostUSD = capAt(out.MaxCostUSD, left(pb.MaxCostUSD, sp.CostUSD))
	}
	if pb.MaxTokens > 0 {
		out.MaxTokens = int64(capAt(float64(out.MaxTokens), math.Max(left(float64(pb.MaxTokens), float64(sp.Tokens)), 1)))
	}
	if pb.MaxSteps > 0 {
		out.MaxSteps = int64(capAt(float64(out.MaxSteps), math.Max(left(float64(pb.MaxSteps), float64(sp.Steps)), 1)))
	}
	if pb.MaxDurationMs > 0 {
		elapsed := float64(now.Sub(st.CreatedAt).Milliseconds())
		out.MaxDurationMs = int64(capAt(float64(out.MaxDurationMs), math.Max(left(float64(pb.MaxDurationMs), elapsed), 1)))
	}
	if out.WarnAt == 0 {
		out.WarnAt = pb.WarnAt
	}
	if out.OnExceed == "" {
		out.OnExceed = pb.OnExceed
	}
	return &out
}
