// Package engine is PAL's pure core: Fold turns a run's journal into its
// state, and Next decides what the run does next. Nothing here does I/O or
// reads a clock: Next is given the time, so a deadline (an approval's
// timeout) is decided here, once, and a replay given the same time decides
// the same. The worker (package workers) does the I/O, the projector
// (package projections) uses the same fold to compute status and step rows.
//
// What crosses between the engine and the worker is typed: the step inputs
// the engine renders and the outputs the worker journals are the types of
// contract.go, the actions Next and Frontier return are the types of
// action.go (Done, RunStep, RunSteps, Complete, Fail, Note, Park), and step
// ids are StepID values (stepid.go), built by its constructors and read
// back by ParseStepID.
//
// # Fold
//
// The fold is strict: seq must be gapless from 1 and run_created must come
// first. It does not verify the journal's hash chain or writers: that is
// event.Chain's, applied by every reader of NATS before it folds (golden
// histories are fold tests and carry no prev); FoldRead folds what such a
// reader got, a corrupt journal as failed with code journal_corrupt. Every
// step transition is a journal event, so the state is only a cache of the
// journal: replaying the same events always gives the same state (golden
// histories in testdata check this).
//
// Apply dispatches each event to the handler of its kind (the table in
// fold.go, one line a kind); the handlers live by group: the run's life
// (fold_run.go), its steps (fold_step.go), what a step did beside its
// outcome (fold_effect.go), the inputs (fold_input.go), the confidence
// gates (fold_gate.go) and the brakes (brakes_fold.go).
//
// # Next
//
// Frontier (frontier.go) walks the workflow graph from the trigger in
// topological order. A node runs when every node with an edge into it is
// resolved (completed, dead because none of its own incoming edges fired,
// or failed with onFailure "continue") and at least one of its incoming
// edges fired. Every node that may run is returned at once, as a set in
// the walk's order (RunSteps): branches of the graph, a loop's iterations
// up to its concurrency, an agent turn's tool calls. The steps the caller
// has in flight (busy) are not returned, and hold back what depends on
// them; a step another drive started and never ended is returned again,
// with its attempt and key. Next is the set's first step, for callers
// that take one at a time. A completed step is never run again: its
// journaled output is reused. A step that fails the run ends the walk
// with Fail, whatever is in flight. When nothing is left to run the run
// succeeds with the output of the last completed step. planStep plans a
// step by its node's type (plan.go, with one wait plan, waitFor, for
// approvals and waits); a loop and an agent plan their own steps
// (loop.go, agent.go).
//
// The brakes (a budget, anomaly detection) are three parts: what the fold
// keeps (brakes_fold.go), what Next makes of it before it walks the graph
// and before it lets a set of acting steps go, their worst cases and
// those of the steps in flight reserved together (brakes_next.go), and
// the rules a run is held to, decided once when it is created
// (brakes_policy.go). Before the brakes look at an LLM step, Frontier
// gives it its output cap (outcap.go): the node's maxTokens, else the room
// its budget leaves, else DefaultOutputTokens, journaled with its input, so
// the budget's worst case is the cap the call sends.
//
// An LLM node may name a fallback list of models (workflow.Model): each
// attempt journals the model it calls in its input, a step_retrying's
// fallback names the model of the next attempt, and NextModel says when a
// failed attempt moves on to the next one (its retry policy spent on its
// model, or an outage), with a new attempt and key.
//
// # Creation, and prices as an input
//
// A run's run_created is built in one place (created.go): RunCreated for a
// start, a fork or a retry (package runs), ChildRunCreated for the child
// run of a subagent step (package workers). What is decided at creation is
// journaled in it, so that no worker decides it again: the effective
// budget, the anomaly rules, and the prices of the models the workflow
// names (PricesFor: its loops' and subagents' models and confidence judges
// included, from the creating process's table, provider.Prices), and the
// deployed workflow version the run executes (Creation.Deployed). A child
// journals its parent's prices and deployed reference. The builders write no index: both callers
// put the new run in PAL_INFLIGHT before they append its run_created
// (eventstore.MarkInflight), a child as a start, so every run is in the
// index from before its run_created to its end.
//
// Every budget check Next makes prices a call with the run's journaled
// prices (RunState.Prices), and the worker charges every call at the same
// prices (RunState.UsageOf), so the journal's cost and the budget agree,
// and two workers with different price files (PAL_PRICES) decide the same
// for the same journal (testdata/budget_journaled_prices.jsonl). A model
// the prices do not name is unpriced: held to the token, step and time
// limits only, its usage cost_unknown. A run_created without prices, from
// before they were journaled, is priced with the list prices of that time,
// frozen in this package (legacyPrices): not with the process's table, so
// such a journal also replays the same everywhere (the older golden
// histories are such journals). Only a worker that had its own PAL_PRICES
// decided such a run otherwise before; the journal cannot say so.
//
// Invariants: Fold and Next are pure functions of their arguments (no I/O,
// no clock, no randomness, no process-wide table or setting), so replaying
// the same journal always gives the same state and the same next action,
// in a worker, the projector or a test; and the fold refuses a malformed
// history rather than guess. See docs/architecture.md §7.
package engine
