// Package engine is PAL's pure core: Fold turns a run's journal into its
// state, and Next decides what the run does next. Nothing here does I/O or
// reads a clock: Next is given the time, so a deadline (an approval's
// timeout) is decided here, once, and a replay given the same time decides
// the same. The worker (package workers) does the I/O, the projector
// (package projections) uses the same fold to compute status and step rows.
//
// What crosses between the engine and the worker is typed: the step inputs
// the engine renders and the outputs the worker journals are the types of
// contract.go, and step ids are StepID values (stepid.go), built by its
// constructors and read back by ParseStepID.
//
// The fold is strict: seq must be gapless from 1 and run_created must come
// first. It does not verify the journal's hash chain or writers: that is
// event.Chain's, applied by every reader of NATS before it folds (golden
// histories are fold tests and carry no prev); FoldRead folds what such a
// reader got, a corrupt journal as failed with code journal_corrupt. Every step transition is a journal event, so the state is only a
// cache of the journal: replaying the same events always gives the same
// state (golden histories in testdata check this).
//
// Next walks the workflow graph from the trigger in topological order. A
// node runs when every node with an edge into it is resolved (completed, or
// dead because none of its own incoming edges fired) and at least one of
// its incoming edges fired; nodes run one at a time, first in declaration
// order. A completed step is never run again: its journaled output is
// reused. When nothing is left to run the run succeeds with the output of
// the last completed step.
//
// Invariants: Fold and Next are pure functions of their arguments (no I/O,
// no clock, no randomness), so replaying the same journal always gives the
// same state and the same next action, in a worker, the projector or a
// test; and the fold refuses a malformed history rather than guess. See
// docs/architecture.md §7.
package engine
