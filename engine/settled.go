package engine

import "github.com/palrun/pal/workflow"

// settled is Frontier's memo of a run's top-level graph: the first n
// nodes of its topological order are settled, each resolved (its step
// ended and it routes on) or dead (no incoming edge fired), and the walk
// meets nothing it plans or that stops the run among them. A settled
// node stays so: its sources are settled before it, the edges leaving
// them read only steps that run before them (workflow.Parse checks
// templates name ancestors), and an ended step's output and status do
// not change. So each Frontier walks on from the first node not settled,
// and a step deep in a long chain costs what one near its start does,
// not a walk of every node before it. An event of a settled node's step
// (none in a journal that folds, but a fork's copies or a forged
// journal might try) drops the memo (forgetSettled).
type settled struct {
	wf *workflow.Workflow
	n  int
	// state holds the settled nodes' states by node index; the others
	// are pending (0).
	state []uint8
	// last is the id of the completed step with the highest CompletedSeq
	// among the settled nodes' ("" for none): a walk's output.
	last    string
	lastSeq uint64
}

// settledOf returns the run's memo for wf, a new one when it has none for
// it.
func (st *RunState) settledOf(wf *workflow.Workflow) *settled {
	if m := st.settled; m != nil && m.wf == wf {
		return m
	}
	st.settled = &settled{wf: wf, state: make([]uint8, len(wf.Nodes))}
	return st.settled
}

// settle records that the node at position k of the order (index idx)
// settled as seen, with last the walk's output step so far. Only the
// next position extends the prefix.
func (m *settled) settle(k, idx int, seen uint8, last *Step) {
	if k != m.n {
		return
	}
	m.state[idx] = seen
	m.n = k + 1
	if last != nil && last.CompletedSeq >= m.lastSeq {
		m.last, m.lastSeq = last.ID, last.CompletedSeq
	}
}

// forgetSettled drops the memo when an event names a settled node's step.
func (st *RunState) forgetSettled(stepID string) {
	m := st.settled
	if m == nil {
		return
	}
	if i := m.wf.Index(stepID); i >= 0 && m.state[i] != pending {
		st.settled = nil
	}
}
