package workers

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/workflow"
)

// StartRequest asks for a new run of a workflow.
type StartRequest struct {
	// RunID is optional; a fresh id is generated when empty (or derived
	// from IdempotencyKey when that is set).
	RunID string
	// Workflow is the workflow JSON; it is validated before anything is
	// written.
	Workflow json.RawMessage
	// LLM, instead of Workflow, starts a plain-LLM run: one model call, or
	// with tools an agent loop. It goes through the same journal as a
	// graph (a workflow of one node is made for it).
	LLM *LLMSpec
	// Input is the run input (any JSON value; {} when empty).
	Input json.RawMessage
	// IdempotencyKey makes starts idempotent: the same key always maps to
	// the same run, which is created once.
	IdempotencyKey string
	TriggerMeta    map[string]any
	// Writer names who creates the run (the worker_id of run_created).
	Writer string
}

// StartResult says which run a start request maps to.
type StartResult struct {
	RunID string
	// Created is false when the request was a duplicate of an earlier one
	// (same idempotency key): the run already existed.
	Created bool
}

// RunIDForKey derives the run id of an idempotent start.
func RunIDForKey(key string) string {
	sum := sha256.Sum256([]byte("start|" + key))
	return fmt.Sprintf("run_k%x", sum[:13])
}

// StartRun validates the request, appends run_created (fenced on an empty
// subject, so a run id is created at most once) and enqueues the run.
// Invalid requests write nothing. Errors: *workflow.ValidationError for an
// invalid workflow; eventstore.ErrRunExists when RunID is taken (and no
// idempotency key says this is the same request); ErrPayloadTooLarge.
func StartRun(ctx context.Context, store *eventstore.Store, req StartRequest) (StartResult, error) {
	runID := req.RunID
	if runID == "" && req.IdempotencyKey != "" {
		runID = RunIDForKey(req.IdempotencyKey)
	}
	if runID == "" {
		runID = event.NewRunID()
	}
	if err := event.ValidateRunID(runID); err != nil {
		return StartResult{}, err
	}
	if req.LLM != nil {
		if len(bytes.TrimSpace(req.Workflow)) > 0 {
			return StartResult{}, &InputError{Field: "llm", Msg: "give either workflow or llm, not both"}
		}
		raw, err := req.LLM.workflow()
		if err != nil {
			return StartResult{}, err
		}
		req.Workflow = raw
	}
	wf, err := workflow.ParseCached(req.Workflow)
	if err != nil {
		return StartResult{}, err
	}
	input := bytes.TrimSpace(req.Input)
	if len(input) == 0 {
		input = []byte("{}")
	}
	if !json.Valid(input) {
		return StartResult{}, fmt.Errorf("invalid run input: not valid JSON")
	}
	writer := req.Writer
	if writer == "" {
		writer = "pal"
	}
	ev := event.MustNew(event.RunCreated, "", 0, event.RunCreatedData{
		Workflow: wf.Raw(), WorkflowHash: wf.Hash(), WorkflowName: wf.Name,
		Input: input, Depth: 0, TriggerMeta: req.TriggerMeta, IdempotencyKey: req.IdempotencyKey})
	ev.WorkerID = writer
	_, err = store.Append(ctx, runID, eventstore.Head{}, ev)
	if errors.Is(err, eventstore.ErrConflict) {
		if req.IdempotencyKey != "" {
			// The same start again: make sure it is queued and answer
			// with the existing run.
			return StartResult{RunID: runID}, enqueueIfLive(ctx, store, runID)
		}
		return StartResult{}, fmt.Errorf("starting run %s: %w", runID, eventstore.ErrRunExists)
	}
	if err != nil {
		return StartResult{}, fmt.Errorf("starting run %s: %w", runID, err)
	}
	if err := store.Enqueue(ctx, runID, "start"); err != nil {
		// run_created is durable; the recovery sweep enqueues the run if
		// this never lands.
		return StartResult{RunID: runID, Created: true}, fmt.Errorf("run %s created but not queued (the recovery sweep will queue it): %w", runID, err)
	}
	return StartResult{RunID: runID, Created: true}, nil
}

// enqueueIfLive enqueues a run that exists but has not started driving: a
// duplicate start may follow a start that crashed between run_created and
// its work message.
func enqueueIfLive(ctx context.Context, store *eventstore.Store, runID string) error {
	head, err := store.LastHead(ctx, runID)
	if err != nil {
		return err
	}
	if head.Seq == 1 {
		return store.Enqueue(ctx, runID, "start")
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
func (s *LLMSpec) workflow() (json.RawMessage, error) {
	type node struct {
		ID   string `json:"id"`
		Type string `json:"type"`
		Data any    `json:"data,omitempty"`
	}
	type edge struct {
		From string `json:"from"`
		To   string `json:"to"`
	}
	var n node
	if len(s.Tools) > 0 || s.MaxTurns > 0 {
		if len(s.Messages) > 0 {
			return nil, &InputError{Field: "llm.messages", Msg: "an agent run (with tools) takes a prompt, not messages"}
		}
		n = node{ID: "agent", Type: workflow.TypeAgent, Data: workflow.AgentData{Provider: s.Provider, Model: s.Model,
			Prompt: s.Prompt, System: s.System, Tools: s.Tools, MaxTurns: s.MaxTurns, MaxTokens: s.MaxTokens,
			Temperature: s.Temperature, TimeoutMs: s.TimeoutMs, Retry: s.Retry}}
	} else {
		n = node{ID: "llm", Type: workflow.TypeAIStep, Data: workflow.AIStepData{Provider: s.Provider, Model: s.Model,
			Prompt: s.Prompt, System: s.System, Messages: s.Messages, MaxTokens: s.MaxTokens,
			Temperature: s.Temperature, TimeoutMs: s.TimeoutMs, Retry: s.Retry}}
	}
	return json.Marshal(struct {
		Name  string `json:"name"`
		Nodes []node `json:"nodes"`
		Edges []edge `json:"edges"`
	}{Name: n.ID, Nodes: []node{{ID: "start", Type: workflow.TypeTrigger}, n}, Edges: []edge{{From: "start", To: n.ID}}})
}
