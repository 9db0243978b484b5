package workers

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/workflow"
)

// judgeMaxTokens bounds the judge's answer: a number.
const judgeMaxTokens = 16

// score computes the confidence of a gated step's answer, once: from the
// answer's token log probabilities, from a field of its JSON, or from a
// judge's call. It returns the judge's usage, if a judge was called. An
// answer that cannot be scored fails the step (permanently: trying again
// would ask the same question of the same answer).
func (c *call) score(g *workflow.ConfidenceGate, resp *provider.Response) (float64, *event.Usage, error) {
	p := c.p
	switch g.Source {
	case workflow.ConfidenceLogprobs:
		if len(resp.Logprobs) == 0 {
			return 0, nil, permanent("step %s: confidence source logprobs: the answer has no token log probabilities "+
				"(OpenAI gives them; Anthropic does not)", p.StepID)
		}
		return scoreLogprobs(resp.Logprobs), nil, nil
	case workflow.ConfidenceField:
		s, err := scoreField(resp.Text, g.FieldPath())
		if err != nil {
			return 0, nil, permanent("step %s: confidence field %q: %v", p.StepID, g.Field, err)
		}
		return s, nil, nil
	case workflow.ConfidenceJudge:
		return c.judge(g.Judge, resp.Text)
	}
	return 0, nil, permanent("step %s: unknown confidence source %q", p.StepID, g.Source)
}

// scoreLogprobs is exp of the mean token log probability: the geometric
// mean of the tokens' probabilities, in 0..1.
func scoreLogprobs(lps []float64) float64 {
	sum := 0.0
	for _, lp := range lps {
		sum += min(lp, 0)
	}
	return math.Exp(sum / float64(len(lps)))
}

// fence matches an answer wrapped in a Markdown code block.
var fence = regexp.MustCompile("(?s)^```[a-zA-Z]*\\s*(.*?)\\s*```$")

// scoreField reads the number at path in text, a JSON answer (a Markdown
// code block around it is allowed).
func scoreField(text string, path []string) (float64, error) {
	text = strings.TrimSpace(text)
	if m := fence.FindStringSubmatch(text); m != nil {
		text = m[1]
	}
	dec := json.NewDecoder(bytes.NewReader([]byte(text)))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return 0, errors.New("the answer is not JSON")
	}
	for _, k := range path {
		m, ok := v.(map[string]any)
		if !ok {
			return 0, fmt.Errorf("no object holds %q in the answer", k)
		}
		if v, ok = m[k]; !ok {
			return 0, fmt.Errorf("the answer has no %q", k)
		}
	}
	n, ok := v.(json.Number)
	if !ok {
		return 0, fmt.Errorf("the answer's value %v is not a number", v)
	}
	return unitScore(n.String())
}

// unitScore parses a score, which must be in 0..1.
func unitScore(s string) (float64, error) {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(f) || f < 0 || f > 1 {
		return 0, fmt.Errorf("%q is not a score from 0 to 1", s)
	}
	return f, nil
}

// number finds the first number in a judge's answer.
var number = regexp.MustCompile(`[-+]?(\d+(\.\d*)?|\.\d+)`)

// judge asks the judge model to rate answer, with its own idempotency key
// (the step's, suffixed): a re-driven step that had not journaled its
// score asks again with the same key.
func (c *call) judge(j *workflow.ConfidenceJudgeData, answer string) (float64, *event.Usage, error) {
	p := c.p
	if j == nil {
		return 0, nil, permanent("step %s: confidence source judge has no judge", p.StepID)
	}
	prov, err := c.d.w.providers.Get(j.Provider)
	if err != nil {
		return 0, nil, permanent("step %s: confidence judge: %v", p.StepID, err)
	}
	resp, err := c.d.complete(c.ctx, prov, provider.Request{Model: j.Model, System: j.Prompt, MaxTokens: judgeMaxTokens,
		Messages:       []provider.Message{{Role: provider.RoleUser, Content: answer}},
		IdempotencyKey: p.Key + ".judge"}, nil, p.TimeoutMs)
	if err != nil {
		return 0, nil, err
	}
	u := engine.UsageAt(c.prices, resp.Model, j.Model, resp.Usage)
	m := number.FindString(resp.Text)
	if m == "" {
		return 0, nil, permanent("step %s: confidence judge answered %q, not a number from 0 to 1", p.StepID, clip(resp.Text, 80))
	}
	s, err := unitScore(m)
	if err != nil {
		return 0, nil, permanent("step %s: confidence judge: %v", p.StepID, err)
	}
	return s, u, nil
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// runGate carries out the verdict on a gated step whose score is journaled:
// complete it with the journaled answer (after confidence_gate_bypassed
// when an approver accepted a low score), retry it with its next attempt,
// or fail it with class confidence, which fails the run with
// low_confidence.
func (d *drive) runGate(p engine.StepPlan) error {
	g := p.Gate
	switch g.Verdict() {
	case engine.GateBypass:
		by := g.Decision.Approver
		if by == "" {
			by = "approver"
		}
		reason := g.Decision.Comment
		if reason == "" {
			reason = fmt.Sprintf("accepted confidence %.4g below the min of %.4g", g.Score, g.Min)
		}
		d.emit(event.ConfidenceGateBypassed, p.StepID, p.Attempt, event.ConfidenceGateBypassedData{By: by, Reason: reason})
		fallthrough
	case engine.GateComplete:
		d.emit(event.StepCompleted, p.StepID, p.Attempt, event.StepCompletedData{Output: g.Output, Usage: g.Usage})
		return nil
	case engine.GateRetry:
		pol := p.Node.Retry()
		if of := pol.Attempts(); p.Tries+1 < of {
			delay := retryDelay(pol, p.Tries+1)
			d.log.Info("confidence below min; retrying", "step_id", p.StepID, "score", g.Score, "min", g.Min, "delay", delay)
			d.emit(event.StepRetrying, p.StepID, p.Attempt, event.StepRetryingData{Attempt: p.Attempt + 1, Of: of,
				Error: g.LowError(p.StepID), Class: event.ClassConfidence, DelayMs: delay.Milliseconds(), Fallback: p.Fallback})
			return d.flush()
		}
	}
	d.emit(event.StepFailed, p.StepID, p.Attempt, event.StepFailedData{Error: g.LowError(p.StepID), Class: event.ClassConfidence})
	return nil
}
