package runs

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/palrun/pal/workflow"

	"github.com/palrun/pal/event"
)

// Command kinds: the last token of pal.cmd.runs.<kind>.
const (
	CmdStart   = "start"
	CmdApprove = "approve"
	CmdCancel  = "cancel"
	CmdSignal  = "signal"
	CmdBudget  = "budget"
	// CmdDeploy counts refused deploys (pal_commands_refused_total); a
	// deploy is no durable command.
	CmdDeploy = "deploy"
)

// MaxCommandBytes bounds a command body (and REST bodies, and what the
// CLI reads from a file or stdin).
const MaxCommandBytes = 1 << 20

// MaxTextBytes bounds the free text a command carries into the journal: an
// approval comment, a cancel reason. MaxNameBytes bounds names: a step id,
// an approver, a canceller, a signal name, an idempotency key.
const (
	MaxTextBytes = 4 << 10
	MaxNameBytes = 256
)

// checkLen refuses a value over limit bytes, naming the field and limit.
func checkLen(field, v string, limit int) error {
	if len(v) > limit {
		return &InputError{Field: field, Msg: fmt.Sprintf("%d bytes; the limit is %d", len(v), limit)}
	}
	return nil
}

// StartCommand starts a run: pal.cmd.runs.start, pal.api.runs.start,
// POST /v1/runs, pal run start.
type StartCommand struct {
	// Workflow names a deployed workflow, a JSON string: "triage" (its
	// latest version) or "triage@3". Or it is a definition, a JSON
	// object, validated before anything is written and deployed first
	// (RightDeploy), so the run is of a deployed version.
	Workflow json.RawMessage `json:"workflow,omitempty"`
	// LLM, instead of Workflow, starts a plain-LLM run: one model call, or
	// with tools an agent loop, through the same journal as a graph.
	LLM *LLMSpec `json:"llm,omitempty"`
	// Input is the run input (any JSON value; {} when empty).
	Input json.RawMessage `json:"input,omitempty"`
	// RunID is optional: derived from IdempotencyKey when that is set
	// (RunIDForKey), else fresh.
	RunID string `json:"run_id,omitempty"`
	// IdempotencyKey makes starts idempotent: the same key always maps to
	// the same run, which is created once. At most MaxNameBytes.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	ReplyTo        string `json:"reply_to,omitempty"`
	// Budget narrows the workflow's policy.budget for this run (same
	// shape); a limit over the workflow's is refused, not clamped.
	Budget *workflow.Budget `json:"budget,omitempty"`
	// Labels are journaled in run_created, for listings and search
	// (GET /v1/runs?label=k=v); event.CheckLabels bounds them.
	Labels Labels `json:"labels,omitempty"`
	// Thread names the conversation the run's thread steps (an ai-step
	// or agent with thread: true) continue, created on first use;
	// journaled in run_created. event.ValidateThreadID bounds it.
	Thread string `json:"thread,omitempty"`

	// TriggerMeta is recorded in run_created (not settable from JSON).
	TriggerMeta map[string]any `json:"-"`
	// By names who creates the run (the worker_id of run_created); the
	// transport sets it from the caller's identity.
	By string `json:"-"`
	// Rights is what the caller may do, as the transport established it:
	// a deployed workflow needs RightStart, a definition or llm also
	// RightDeploy.
	Rights Rights `json:"-"`
	// forkedFrom is set by Fork and Retry.
	forkedFrom *event.ForkedFrom
	// schedule and tick are set by a schedule's start (schedule.go).
	schedule, tick string
}

// ref returns the deployed workflow the command names, ok false when it
// brings a definition or an llm spec instead. Call after Validate.
func (c *StartCommand) ref() (WorkflowRef, bool) {
	b := bytes.TrimSpace(c.Workflow)
	if len(b) == 0 || b[0] != '"' {
		return WorkflowRef{}, false
	}
	var s string
	if json.Unmarshal(b, &s) != nil {
		return WorkflowRef{}, false
	}
	r, err := ParseWorkflowRef("workflow", s)
	return r, err == nil
}

func (c *StartCommand) replySubject() string { return c.ReplyTo }

// ApproveCommand decides an approval step.
type ApproveCommand struct {
	RunID    string `json:"run_id"`
	StepID   string `json:"step_id"`
	Decision string `json:"decision"` // approve or reject
	// Approved may stand in for Decision: true is approve, false reject.
	Approved *bool  `json:"approved,omitempty"`
	Approver string `json:"approver"`
	Comment  string `json:"comment,omitempty"`
	ReplyTo  string `json:"reply_to,omitempty"`
}

func (c *ApproveCommand) replySubject() string { return c.ReplyTo }

// CancelCommand cancels a run.
type CancelCommand struct {
	RunID   string `json:"run_id"`
	Reason  string `json:"reason,omitempty"`
	By      string `json:"by,omitempty"`
	ReplyTo string `json:"reply_to,omitempty"`
}

func (c *CancelCommand) replySubject() string { return c.ReplyTo }

// BudgetCommand raises a run's budget: pal.cmd.runs.budget,
// pal.api.runs.budget, POST /v1/runs/{id}/budget, pal run budget. Each
// add goes to a limit the run has; a run paused on its budget goes on
// if the step it stopped at now fits.
type BudgetCommand struct {
	RunID     string  `json:"run_id"`
	AddUSD    float64 `json:"add_usd,omitempty"`
	AddTokens int64   `json:"add_tokens,omitempty"`
	AddSteps  int64   `json:"add_steps,omitempty"`
	AddMs     int64   `json:"add_ms,omitempty"`
	By        string  `json:"by,omitempty"`
	ReplyTo   string  `json:"reply_to,omitempty"`
}

func (c *BudgetCommand) replySubject() string { return c.ReplyTo }

// MaxBudgetAdd bounds one raise of each limit (USD, tokens, steps, ms),
// so a typo cannot make a budget meaningless.
const MaxBudgetAdd = 1e12

// Validate checks a budget command.
func (c *BudgetCommand) Validate() error {
	if err := checkRunID("run_id", c.RunID); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		v    float64
	}{{"add_usd", c.AddUSD}, {"add_tokens", float64(c.AddTokens)}, {"add_steps", float64(c.AddSteps)}, {"add_ms", float64(c.AddMs)}} {
		if f.v < 0 || f.v > MaxBudgetAdd || f.v != f.v {
			return &InputError{Field: f.name, Msg: fmt.Sprintf("%v: want a number from 0 to %g (a budget only grows)", f.v, MaxBudgetAdd)}
		}
	}
	if c.AddUSD == 0 && c.AddTokens == 0 && c.AddSteps == 0 && c.AddMs == 0 {
		return &InputError{Field: "add_usd", Msg: "nothing to add: give add_usd, add_tokens, add_steps or add_ms"}
	}
	return checkLen("by", c.By, MaxNameBytes)
}

// SignalCommand sends a named signal to a run: pal.cmd.runs.signal,
// POST /v1/runs/{id}/signals/{name}, pal run signal.
type SignalCommand struct {
	RunID string `json:"run_id"`
	// Signal is the signal's name; Name may stand in for it.
	Signal  string          `json:"signal,omitempty"`
	Name    string          `json:"name,omitempty"`
	Payload json.RawMessage `json:"payload,omitempty"`
	// By names the sender (journaled); the transport sets it when empty.
	By      string `json:"by,omitempty"`
	ReplyTo string `json:"reply_to,omitempty"`
}

func (c *SignalCommand) replySubject() string { return c.ReplyTo }

// MaxSignalPayloadBytes bounds a signal's payload, and MaxPendingSignals
// how many signals of one name a run keeps that no wait node has taken.
const (
	MaxSignalPayloadBytes = 64 << 10
	MaxPendingSignals     = 100
)

// DecodeStrict decodes one JSON object into v, refusing unknown fields,
// wrong types, trailing data and bodies over MaxCommandBytes, with an
// *InputError naming the field.
func DecodeStrict(body []byte, v any) error {
	if len(body) > MaxCommandBytes {
		return &InputError{Msg: fmt.Sprintf("body is %d bytes; the limit is %d", len(body), MaxCommandBytes)}
	}
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return &InputError{Msg: "empty body: want a JSON object"}
	}
	if body[0] != '{' {
		return &InputError{Msg: "want a JSON object"}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return decodeError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return &InputError{Msg: "unexpected data after the JSON object"}
	}
	return nil
}

// Labels are a start's labels: a JSON object of strings.
type Labels map[string]string

// UnmarshalJSON decodes labels, refusing what encoding/json would let
// through into a map of strings: a null value (it would read as "").
// Errors name the field labels or labels.KEY.
func (l *Labels) UnmarshalJSON(b []byte) error {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return &InputError{Field: "labels", Msg: "want an object of strings, e.g. {\"customer\": \"acme\"}"}
	}
	if raw == nil {
		*l = nil
		return nil
	}
	if len(raw) > event.MaxLabels {
		// Before decoding the values: a flood of labels is refused at its size.
		return &InputError{Field: "labels", Msg: fmt.Sprintf("%d labels; the limit is %d", len(raw), event.MaxLabels)}
	}
	out := make(Labels, len(raw))
	for _, k := range slices.Sorted(maps.Keys(raw)) { // the same body, the same first error
		v := raw[k]
		var s string
		if err := event.CheckLabelKey(k); err != nil {
			return &InputError{Field: "labels", Msg: err.Error()}
		}
		if bytes.Equal(v, []byte("null")) || json.Unmarshal(v, &s) != nil {
			return &InputError{Field: "labels." + k, Msg: "want a string"}
		}
		out[k] = s
	}
	*l = out
	return nil
}

func decodeError(err error) error {
	var ie *InputError
	if errors.As(err, &ie) {
		return ie
	}
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return &InputError{Msg: fmt.Sprintf("malformed JSON at byte %d: %v", se.Offset, se)}
	case errors.As(err, &te):
		field := te.Field
		if field == "" {
			field = "body"
		}
		if num, ok := strings.CutPrefix(te.Value, "number "); ok {
			return &InputError{Field: field, Msg: numberError(num, te.Type)}
		}
		return &InputError{Field: field, Msg: fmt.Sprintf("wrong type: got %s, want %s", te.Value, jsonType(te.Type.Kind().String()))}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &InputError{Msg: "malformed JSON: unexpected end"}
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		f := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return &InputError{Field: f, Msg: "unknown field"}
	default:
		return &InputError{Msg: "malformed JSON: " + err.Error()}
	}
}

// numberError says why a JSON number did not decode into a field of type
// t: a number is the right type, so it is out of range for the field, or
// not a whole number (in digits) where one is wanted.
func numberError(num string, t reflect.Type) string {
	shown := truncate(num, 40)
	f, err := strconv.ParseFloat(num, 64)
	var fits bool
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		limit := math.Ldexp(1, t.Bits()-1)
		fits = f >= -limit && f < limit
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		fits = f >= 0 && f < math.Ldexp(1, t.Bits())
	case reflect.Float32, reflect.Float64:
		return shown + ": out of range"
	default:
		return shown + ": wrong type: want " + jsonType(t.Kind().String())
	}
	switch {
	case err != nil || !fits: // err: beyond even a float64
		return shown + ": out of range"
	case f != math.Trunc(f):
		return shown + ": must be a whole number"
	default:
		return shown + ": must be a whole number written in digits (no fraction or exponent)"
	}
}

func jsonType(kind string) string {
	switch kind {
	case "string":
		return "a string"
	case "bool":
		return "true or false"
	case "int", "int64", "float64", "uint64":
		return "a number"
	case "slice":
		return "an array"
	case "map", "struct":
		return "an object"
	}
	return kind
}

// Validate checks a start command's fields (the workflow graph itself is
// parsed and validated by Client.Start).
func (c *StartCommand) Validate() error {
	if err := checkLen("idempotency_key", c.IdempotencyKey, MaxNameBytes); err != nil {
		return err
	}
	if c.RunID != "" {
		if err := checkRunID("run_id", c.RunID); err != nil {
			return err
		}
	}
	if in := bytes.TrimSpace(c.Input); len(in) > 0 && !json.Valid(in) {
		return &InputError{Field: "input", Msg: "not valid JSON"}
	}
	if err := event.CheckLabels(c.Labels); err != nil {
		return &InputError{Field: "labels", Msg: err.Error()}
	}
	if c.Thread != "" {
		if err := event.ValidateThreadID(c.Thread); err != nil {
			return &InputError{Field: "thread", Msg: err.Error()}
		}
	}
	hasWF := len(bytes.TrimSpace(c.Workflow)) > 0 && string(bytes.TrimSpace(c.Workflow)) != "null"
	switch {
	case c.LLM != nil && hasWF:
		return &InputError{Field: "llm", Msg: "give either workflow or llm, not both"}
	case c.LLM != nil:
		return c.validateBudget()
	case !hasWF:
		return &InputError{Field: "workflow", Msg: "required: a deployed workflow's name (NAME or NAME@VERSION), or the workflow graph as a JSON object (or llm for a plain model call)"}
	}
	switch b := bytes.TrimSpace(c.Workflow); b[0] {
	case '{':
	case '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return &InputError{Field: "workflow", Msg: "not a valid JSON string"}
		}
		if _, err := ParseWorkflowRef("workflow", s); err != nil {
			return err
		}
	default:
		return &InputError{Field: "workflow", Msg: "want a deployed workflow's name (a string: NAME or NAME@VERSION) or the workflow graph (a JSON object)"}
	}
	return c.validateBudget()
}

// validateBudget checks the request budget's own values (the schema's
// bounds); NarrowBudget then checks it against the workflow's.
func (c *StartCommand) validateBudget() error {
	b := c.Budget
	if b == nil {
		return nil
	}
	switch {
	case b.MaxCostUSD < 0 || b.MaxCostUSD > 1e6 || b.MaxCostUSD != b.MaxCostUSD:
		return &InputError{Field: "budget.maxCostUsd", Msg: "want a number above 0, at most 1000000"}
	case b.MaxTokens < 0 || b.MaxTokens > 1e12:
		return &InputError{Field: "budget.maxTokens", Msg: "want a whole number from 1 to 10^12"}
	case b.MaxSteps < 0 || b.MaxSteps > 1e6:
		return &InputError{Field: "budget.maxSteps", Msg: "want a whole number from 1 to 1000000"}
	case b.MaxDurationMs < 0 || b.MaxDurationMs > 31536000000:
		return &InputError{Field: "budget.maxDurationMs", Msg: "want a whole number of ms from 1 to a year"}
	case b.WarnAt < 0 || b.WarnAt > 1 || b.WarnAt != b.WarnAt:
		return &InputError{Field: "budget.warnAt", Msg: "want a fraction above 0, at most 1"}
	case b.OnExceed != "" && b.OnExceed != "fail" && b.OnExceed != "pause":
		return &InputError{Field: "budget.onExceed", Msg: fmt.Sprintf("%q: want \"fail\" or \"pause\"", b.OnExceed)}
	}
	return nil
}

// Validate checks an approve command (and settles Decision from
// Approved when only that was given).
func (c *ApproveCommand) Validate() error {
	if c.Approved != nil {
		want := map[bool]string{true: "approve", false: "reject"}[*c.Approved]
		if c.Decision != "" && c.Decision != want {
			return &InputError{Field: "approved", Msg: fmt.Sprintf("contradicts decision %q", c.Decision)}
		}
		c.Decision = want
	}
	if err := checkRunID("run_id", c.RunID); err != nil {
		return err
	}
	switch {
	case c.StepID == "":
		return &InputError{Field: "step_id", Msg: "required"}
	case c.Decision != "approve" && c.Decision != "reject":
		return &InputError{Field: "decision", Msg: fmt.Sprintf("%q: want \"approve\" or \"reject\" (or \"approved\": true or false)", c.Decision)}
	case c.Approver == "":
		return &InputError{Field: "approver", Msg: "required: say who decides"}
	}
	return errors.Join(checkLen("step_id", c.StepID, MaxNameBytes), checkLen("approver", c.Approver, MaxNameBytes),
		checkLen("comment", c.Comment, MaxTextBytes))
}

// Validate checks a cancel command.
func (c *CancelCommand) Validate() error {
	if err := checkRunID("run_id", c.RunID); err != nil {
		return err
	}
	return errors.Join(checkLen("by", c.By, MaxNameBytes), checkLen("reason", c.Reason, MaxTextBytes))
}

// Validate checks a signal command (and settles Signal from Name when
// only that was given).
func (c *SignalCommand) Validate() error {
	if c.Name != "" {
		if c.Signal != "" && c.Signal != c.Name {
			return &InputError{Field: "name", Msg: fmt.Sprintf("contradicts signal %q", truncate(c.Signal, 80))}
		}
		c.Signal = c.Name
	}
	if err := checkRunID("run_id", c.RunID); err != nil {
		return err
	}
	if c.Signal == "" {
		return &InputError{Field: "signal", Msg: "required: the name of the signal"}
	}
	if p := bytes.TrimSpace(c.Payload); len(p) > 0 && !json.Valid(p) {
		return &InputError{Field: "payload", Msg: "not valid JSON"}
	}
	return errors.Join(checkLen("signal", c.Signal, MaxNameBytes), checkLen("by", c.By, MaxNameBytes),
		checkLen("payload", string(c.Payload), MaxSignalPayloadBytes))
}
