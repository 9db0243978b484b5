package event

import "encoding/json"

// RunCreatedData is the payload of run_created: everything needed to drive
// the run, so a worker needs nothing but the journal.
type RunCreatedData struct {
	// Workflow is the workflow snapshot the run executes (a graph run), or
	// absent for a plain-LLM run.
	Workflow json.RawMessage `json:"workflow,omitempty"`
	// WorkflowHash is the hex sha256 of Workflow as stored.
	WorkflowHash string `json:"workflow_hash,omitempty"`
	// WorkflowName is the workflow's name, for listings.
	WorkflowName string          `json:"workflow_name,omitempty"`
	Input        json.RawMessage `json:"input"`
	// InputBlob stands for Input when it is kept in PAL_BLOBS (§6.4); a
	// reader of the store sees Input instead.
	InputBlob    *BlobRef       `json:"input_blob,omitempty"`
	ParentRunID  string         `json:"parent_run_id,omitempty"`
	ParentStepID string         `json:"parent_step_id,omitempty"`
	Depth        int            `json:"depth"`
	TriggerMeta  map[string]any `json:"trigger_meta,omitempty"`
	// IdempotencyKey is the start request's key, when the client gave one.
	IdempotencyKey string `json:"idempotency_key,omitempty"`
	// Labels are the start's labels (CheckLabels bounds them); a fork or
	// a retry carries its source's, a child run its parent's. Absent: none.
	Labels map[string]string `json:"labels,omitempty"`
	// Queue is the work queue whose workers drive the run (ValidateQueue):
	// the workflow's queue, or for a child run its subagent node's. Absent:
	// DefaultQueue.
	Queue string `json:"queue,omitempty"`
	// Schedule names the schedule that started the run (PAL_SCHEDULES,
	// ScheduleRunID), and Tick is the tick it was started for, RFC 3339
	// in UTC: the time the schedule was due, or for a trigger the time it
	// was asked. Absent on a run no schedule started.
	Schedule string `json:"schedule,omitempty"`
	Tick     string `json:"tick,omitempty"`
	// Thread is the conversation the run's thread steps continue
	// (ValidateThreadID; created on first use, thread.go). Absent: none.
	Thread string `json:"thread,omitempty"`
	// Budget is the run's effective budget: the workflow's policy.budget,
	// narrowed by the start request, and for a child run by what its
	// parent had left. Absent: no budget.
	Budget *Budget `json:"budget,omitempty"`
	// Anomalies is the run's effective anomaly policy: the settings'
	// defaults overridden by the workflow's policy.anomalies, by type.
	// Absent: the built-in defaults (engine.DefaultAnomalies).
	Anomalies map[string]AnomalyRule `json:"anomalies,omitempty"`
	// ForkedFrom is set on a run made by a fork or a retry of another.
	ForkedFrom *ForkedFrom `json:"forked_from,omitempty"`
	// Deployed names the deployed workflow (PAL_WORKFLOWS) the run was
	// started from: Workflow is that version's definition, so a redeploy
	// never changes the run. A child run carries its parent's. Absent: a
	// plain-LLM run, or a run created before workflows were deployed;
	// such a run resolves no {{secrets.NAME}}.
	Deployed *Deployed `json:"deployed,omitempty"`
	// Prices are the prices of the models the run's workflow names (in
	// its loops and subagents too): what its budget checks and the cost
	// of its calls are priced with. Written on every new run, empty when
	// none of its models has a price; nil (absent) on a run created
	// before prices were journaled, which is priced with the list prices
	// of that time, frozen in package engine (engine.RunState.Prices).
	Prices Prices `json:"prices,omitzero"`
}

// Budget limits what a run may spend. A zero field sets no limit.
type Budget struct {
	MaxCostUSD    float64 `json:"max_cost_usd,omitempty"`
	MaxTokens     int64   `json:"max_tokens,omitempty"`
	MaxSteps      int64   `json:"max_steps,omitempty"`
	MaxDurationMs int64   `json:"max_duration_ms,omitempty"`
	// WarnAt is the fraction of a limit at which budget_warning is
	// journaled (0 < warn_at ≤ 1).
	WarnAt float64 `json:"warn_at,omitempty"`
	// OnExceed is fail or pause.
	OnExceed string `json:"on_exceed,omitempty"`
}

// What a budget does when a limit would be exceeded.
const (
	OnExceedFail  = "fail"
	OnExceedPause = "pause"
)

// Budget limits, as named in budget_warning and budget_exceeded.
const (
	LimitCost     = "max_cost_usd"
	LimitTokens   = "max_tokens"
	LimitSteps    = "max_steps"
	LimitDuration = "max_duration_ms"
)

// AnomalyRule is one anomaly type's thresholds and action. Which
// thresholds a type reads is documented with the types (engine).
type AnomalyRule struct {
	// Threshold is the main threshold: a count, or for the spikes the
	// factor over the run's median step.
	Threshold float64 `json:"threshold,omitempty"`
	// PerStep is retry_storm's per-step count; Requests runaway_loop's
	// count of identical LLM requests; Floor the spikes' absolute floor
	// (USD or tokens).
	PerStep  float64 `json:"per_step,omitempty"`
	Requests float64 `json:"requests,omitempty"`
	Floor    float64 `json:"floor,omitempty"`
	// Action is record, halt or pause.
	Action string `json:"action,omitempty"`
}

// ForkedFrom says which run and step a fork starts from, and carries the
// steps it copies: each is completed with its source output (marked
// copied_from) and never executed.
type ForkedFrom struct {
	RunID  string `json:"run_id"`
	StepID string `json:"step_id"`
	// Seq is the seq of the source's first event of StepID, or of its
	// run_failed for a retry of a step that failed before it started:
	// steps the source completed before it are copied.
	Seq    uint64       `json:"seq"`
	Copies []CopiedStep `json:"copies,omitempty"`
	// Rerun lists the source's steps completed before Seq that are not
	// copied, and why (a fork with another workflow).
	Rerun []RerunStep `json:"rerun,omitempty"`
}

// CopiedStep is one step a fork copies from its source.
type CopiedStep struct {
	StepID   string          `json:"step_id"`
	NodeID   string          `json:"node_id"`
	NodeType string          `json:"node_type"`
	Output   json.RawMessage `json:"output"`
	// OutputBlob stands for Output when it is kept in PAL_BLOBS (§6.4).
	OutputBlob *BlobRef `json:"output_blob,omitempty"`
	Delivery   string   `json:"delivery,omitempty"`
	// Seq is the seq of the source's step_completed.
	Seq uint64 `json:"seq"`
	// NodeHash is the hex sha256 of the canonical JSON of the step's
	// outermost node (a loop's or agent's, for the steps inside them).
	NodeHash string `json:"node_hash"`
}

// RerunStep names a source step a fork runs again, and why.
type RerunStep struct {
	StepID string `json:"step_id"`
	Reason string `json:"reason"`
}

// CopiedFrom marks a step_completed copied from another run's journal.
type CopiedFrom struct {
	RunID    string `json:"run_id"`
	Seq      uint64 `json:"seq"`
	NodeHash string `json:"node_hash,omitempty"`
}

// RunResumedData is the payload of run_resumed, appended by a worker each
// time it takes over a run. It is the fencing token: a writer that did not
// append the latest run_resumed no longer owns the run.
type RunResumedData struct {
	Worker string `json:"worker"`
	// ResumeCount counts the drives of this run, starting at 1.
	ResumeCount int `json:"resume_count"`
	// Crashed reports that the previous drive ended without finishing or
	// parking the run (a crash, a lost lease, or a graceful hand-off).
	Crashed bool `json:"crashed"`
	// CrashesAtStep counts consecutive crashed drives with no step completed
	// in between; a run that crashes its workers too often fails.
	CrashesAtStep int `json:"crashes_at_step,omitempty"`
}

// StepStartedData is the payload of step_started, appended before a step
// acts.
type StepStartedData struct {
	NodeID         string          `json:"node_id"`
	NodeType       string          `json:"node_type"`
	Input          json.RawMessage `json:"input,omitempty"`
	IdempotencyKey string          `json:"idempotency_key"`
	// InputBlob stands for Input when it is kept in PAL_BLOBS (§6.4); a
	// reader of the store sees Input instead.
	InputBlob *BlobRef `json:"input_blob,omitempty"`
}

// Usage is the token and cost accounting of a step. InputTokens counts
// the whole input: CacheReadTokens and CacheWriteTokens (input read from
// and written to the provider's prompt cache, priced at their own rates)
// are parts of it. ReasoningTokens are part of OutputTokens.
type Usage struct {
	InputTokens      int64   `json:"input_tokens"`
	OutputTokens     int64   `json:"output_tokens"`
	TotalTokens      int64   `json:"total_tokens"`
	CacheReadTokens  int64   `json:"cache_read_tokens,omitempty"`
	CacheWriteTokens int64   `json:"cache_write_tokens,omitempty"`
	ReasoningTokens  int64   `json:"reasoning_tokens,omitempty"`
	CostUSD          float64 `json:"cost_usd"`
	// CostUnknown: a model the price table does not know was used, so
	// CostUSD counts nothing for it (it is not a price of 0).
	CostUnknown bool `json:"cost_unknown,omitempty"`
}

// Add accumulates u2 into u.
func (u *Usage) Add(u2 Usage) {
	u.InputTokens += u2.InputTokens
	u.OutputTokens += u2.OutputTokens
	u.TotalTokens += u2.TotalTokens
	u.CacheReadTokens += u2.CacheReadTokens
	u.CacheWriteTokens += u2.CacheWriteTokens
	u.ReasoningTokens += u2.ReasoningTokens
	u.CostUSD += u2.CostUSD
	u.CostUnknown = u.CostUnknown || u2.CostUnknown
}

// Delivery outcomes recorded in step_completed for connector steps.
const (
	DeliveryDelivered   = "delivered"
	DeliveryUnconfirmed = "unconfirmed"
)

// StepCompletedData is the payload of step_completed: the full output, which
// a re-drive reuses instead of acting again.
type StepCompletedData struct {
	Output     json.RawMessage `json:"output"`
	Usage      *Usage          `json:"usage,omitempty"`
	DurationMs int64           `json:"duration_ms"`
	// Delivery is set on connector steps: delivered or unconfirmed.
	Delivery string `json:"delivery,omitempty"`
	// Stderr is the bounded tail of a process step's standard error.
	Stderr string `json:"stderr,omitempty"`
	// SignalSeq is the seq of the signal_received a wait step took (0 for
	// a wait that timed out, and every other step).
	SignalSeq uint64 `json:"signal_seq,omitempty"`
	// CopiedFrom is set on a step a fork copied instead of executing.
	CopiedFrom *CopiedFrom `json:"copied_from,omitempty"`
	// OutputBlob stands for Output when it is kept in PAL_BLOBS (§6.4); a
	// reader of the store sees Output instead.
	OutputBlob *BlobRef `json:"output_blob,omitempty"`
}

// Error classes used for retry policies.
const (
	ClassAny       = "any"
	ClassTimeout   = "timeout"
	ClassLLM       = "llm"
	ClassConnector = "connector"
	ClassTool      = "tool"
	// ClassConfidence is the class of a step whose answer scored below its
	// confidence gate's min (not a retry class: onLow "retry" retries it).
	ClassConfidence = "confidence"
	// ClassInterrupted is the class of a step that was in flight when a
	// step beside it failed the run (StepFailedData.InterruptedBy): its
	// call was cancelled, and its outcome is unknown. Not a retry class.
	ClassInterrupted = "interrupted"
)

// StepFailedData is the payload of step_failed: the attempt failed and will
// not be retried.
type StepFailedData struct {
	Error      string `json:"error"`
	Class      string `json:"class"`
	DurationMs int64  `json:"duration_ms"`
	// OutcomeUnknown reports that the failed call may have reached its
	// target (a timeout, a connection cut after sending).
	OutcomeUnknown bool `json:"outcome_unknown,omitempty"`
	// Stderr is the bounded tail of a process step's standard error.
	Stderr string `json:"stderr,omitempty"`
	// Usage is what the failed step spent anyway: a subagent step whose
	// child run failed carries the child's spend.
	Usage *Usage `json:"usage,omitempty"`
	// InterruptedBy names the step whose failure interrupted this one
	// (class interrupted): it was in flight beside it, and was cancelled
	// when the run failed.
	InterruptedBy string `json:"interrupted_by,omitempty"`
}

// StepRetryingData is the payload of step_retrying, journaled between
// attempts. Attempt is the attempt that comes next; it equals the failed one
// when the failed call's outcome is unknown, so the retry reuses the same
// idempotency key.
type StepRetryingData struct {
	Attempt int    `json:"attempt"`
	Of      int    `json:"of"`
	Error   string `json:"error"`
	Class   string `json:"class"`
	DelayMs int64  `json:"delay_ms"`
	// RetryAfterMs is the wait the provider asked for (Retry-After or its
	// rate-limit reset headers), when it asked; DelayMs is that wait within
	// the worker's cap (PAL_RETRY_AFTER_MAX).
	RetryAfterMs int64 `json:"retry_after_ms,omitempty"`
	// Fallback is the index, in the node's model list, of the model the
	// next attempt calls: the failed one's, or the next one's when the
	// step moves on (its retry policy spent on that model, or an outage).
	Fallback int `json:"fallback,omitempty"`
	// Usage is what the failed attempt spent anyway: an answer that did
	// not match the step's responseSchema.
	Usage *Usage `json:"usage,omitempty"`
}

// Wait reasons for step_waiting.
const (
	WaitApproval = "approval"
	WaitChild    = "child"
	WaitSignal   = "signal"
	// WaitBudget parks a run whose budget would be exceeded (on_exceed
	// pause) until budget_raised; WaitAnomaly parks it at an anomaly whose
	// action is pause until approval_received for the anomaly's step.
	WaitBudget  = "budget"
	WaitAnomaly = "anomaly"
)

// StepWaitingData is the payload of step_waiting: the run parks until an
// outside input wakes it.
type StepWaitingData struct {
	Reason     string `json:"reason"`
	ChildRunID string `json:"child_run_id,omitempty"`
	// TimeoutAt, when set, is when the wait gives up (RFC 3339).
	TimeoutAt string `json:"timeout_at,omitempty"`
}

// SideEffectClaimedData is the payload of side_effect_claimed, appended
// before an external delivery is dispatched.
type SideEffectClaimedData struct {
	IdempotencyKey string `json:"idempotency_key"`
	Connector      string `json:"connector"`
	Target         string `json:"target"`
}

// SideEffectDeliveredData is the payload of side_effect_delivered, appended
// after the receiver acknowledged the delivery.
type SideEffectDeliveredData struct {
	IdempotencyKey string `json:"idempotency_key"`
	Status         int    `json:"status"`
}

// ChildRunCreatedData is the payload of child_run_created.
type ChildRunCreatedData struct {
	ChildRunID string `json:"child_run_id"`
	Workflow   string `json:"workflow,omitempty"`
}

// Anomaly types.
const (
	AnomalyRunawayLoop    = "runaway_loop"
	AnomalyExcessiveSteps = "excessive_steps"
	AnomalyRetryStorm     = "retry_storm"
	AnomalyCostSpike      = "cost_spike"
	AnomalyTokenSpike     = "token_spike"
)

// Anomaly actions.
const (
	ActionRecord = "record"
	ActionHalt   = "halt"
	ActionPause  = "pause"
)

// AnomalyDetectedData is the payload of anomaly_detected. A run journals
// each (type, step_id) at most once.
type AnomalyDetectedData struct {
	Type      string  `json:"type"`
	Observed  float64 `json:"observed"`
	Threshold float64 `json:"threshold"`
	Action    string  `json:"action"`
	StepID    string  `json:"step_id"`
	// Detail says what was seen, for people (the tool and its arguments).
	Detail string `json:"detail,omitempty"`
}

// BudgetWarningData is the payload of budget_warning, journaled once per
// limit when the spend reaches warn_at of it.
type BudgetWarningData struct {
	Limit  string  `json:"limit"`
	Spent  float64 `json:"spent"`
	Max    float64 `json:"max"`
	StepID string  `json:"step_id,omitempty"`
}

// BudgetExceededData is the payload of budget_exceeded: the step step_id
// was not dispatched because spent plus its worst case would pass max.
// Action is on_exceed: fail or pause.
type BudgetExceededData struct {
	Limit  string  `json:"limit"`
	Spent  float64 `json:"spent"`
	Max    float64 `json:"max"`
	StepID string  `json:"step_id,omitempty"`
	Action string  `json:"action"`
	// Need is the step's worst case in the limit's unit.
	Need float64 `json:"need,omitempty"`
}

// BudgetRaisedData is the payload of budget_raised: an input that adds
// to a run's limits (and wakes a run paused on its budget).
type BudgetRaisedData struct {
	AddUSD    float64 `json:"add_usd,omitempty"`
	AddTokens int64   `json:"add_tokens,omitempty"`
	AddSteps  int64   `json:"add_steps,omitempty"`
	AddMs     int64   `json:"add_ms,omitempty"`
	By        string  `json:"by"`
}

// ConfidenceEvaluatedData is the payload of confidence_evaluated: the score
// of one attempt of a gated step, computed once. Output and Usage are the
// step's answer (with output.confidence) and the usage of its calls (the
// judge's included): what the step completes with once the gate lets it,
// so that no call is made again after the score is journaled.
type ConfidenceEvaluatedData struct {
	Score  float64         `json:"score"`
	Min    float64         `json:"min"`
	Passed bool            `json:"passed"`
	Source string          `json:"source"`
	Output json.RawMessage `json:"output,omitempty"`
	Usage  *Usage          `json:"usage,omitempty"`
	// OutputBlob stands for Output when it is kept in PAL_BLOBS (§6.4).
	OutputBlob *BlobRef `json:"output_blob,omitempty"`
}

// ConfidenceGateBypassedData is the payload of confidence_gate_bypassed:
// a step's gate was let through by an approver accepting a low score, or
// not applied because the workflow's policy turns gates off (By "policy").
type ConfidenceGateBypassedData struct {
	By     string `json:"by"`
	Reason string `json:"reason"`
}

// BypassedByPolicy is ConfidenceGateBypassedData.By for a gate that
// policy.confidenceGate "off" turned off.
const BypassedByPolicy = "policy"

// RunSucceededData is the payload of run_succeeded.
type RunSucceededData struct {
	Output json.RawMessage `json:"output"`
	// OutputBlob stands for Output when it is kept in PAL_BLOBS (§6.4).
	OutputBlob *BlobRef `json:"output_blob,omitempty"`
}

// Error codes of run_failed.
const (
	CodeStepFailed      = "step_failed"
	CodeInvalidWorkflow = "invalid_workflow"
	CodeCrashLoop       = "crash_loop"
	CodeDepthExceeded   = "depth_exceeded"
	CodeInternal        = "internal"
	// CodeLowConfidence fails a run at a step whose answer scored below its
	// confidence gate (onLow fail, a rejected approval, retries used up).
	CodeLowConfidence = "low_confidence"
	// CodeJournalCorrupt fails a run whose journal does not verify
	// (Chain); the run_failed carries the first bad seq and the reason.
	CodeJournalCorrupt = "journal_corrupt"
	// CodeProcessResumeExhausted fails a run whose process step was
	// re-driven its node's maxResumes times without completing; Attempts
	// says how many processes were started for it.
	CodeProcessResumeExhausted = "process_resume_exhausted"
	// CodeBudgetExceeded fails a run whose budget (on_exceed fail) would
	// be exceeded; CodeAnomaly one halted by an anomaly.
	CodeBudgetExceeded = "budget_exceeded"
	CodeAnomaly        = "anomaly"
)

// RunFailedData is the payload of run_failed.
type RunFailedData struct {
	Error  string `json:"error"`
	Code   string `json:"code"`
	StepID string `json:"step_id,omitempty"`
	// Seq and Reason say where and why the journal is corrupt (code
	// journal_corrupt only).
	Seq    uint64 `json:"seq,omitempty"`
	Reason string `json:"reason,omitempty"`
	// Attempts counts the processes started for the step (code
	// process_resume_exhausted only).
	Attempts int `json:"attempts,omitempty"`
}

// RunCancelledData is the payload of run_cancelled.
type RunCancelledData struct {
	Reason string `json:"reason,omitempty"`
	By     string `json:"by,omitempty"`
}

// Approval decisions.
const (
	DecisionApprove = "approve"
	DecisionReject  = "reject"
	// DecisionTimeout is the output decision of an approval that timed out.
	DecisionTimeout = "timeout"
)

// ApprovalReceivedData is the payload of approval_received.
type ApprovalReceivedData struct {
	Decision string `json:"decision"`
	Approver string `json:"approver"`
	Comment  string `json:"comment,omitempty"`
}

// SignalReceivedData is the payload of signal_received.
type SignalReceivedData struct {
	Signal  string          `json:"signal"`
	Payload json.RawMessage `json:"payload"`
	By      string          `json:"by,omitempty"`
}

// SignalTimeoutOutput is the output of a wait step that timed out.
type SignalTimeoutOutput struct {
	Signal   string `json:"signal"`
	TimedOut bool   `json:"timed_out"`
}

// ApprovalOutput is the output of a completed approval step.
type ApprovalOutput struct {
	Approved bool   `json:"approved"`
	Decision string `json:"decision"`
	Approver string `json:"approver,omitempty"`
	Comment  string `json:"comment,omitempty"`
	TimedOut bool   `json:"timed_out"`
}

// SubstepStartedData is the payload of substep_started: a process step's
// child reported that it began sub-step Name.
type SubstepStartedData struct {
	Name string `json:"name"`
}

// SubstepCompletedData is the payload of substep_completed: the sub-step's
// output, which the SDK helpers return on a resume instead of running the
// sub-step again.
type SubstepCompletedData struct {
	Name   string          `json:"name"`
	Output json.RawMessage `json:"output"`
	// OutputBlob stands for Output when it is kept in PAL_BLOBS (§6.4).
	OutputBlob *BlobRef `json:"output_blob,omitempty"`
}
