package runs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/internal/limit"
	"github.com/palrun/pal/workflow"
)

// StartResult says which run a start command maps to.
type StartResult struct {
	RunID string
	// Created is false when the command was a duplicate of an earlier one
	// (same idempotency key): the run already existed.
	Created bool
}

// RunIDForKey derives the run id of an idempotent start.
func RunIDForKey(key string) string {
	sum := sha256.Sum256([]byte("start|" + key))
	return fmt.Sprintf("run_k%x", sum[:13])
}

// Start validates the command, appends run_created (fenced on an empty
// subject, so a run id is created at most once) and enqueues the run.
// The workflow is a deployed one, by name (RightStart), or a definition
// the command brings, which is deployed first (RightStart and
// RightDeploy); either way run_created journals the version's definition
// and names it (deployed). Invalid commands write nothing. A result with
// a RunID and an error means the run was created but not queued: the
// recovery sweep queues it.
//
// Errors: *InputError; *ForbiddenError for a caller without the rights;
// *workflow.ValidationError for an invalid workflow; ErrWorkflowNotFound
// for a name not deployed; ErrRunExists when RunID is taken, unless by a
// start with the same idempotency key (then the result names that run,
// Created false); ErrPayloadTooLarge.
func (c *Client) Start(ctx context.Context, cmd StartCommand) (_ StartResult, err error) {
	if err := c.admit(ctx, CmdStart, limit.Start, cmd.By); err != nil {
		return StartResult{}, err
	}
	defer observeRefusal(CmdStart, &err)
	if err := cmd.Validate(); err != nil {
		return StartResult{}, err
	}
	var (
		wf  *workflow.Workflow
		dep *event.Deployed
	)
	switch ref, named := cmd.ref(); {
	case named:
		if err := need(cmd.Rights, RightStart, "workflow", "starting a deployed workflow"); err != nil {
			return StartResult{}, err
		}
		w, d, err := c.resolve(ctx, ref)
		if err != nil {
			return StartResult{}, err
		}
		wf, dep = w, &d
	case cmd.LLM != nil:
		if err := need(cmd.Rights, AllRights, "llm", "starting a plain-LLM run (its spec is a workflow of its own)"); err != nil {
			return StartResult{}, err
		}
		if wf, err = cmd.LLM.workflow(); err != nil {
			return StartResult{}, err
		}
	default:
		if err := need(cmd.Rights, AllRights, "workflow", "starting an inline workflow (a definition, which is deployed)"); err != nil {
			return StartResult{}, err
		}
		if wf, dep, err = c.deployInline(ctx, cmd.Workflow, cmd.Budget, cmd.By); err != nil {
			return StartResult{}, err
		}
	}
	return c.create(ctx, cmd, wf, dep)
}

// deployInline deploys a definition a start or fork brings, once what
// could still refuse the start has been checked (a budget wider than its
// own), so a refused start deploys nothing.
func (c *Client) deployInline(ctx context.Context, raw json.RawMessage, budget *workflow.Budget, by string) (*workflow.Workflow, *event.Deployed, error) {
	wf, err := workflow.ParseCached(raw)
	if err != nil {
		return nil, nil, err
	}
	if err := checkBudget(wf, budget); err != nil {
		return nil, nil, err
	}
	wf, d, err := c.deploy(ctx, raw, by, "")
	if err != nil {
		return nil, nil, err
	}
	return wf, &d.Deployed, nil
}

// checkBudget refuses a request budget wider than the workflow's own.
func checkBudget(wf *workflow.Workflow, req *workflow.Budget) error {
	var base *event.Budget
	if wf.Policy != nil {
		base = engine.BudgetOf(wf.Policy.Budget)
	}
	if _, err := engine.NarrowBudget(base, engine.BudgetOf(req)); err != nil {
		return budgetInputError(err)
	}
	return nil
}

// budgetInputError makes a widening budget the caller's mistake.
func budgetInputError(err error) error {
	var we *engine.WideningError
	if errors.As(err, &we) {
		return &InputError{Field: "budget", Msg: err.Error()}
	}
	return err
}

// create makes the run of cmd: workflow wf, the deployed version dep (nil
// for a plain-LLM run). What is decided at creation is journaled: the
// effective budget, anomaly rules and prices. Replays and workers read
// them from run_created, never from the request or a process's settings
// again.
func (c *Client) create(ctx context.Context, cmd StartCommand, wf *workflow.Workflow, dep *event.Deployed) (StartResult, error) {
	runID := cmd.RunID
	if runID == "" && cmd.IdempotencyKey != "" {
		runID = RunIDForKey(cmd.IdempotencyKey)
	}
	if runID == "" {
		runID = event.NewRunID()
	}
	input := bytes.TrimSpace(cmd.Input)
	if len(input) == 0 {
		input = []byte("{}")
	}
	writer := cmd.By
	if writer == "" {
		writer = "pal"
	}
	ev, err := engine.RunCreated(engine.Creation{Workflow: wf, Input: input, Budget: engine.BudgetOf(cmd.Budget),
		Anomalies: c.anomalies, Prices: c.prices, TriggerMeta: cmd.TriggerMeta, IdempotencyKey: cmd.IdempotencyKey,
		Labels: cmd.Labels, Schedule: cmd.schedule, Tick: cmd.tick, Thread: cmd.Thread, ForkedFrom: cmd.forkedFrom, Deployed: dep, By: writer})
	if err != nil {
		return StartResult{}, budgetInputError(err)
	}
	q := event.QueueOr(wf.Queue)
	indexed := c.store.MarkInflight(q, runID) // before run_created (eventstore.InflightBucket)
	// The work message goes out beside run_created, not after its ack: a
	// worker that takes it before the journal shows run_created waits
	// for it (docs/architecture.md §8 step 3).
	_, queued, err := c.store.AppendStart(ctx, q, runID, ev, "start")
	if ierr := indexed(ctx); ierr != nil && err == nil {
		// The Postgres sweep still finds the run; a retried start indexes it.
		return StartResult{RunID: runID, Created: true}, fmt.Errorf("run %s created but not indexed: %w", runID, ierr)
	}
	if errors.Is(err, eventstore.ErrConflict) {
		if cmd.IdempotencyKey != "" {
			same, err := c.startedWith(ctx, runID, cmd.IdempotencyKey)
			if err != nil {
				return StartResult{}, fmt.Errorf("starting run %s: %w", runID, err)
			}
			if same {
				// The same start again: make sure it is queued and
				// answer with the existing run.
				return StartResult{RunID: runID}, enqueueIfLive(ctx, c.store, q, runID)
			}
		}
		return StartResult{}, fmt.Errorf("starting run %s: %w", runID, ErrRunExists)
	}
	if err != nil {
		return StartResult{}, fmt.Errorf("starting run %s: %w", runID, err)
	}
	if err := queued(ctx); err != nil {
		// run_created is durable; the recovery sweep enqueues the run if
		// this never lands.
		return StartResult{RunID: runID, Created: true}, fmt.Errorf("run %s created but not queued (the recovery sweep will queue it): %w", runID, err)
	}
	return StartResult{RunID: runID, Created: true}, nil
}

// startedWith reports whether run runID was created by a start with
// idempotency key key: only then is a start with that key that finds the
// run taken the same start (a start with no key or another key may have
// taken the run id).
func (c *Client) startedWith(ctx context.Context, runID, key string) (bool, error) {
	// One message, not the journal: only run_created's key is compared.
	first, err := c.store.FirstEvent(ctx, runID)
	if err != nil || first.Kind != event.RunCreated {
		// No run_created to compare: a read that failed (NATS), or a
		// journal whose first message is bad, which no start wrote.
		return false, err
	}
	var d event.RunCreatedData
	if err := first.DecodeData(&d); err != nil {
		return false, err
	}
	return d.IdempotencyKey == key, nil
}

// enqueueIfLive enqueues a run that exists but has not started driving: a
// duplicate start may follow a start that crashed between run_created and
// its work message.
func enqueueIfLive(ctx context.Context, store *eventstore.Store, q, runID string) error {
	head, err := store.LastHead(ctx, runID)
	if err != nil {
		return err
	}
	if head.Seq == 1 {
		return store.Enqueue(ctx, q, runID, "start")
	}
	return nil
}

// LLMSpec is a run with no graph: a prompt (or messages) for one model
// call, or, with tools, an agent loop. Its fields mean what they mean on
// an ai-step or agent node.
type LLMSpec struct {
	Provider    string                `json:"provider"`
	Model       string                `json:"model"`
	Prompt      string                `json:"prompt,omitempty"`
	System      string                `json:"system,omitempty"`
	Messages    []workflow.Message    `json:"messages,omitempty"`
	MaxTokens   int                   `json:"maxTokens,omitempty"`
	Temperature *float64              `json:"temperature,omitempty"`
	Tools       []workflow.AgentTool  `json:"tools,omitempty"`
	MaxTurns    int                   `json:"maxTurns,omitempty"`
	TimeoutMs   int                   `json:"timeoutMs,omitempty"`
	Retry       *workflow.RetryPolicy `json:"retry,omitempty"`
}

// workflow makes the one-node workflow of a plain-LLM run: node "llm" (an
// ai-step) or, with tools, node "agent".
func (s *LLMSpec) workflow() (*workflow.Workflow, error) {
	var id string
	var d workflow.NodeData
	if len(s.Tools) > 0 || s.MaxTurns > 0 {
		if len(s.Messages) > 0 {
			return nil, &InputError{Field: "llm.messages", Msg: "an agent run (with tools) takes a prompt, not messages"}
		}
		id, d = "agent", workflow.AgentData{Provider: s.Provider, Model: workflow.ModelOf(s.Model), Prompt: s.Prompt, System: s.System,
			Tools: s.Tools, MaxTurns: s.MaxTurns, MaxTokens: s.MaxTokens, Temperature: s.Temperature,
			TimeoutMs: s.TimeoutMs, Retry: s.Retry}
	} else {
		id, d = "llm", workflow.AIStepData{Provider: s.Provider, Model: workflow.ModelOf(s.Model), Prompt: s.Prompt, System: s.System,
			Messages: s.Messages, MaxTokens: s.MaxTokens, Temperature: s.Temperature, TimeoutMs: s.TimeoutMs, Retry: s.Retry}
	}
	n, err := workflow.NewNode(id, d)
	if err != nil {
		return nil, &InputError{Field: "llm", Msg: err.Error()}
	}
	return workflow.Build(id, []workflow.Node{workflow.TriggerNode("start"), n}, []workflow.Edge{{From: "start", To: id}})
}
