package workflow

// What a workflow says about running its steps at once: the run's limit
// (policy.concurrency), a loop's (concurrency), an agent's tool calls
// (parallelToolCalls), and whether a node's failure ends the run
// (onFailure).

// Bounds and defaults of the concurrency settings.
const (
	// DefaultConcurrency is how many steps of a run are in flight at once
	// when policy.concurrency is unset (a worker's PAL_RUN_CONCURRENCY
	// caps it).
	DefaultConcurrency = 8
	// DefaultLoopConcurrency is how many iterations of a loop are in
	// progress at once when the loop sets no concurrency: one after
	// another.
	DefaultLoopConcurrency = 1
	// MaxConcurrency bounds policy.concurrency and a loop's concurrency.
	MaxConcurrency = 1000
)

// Values of a node's onFailure.
const (
	// OnFailureFail (the default): the node's failed step fails the run,
	// and its siblings in flight are interrupted.
	OnFailureFail = "fail"
	// OnFailureContinue: the run goes on; the failed step resolves its
	// node, and conditions read steps.<id>.status == "failed" (and
	// steps.<id>.error).
	OnFailureContinue = "continue"
)

// Step statuses as conditions read them (steps.<id>.status).
const (
	StatusCompleted = "completed"
	StatusFailed    = "failed"
)

// Concurrency is how many steps of a run of w may be in flight at once:
// policy.concurrency, or DefaultConcurrency.
func (w *Workflow) Concurrency() int {
	if w == nil || w.Policy == nil || w.Policy.Concurrency <= 0 {
		return DefaultConcurrency
	}
	return w.Policy.Concurrency
}

// Parallel is how many of the loop's iterations may be in progress at
// once: its concurrency, or DefaultLoopConcurrency.
func (d *LoopData) Parallel() int {
	if d.Concurrency <= 0 {
		return DefaultLoopConcurrency
	}
	return d.Concurrency
}

// ParallelCalls reports whether the agent runs one turn's tool calls
// together (parallelToolCalls, default true).
func (d *AgentData) ParallelCalls() bool {
	return d.ParallelToolCalls == nil || *d.ParallelToolCalls
}

// Continues reports whether the run goes on when the node's step fails
// (onFailure "continue").
func (n *Node) Continues() bool { return n.OnFailure == OnFailureContinue }
