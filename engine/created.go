package engine

import (
	"encoding/json"
	"time"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/workflow"
)

// A run's run_created is built here, once, for every way a run comes to
// be: a start, a fork or a retry (runs.Client), and a child (a subagent
// step, in the worker). What is decided at creation is journaled in it,
// so that no worker decides it again: the effective budget, the anomaly
// rules and the prices.

// Creation is what a top-level run is created with, bar its run id.
type Creation struct {
	// Workflow is the parsed workflow the run executes.
	Workflow *workflow.Workflow
	// Input is the run's input, JSON.
	Input json.RawMessage
	// Budget is the start request's budget: it may narrow the
	// workflow's policy.budget, never widen it (NarrowBudget).
	Budget *event.Budget
	// Anomalies are the settings' anomaly rules (PAL_ANOMALY_*), under
	// the workflow's own (EffectiveAnomalies).
	Anomalies map[string]event.AnomalyRule
	// Prices is the price table of the process creating the run: the
	// run journals the part its workflow names (PricesFor).
	Prices         event.Prices
	TriggerMeta    map[string]any
	IdempotencyKey string
	// Labels are the start's labels (event.CheckLabels), or a fork's
	// source's.
	Labels map[string]string
	// Schedule and Tick name the schedule and tick that started the run
	// (event.RunCreatedData.Schedule, Tick); empty for any other start.
	Schedule, Tick string
	// Thread is the start's thread (event.ValidateThreadID), "" for none.
	Thread string
	// ForkedFrom is set for a fork or a retry of another run.
	ForkedFrom *event.ForkedFrom
	// Deployed names the deployed workflow version Workflow is (nil for a
	// plain-LLM run): journaled, so the run never changes under a
	// redeploy, and what lets its steps resolve secrets.
	Deployed *event.Deployed
	// By is the writer of run_created (its worker_id).
	By string
}

// RunCreated is the run_created of a new top-level run (a start, a fork,
// a retry). It fails with a *WideningError when the request's budget asks
// for more than the workflow allows, and when Input or TriggerMeta is not
// JSON.
func RunCreated(c Creation) (event.Event, error) {
	var base *event.Budget
	if c.Workflow.Policy != nil {
		base = BudgetOf(c.Workflow.Policy.Budget)
	}
	budget, err := NarrowBudget(base, c.Budget)
	if err != nil {
		return event.Event{}, err
	}
	return created(c.Workflow, event.RunCreatedData{Input: c.Input, TriggerMeta: c.TriggerMeta,
		IdempotencyKey: c.IdempotencyKey, Labels: c.Labels, Schedule: c.Schedule, Tick: c.Tick, Thread: c.Thread, Budget: budget, ForkedFrom: c.ForkedFrom, Deployed: c.Deployed}, c.Anomalies, c.Prices, c.By)
}

// ChildRunCreated is the run_created of the child run that subagent step
// stepID of parent starts at now, running wf with input. It draws on
// what its parent has left of its budget (ChildBudget); its anomaly rules
// are the settings' (anomalies) under wf's own; its prices are its
// parent's (the parent's workflow names every model of the child's), so
// one run and its children are priced alike. The subagent node is part of
// the parent's deployed workflow, so the child carries the parent's
// deployed reference; it carries the parent's labels too, so a search for
// them finds the child. Its queue is queue (the subagent node's), else
// wf's: a child does not inherit its parent's. A child of a workflow
// tool carries its own deployed version (deployed) instead of its
// parent's. It fails only when input is not JSON.
func ChildRunCreated(parent *RunState, stepID string, wf *workflow.Workflow, input json.RawMessage, queue string,
	deployed *event.Deployed, anomalies map[string]event.AnomalyRule, by string, now time.Time) (event.Event, error) {
	if deployed == nil {
		deployed = parent.Created.Deployed
	}
	return created(wf, event.RunCreatedData{Input: input, ParentRunID: parent.RunID, ParentStepID: stepID, Queue: queue,
		Depth: parent.Created.Depth + 1, TriggerMeta: ChildTriggerMeta(parent, stepID),
		Budget: ChildBudget(parent, wf, now), Deployed: deployed, Labels: parent.Created.Labels}, anomalies, parent.Prices(), by)
}

// created completes d with what every run_created carries of its
// workflow: the snapshot, its hash and name, the effective anomaly rules
// and the prices of its models.
func created(wf *workflow.Workflow, d event.RunCreatedData, anomalies map[string]event.AnomalyRule, prices event.Prices, by string) (event.Event, error) {
	d.Workflow, d.WorkflowHash, d.WorkflowName = wf.Raw(), wf.Hash(), wf.Name
	if d.Queue == "" {
		d.Queue = wf.Queue
	}
	if d.Queue == event.DefaultQueue {
		d.Queue = "" // journaled only when not the default
	}
	d.Anomalies = EffectiveAnomalies(anomalies, wf)
	d.Prices = PricesFor(prices, wf)
	ev, err := event.New(event.RunCreated, "", 0, d)
	if err != nil {
		return event.Event{}, err
	}
	ev.WorkerID = by
	return ev, nil
}

// Chain returns the run ids from the root run down to this run, from the
// journal (run_created's trigger_meta.chain).
func Chain(st *RunState) []string {
	var out []string
	if raw, ok := st.Created.TriggerMeta["chain"].([]any); ok {
		for _, v := range raw {
			if s, ok := v.(string); ok {
				out = append(out, s)
			}
		}
	}
	return append(out, st.RunID)
}

// ChildTriggerMeta is the trigger_meta of the child run that step stepID
// of st starts: its parent, and the chain that Chain reads back in the
// child.
func ChildTriggerMeta(st *RunState, stepID string) map[string]any {
	return map[string]any{"parent_run_id": st.RunID, "parent_step_id": stepID, "chain": Chain(st)}
}

func chainString(st *RunState) string {
	c := Chain(st)
	s := ""
	for i, id := range c {
		if i > 0 {
			s += " → "
		}
		s += id
	}
	return s
}
