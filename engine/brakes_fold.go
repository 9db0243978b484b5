package engine

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/workflow"
)

// The brakes' fold side: what was spent (Spent) and seen (the anomaly
// candidates, seeStarted, seeCompleted, seeRetry), the brakes' own kinds
// and the inputs that release a brake.

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

func (st *RunState) onAnomalyDetected(_ event.Event, d event.AnomalyDetectedData) error {
	if d.Type == "" {
		return nil // the pre-release shape: recorded, nothing else
	}
	k := anomalyKey(d.Type, d.StepID)
	if _, ok := st.Anomalies[k]; !ok {
		st.Anomalies[k] = d
		st.AnomalyOrder = append(st.AnomalyOrder, k)
	}
	return nil
}

func (st *RunState) onBudgetWarning(_ event.Event, d event.BudgetWarningData) error {
	st.Warned[d.Limit] = true
	return nil
}

func (st *RunState) onBudgetExceeded(_ event.Event, d event.BudgetExceededData) error {
	st.Exceeded = &d
	return nil
}

// onBudgetRaised grows the limits the run has, and releases a budget
// pause.
func (st *RunState) onBudgetRaised(_ event.Event, d event.BudgetRaisedData) error {
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
