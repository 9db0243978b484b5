package engine

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/workflow"
)

// The brakes: a run's budget and its anomaly detection. Both are pure
// functions of the journal. The fold keeps what was spent and what was
// seen; Next turns that into an action before it dispatches the next
// step (a Note to journal, a Park, a Fail), so a stopped run makes no
// further call, and what it decided is journaled once and read back on
// every replay.

// Note asks the worker to journal one event (budget_warning,
// budget_exceeded, anomaly_detected) and ask Next again.
type Note struct {
	Kind   event.Kind
	StepID string
	Data   any
}

// Park asks the worker to park the run on a brake: step_waiting with
// Reason (budget or anomaly) on StepID, unless Waiting says that is
// journaled already. A budget wait ends with budget_raised, an anomaly
// wait with approval_received for StepID (or a cancel).
type Park struct {
	Reason  string
	StepID  string
	Waiting bool
}

func (Note) isAction() {}
func (Park) isAction() {}

// Pause is a run parked on a brake.
type Pause struct {
	Reason string `json:"reason"` // event.WaitBudget or event.WaitAnomaly
	StepID string `json:"step_id"`
	// Key is the anomaly the pause is for (anomaly pauses).
	Key string `json:"anomaly,omitempty"`
	// Rejected is set when an approver rejected an anomaly pause: the
	// run fails.
	Rejected *event.ApprovalReceivedData `json:"rejected,omitempty"`
}

// Spend is what a run has spent, from its journal: the usage of its
// steps (a subagent step carries its child's), the steps it started and
// its age.
type Spend struct {
	CostUSD float64 `json:"cost_usd"`
	Tokens  int64   `json:"tokens"`
	Steps   int64   `json:"steps"`
}

// DefaultWarnAt is a budget's warnAt when it sets none.
const DefaultWarnAt = 0.8

// DefaultOutputTokens is the output a call with no maxTokens is assumed
// to spend in the worst case a budget checks.
const DefaultOutputTokens = 4096

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

// ParseAnomalySettings reads the settings' anomaly defaults:
// PAL_ANOMALY_<TYPE> (PAL_ANOMALY_RUNAWAY_LOOP, …) holds comma-separated
// key=value pairs, threshold, perStep, requests, floor, action, e.g.
// "threshold=3,action=pause". Errors name the variable.
func ParseAnomalySettings(getenv func(string) string) (map[string]event.AnomalyRule, error) {
	out := map[string]event.AnomalyRule{}
	for _, t := range AnomalyTypes {
		name := "PAL_ANOMALY_" + strings.ToUpper(t)
		v := strings.TrimSpace(getenv(name))
		if v == "" {
			continue
		}
		if len(v) > 256 {
			return nil, fmt.Errorf("%s: %d bytes; the limit is 256", name, len(v))
		}
		var r event.AnomalyRule
		for _, kv := range strings.Split(v, ",") {
			k, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
			if !ok {
				return nil, fmt.Errorf("%s: %q is not key=value (keys: threshold, perStep, requests, floor, action)", name, kv)
			}
			if k == "action" {
				switch val {
				case event.ActionRecord, event.ActionHalt, event.ActionPause:
					r.Action = val
					continue
				}
				return nil, fmt.Errorf("%s: action %q: want record, halt or pause", name, val)
			}
			f, err := strconv.ParseFloat(val, 64)
			if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) || f > 1e9 {
				return nil, fmt.Errorf("%s: %s=%q: want a number from 0 to 1e9", name, k, val)
			}
			switch k {
			case "threshold":
				r.Threshold = f
			case "perStep":
				r.PerStep = f
			case "requests":
				r.Requests = f
			case "floor":
				r.Floor = f
			default:
				return nil, fmt.Errorf("%s: unknown key %q (keys: threshold, perStep, requests, floor, action)", name, k)
			}
		}
		out[t] = r
	}
	return out, nil
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

// Spent is what st has spent, from the journal alone: a drive killed
// mid-step neither counts the step twice nor forgets it, because only
// journaled usage counts.
func (st *RunState) Spent() Spend {
	return Spend{CostUSD: st.Usage.CostUSD, Tokens: st.Usage.TotalTokens, Steps: st.StepsStarted}
}

// acting reports whether a step of nodeType with id stepID acts (calls a
// model, a tool, a connector, a child run): the steps a budget's
// maxSteps and excessive_steps count. An agent's turns and tool calls
// act; its final answer does not.
func acting(nodeType, stepID string) bool {
	switch nodeType {
	case workflow.TypeAIStep, workflow.TypeTool, workflow.TypeConnector, workflow.TypeSubagent:
		return true
	case workflow.TypeAgent:
		return strings.Contains(stepID, ".turn[")
	}
	return false
}

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

// brakes is the fold's part of the brakes.
type brakes struct {
	rules map[string]event.AnomalyRule
	// candidates are anomalies seen in the journal, in the order seen;
	// Next journals each one that is not journaled yet.
	candidates []event.AnomalyDetectedData
	candKeys   map[string]bool
	toolCalls  map[string]int
	requests   map[[32]byte]int
	// turnKeys is, per agent (the step id before ".turn["), the request
	// key of its latest turn: a turn journals only its new messages, so
	// its request is named by the previous turn's key and its own input.
	turnKeys map[string][32]byte
	retries  int
	costs    []float64 // sorted
	tokens   []float64 // sorted
}

func anomalyKey(typ, stepID string) string { return typ + "@" + stepID }

func (st *RunState) initBrakes() {
	st.Budget = nil
	if b := st.Created.Budget; b != nil {
		cp := *b
		st.Budget = &cp
	}
	st.Warned = map[string]bool{}
	st.Anomalies = map[string]event.AnomalyDetectedData{}
	st.cleared = map[string]bool{}
	rules := st.Created.Anomalies
	if rules == nil {
		rules = DefaultAnomalies
	}
	st.br = brakes{rules: rules, candKeys: map[string]bool{}, toolCalls: map[string]int{}, requests: map[[32]byte]int{}, turnKeys: map[string][32]byte{}}
}

func (b *brakes) candidate(d event.AnomalyDetectedData) {
	k := anomalyKey(d.Type, d.StepID)
	if b.candKeys[k] {
		return
	}
	b.candKeys[k] = true
	d.Action = b.rules[d.Type].Action
	if d.Action == "" {
		d.Action = event.ActionRecord
	}
	b.candidates = append(b.candidates, d)
}

// seeStarted looks at a step's first step_started: identical LLM
// requests (runaway_loop).
func (st *RunState) seeStarted(stepID, nodeType string, input json.RawMessage) {
	isLLM := nodeType == workflow.TypeAIStep || (nodeType == workflow.TypeAgent && strings.Contains(stepID, ".turn[") && !strings.Contains(stepID, ".tool["))
	r := st.br.rules[event.AnomalyRunawayLoop]
	if !isLLM || r.Requests <= 0 || len(input) == 0 {
		return
	}
	k := sha256.Sum256(input)
	if agent, _, ok := strings.Cut(stepID, ".turn["); ok && nodeType == workflow.TypeAgent {
		// The whole conversation, not just the turn's new messages, is
		// the request: chain the keys of the agent's turns.
		if prev, ok := st.br.turnKeys[agent]; ok && !strings.HasPrefix(stepID[len(agent):], ".turn[0]") {
			k = sha256.Sum256(append(prev[:], input...))
		}
		st.br.turnKeys[agent] = k
	}
	st.br.requests[k]++
	if n := st.br.requests[k]; float64(n) == math.Ceil(r.Requests) {
		st.br.candidate(event.AnomalyDetectedData{Type: event.AnomalyRunawayLoop, Observed: float64(n), Threshold: r.Requests,
			StepID: stepID, Detail: fmt.Sprintf("the same LLM request was sent %d times", n)})
	}
}

// seeCompleted looks at a completed step: the tool calls an agent turn
// asks for (runaway_loop) and an LLM step's usage (the spikes).
func (st *RunState) seeCompleted(s *Step, usage *event.Usage, output json.RawMessage) {
	turn := s.NodeType == workflow.TypeAgent && strings.Contains(s.ID, ".turn[") && !strings.Contains(s.ID, ".tool[")
	if turn {
		r := st.br.rules[event.AnomalyRunawayLoop]
		var out LLMOutput
		if r.Threshold > 0 && json.Unmarshal(output, &out) == nil {
			agent := s.ID[:strings.LastIndex(s.ID, ".turn[")]
			for _, c := range out.ToolCalls {
				k := agent + "\x00" + c.Name + "\x00" + canonicalJSON(c.Arguments)
				st.br.toolCalls[k]++
				if n := st.br.toolCalls[k]; float64(n) == math.Ceil(r.Threshold) {
					st.br.candidate(event.AnomalyDetectedData{Type: event.AnomalyRunawayLoop, Observed: float64(n),
						Threshold: r.Threshold, StepID: s.ID, Detail: fmt.Sprintf("agent %s asked for tool %s with the same arguments %d times: %s",
							agent, c.Name, n, truncate(canonicalJSON(c.Arguments), 200))})
				}
			}
		}
	}
	if usage == nil || !(turn || s.NodeType == workflow.TypeAIStep) {
		return
	}
	spike := func(typ string, sorted *[]float64, v float64, unit string) {
		r := st.br.rules[typ]
		if len(*sorted) >= spikeSamples && r.Threshold > 0 {
			m := median(*sorted)
			if v > r.Threshold*m && v > r.Floor {
				st.br.candidate(event.AnomalyDetectedData{Type: typ, Observed: v, Threshold: r.Threshold * m, StepID: s.ID,
					Detail: fmt.Sprintf("step %s spent %s %s, over %s× the run's median step (%s) and the floor (%s)",
						s.ID, fmtNum(v), unit, fmtNum(r.Threshold), fmtNum(m), fmtNum(r.Floor))})
			}
		}
		i, _ := slices.BinarySearch(*sorted, v)
		*sorted = slices.Insert(*sorted, i, v)
	}
	spike(event.AnomalyCostSpike, &st.br.costs, usage.CostUSD, "USD")
	spike(event.AnomalyTokenSpike, &st.br.tokens, float64(usage.TotalTokens), "tokens")
}

// seeRetry looks at a step_retrying (retry_storm).
func (st *RunState) seeRetry(s *Step) {
	r := st.br.rules[event.AnomalyRetryStorm]
	st.br.retries++
	if r.Threshold > 0 && float64(st.br.retries) == math.Ceil(r.Threshold)+1 {
		st.br.candidate(event.AnomalyDetectedData{Type: event.AnomalyRetryStorm, Observed: float64(st.br.retries),
			Threshold: r.Threshold, StepID: s.ID, Detail: fmt.Sprintf("%d retries in the run", st.br.retries)})
	}
	if r.PerStep > 0 && float64(s.Retries) == math.Ceil(r.PerStep)+1 {
		st.br.candidate(event.AnomalyDetectedData{Type: event.AnomalyRetryStorm, Observed: float64(s.Retries),
			Threshold: r.PerStep, StepID: s.ID, Detail: fmt.Sprintf("%d retries of step %s", s.Retries, s.ID)})
	}
}

func median(sorted []float64) float64 {
	n := len(sorted)
	if n%2 == 1 {
		return sorted[n/2]
	}
	return (sorted[n/2-1] + sorted[n/2]) / 2
}

// canonicalJSON renders raw with sorted keys and no spaces, so equal
// arguments compare equal however the model spaced them.
func canonicalJSON(raw json.RawMessage) string {
	v := decode(raw)
	if v == nil {
		return "{}"
	}
	b, err := json.Marshal(v)
	if err != nil {
		return string(raw)
	}
	return string(b)
}

// applyBrake folds the brakes' own kinds and the inputs that release
// them.
func (st *RunState) applyBrake(ev event.Event) error {
	switch ev.Kind {
	case event.AnomalyDetected:
		var d event.AnomalyDetectedData
		if err := ev.DecodeData(&d); err != nil {
			return err
		}
		if d.Type == "" {
			return nil // the pre-release shape: recorded, nothing else
		}
		k := anomalyKey(d.Type, d.StepID)
		if _, ok := st.Anomalies[k]; !ok {
			st.Anomalies[k] = d
			st.AnomalyOrder = append(st.AnomalyOrder, k)
		}
	case event.BudgetWarning:
		var d event.BudgetWarningData
		if err := ev.DecodeData(&d); err != nil {
			return err
		}
		st.Warned[d.Limit] = true
	case event.BudgetExceeded:
		var d event.BudgetExceededData
		if err := ev.DecodeData(&d); err != nil {
			return err
		}
		st.Exceeded = &d
	case event.BudgetRaised:
		var d event.BudgetRaisedData
		if err := ev.DecodeData(&d); err != nil {
			return err
		}
		if b := st.Budget; b != nil {
			// Only limits that are set grow: adding to "no limit" would
			// make one.
			if b.MaxCostUSD > 0 {
				b.MaxCostUSD += d.AddUSD
			}
			if b.MaxTokens > 0 {
				b.MaxTokens += d.AddTokens
			}
			if b.MaxSteps > 0 {
				b.MaxSteps += d.AddSteps
			}
			if b.MaxDurationMs > 0 {
				b.MaxDurationMs += d.AddMs
			}
		}
		st.Exceeded = nil
		if st.Pause != nil && st.Pause.Reason == event.WaitBudget {
			st.Pause = nil
		}
	}
	return nil
}

// parkOn folds a step_waiting whose reason is a brake: the run waits,
// and no step changes.
func (st *RunState) parkOn(reason, stepID string) {
	p := &Pause{Reason: reason, StepID: stepID}
	if reason == event.WaitAnomaly {
		for _, k := range st.AnomalyOrder {
			if a := st.Anomalies[k]; a.Action == event.ActionPause && !st.cleared[k] {
				p.Key = k
				break
			}
		}
	}
	st.Pause = p
	st.Status = StatusWaiting
	st.DriveOpen = false
}

// decidePause folds an approval_received that decides an anomaly pause;
// it reports false for any other decision.
func (st *RunState) decidePause(stepID string, d event.ApprovalReceivedData) bool {
	p := st.Pause
	if p == nil || p.Reason != event.WaitAnomaly || p.StepID != stepID {
		return false
	}
	if d.Decision == event.DecisionApprove {
		st.cleared[p.Key] = true
		st.Pause = nil
		return true
	}
	p.Rejected = &d
	return true
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
		needTokens, needCost, priced = EstimateCall(p.Call())
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
// the request, plus its maxTokens (DefaultOutputTokens when unset), and
// what that costs at the model's price. priced is false for a model the
// price table does not know: only token, step and time limits hold it.
func EstimateCall(input json.RawMessage) (tokens, costUSD float64, priced bool) {
	var in AIInput
	_ = json.Unmarshal(input, &in)
	inTok := math.Ceil(float64(len(input)) / 4)
	outTok := float64(in.MaxTokens)
	if outTok <= 0 {
		outTok = DefaultOutputTokens
	}
	pin, pout, ok := provider.PriceOf(in.Model)
	if !ok {
		return inTok + outTok, 0, false
	}
	return inTok + outTok, (inTok*pin + outTok*pout) / 1e6, true
}

// PendingAnomalies lists the anomalies the journal shows that are not
// journaled yet, in order (for tests and tools).
func (st *RunState) PendingAnomalies() []event.AnomalyDetectedData {
	var out []event.AnomalyDetectedData
	for _, c := range st.br.candidates {
		if _, ok := st.Anomalies[anomalyKey(c.Type, c.StepID)]; !ok {
			out = append(out, c)
		}
	}
	return out
}

// AnomalyList returns the journaled anomalies in order.
func (st *RunState) AnomalyList() []event.AnomalyDetectedData {
	out := make([]event.AnomalyDetectedData, 0, len(st.AnomalyOrder))
	for _, k := range st.AnomalyOrder {
		out = append(out, st.Anomalies[k])
	}
	return out
}
