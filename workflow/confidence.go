package workflow

import (
	"encoding/json"
	"strings"
)

// Confidence sources: where a gated step's score comes from.
const (
	// ConfidenceLogprobs: exp of the mean token log probability of the
	// answer, from the provider (OpenAI; Anthropic gives none).
	ConfidenceLogprobs = "logprobs"
	// ConfidenceField: a number in 0..1 at Field in the answer, which is
	// JSON.
	ConfidenceField = "field"
	// ConfidenceJudge: a second model call (Judge) rates the answer with a
	// number in 0..1.
	ConfidenceJudge = "judge"
)

// What a gated step does when its score is below Min.
const (
	OnLowFail     = "fail"     // the step fails; the run fails with low_confidence
	OnLowApproval = "approval" // the run waits for a human to accept or reject the answer
	OnLowRetry    = "retry"    // the step is tried again, within its retry policy
	OnLowRoute    = "route"    // the step completes; edges decide on output.confidence
)

// Policy values of confidenceGate.
const (
	GateOn  = "on"
	GateOff = "off"
)

// GateOff reports whether the workflow turns confidence gates off.
func (w *Workflow) GateOff() bool {
	return w != nil && w.Policy != nil && w.Policy.ConfidenceGate == GateOff
}

// ConfidenceJudgeData is the judge of a judge-scored gate: the model that
// rates the answer. Prompt is its system prompt; the answer is the user
// message; its reply must be a number from 0 to 1.
type ConfidenceJudgeData struct {
	Provider string `json:"provider"`
	Model    string `json:"model"`
	Prompt   string `json:"prompt"`
}

// ConfidenceGate is the data.confidence of an ai-step or agent node: the
// step's answer is scored once, and a score below Min is handled as OnLow
// says.
type ConfidenceGate struct {
	Min    float64              `json:"min"`
	Source string               `json:"source"`
	Field  string               `json:"field,omitempty"`
	Judge  *ConfidenceJudgeData `json:"judge,omitempty"`
	OnLow  string               `json:"onLow,omitempty"`
}

// Action is OnLow, "fail" when unset.
func (g *ConfidenceGate) Action() string {
	if g.OnLow == "" {
		return OnLowFail
	}
	return g.OnLow
}

// FieldPath splits Field ("a.b.c") into its keys.
func (g *ConfidenceGate) FieldPath() []string { return strings.Split(g.Field, ".") }

// Confidence returns the confidence gate of an ai-step or agent node, or
// nil when it has none (or is of another type).
func (n *Node) Confidence() *ConfidenceGate {
	if n.Type != TypeAIStep && n.Type != TypeAgent {
		return nil
	}
	var d struct {
		Confidence *ConfidenceGate `json:"confidence"`
	}
	if len(n.Data) == 0 || json.Unmarshal(n.Data, &d) != nil {
		return nil
	}
	return d.Confidence
}

// noLogprobs lists the providers known to return no token log
// probabilities: a logprobs gate on them could never score.
var noLogprobs = map[string]bool{"anthropic": true}

// checkConfidence reports the problems of a node's confidence gate that the
// schema cannot see.
func checkConfidence(n *Node, providers []string, retry *RetryPolicy, ps *problems) {
	g := n.Confidence()
	if g == nil {
		return
	}
	switch g.Source {
	case ConfidenceLogprobs:
		for _, provider := range providers {
			if noLogprobs[provider] {
				ps.node(n.ID, "data.confidence.source", `provider %q returns no log probabilities: use "field" or "judge"`, provider)
				break
			}
		}
	case ConfidenceField:
		if g.Field == "" {
			ps.node(n.ID, "data.confidence.field", `source "field" needs field: the path of the score in the JSON answer (e.g. "confidence")`)
		}
		for _, k := range g.FieldPath() {
			if k == "" && g.Field != "" {
				ps.node(n.ID, "data.confidence.field", "%q has an empty key (write keys joined by dots: a.b.c)", g.Field)
				break
			}
		}
	case ConfidenceJudge:
		if g.Judge == nil {
			ps.node(n.ID, "data.confidence.judge", `source "judge" needs judge: {provider, model, prompt}`)
		}
	}
	if g.Action() == OnLowRetry && retry.Attempts() < 2 {
		ps.node(n.ID, "data.confidence.onLow", `"retry" needs retry.maxAttempts of 2 or more`)
	}
}
