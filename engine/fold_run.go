package engine

import (
	"fmt"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/workflow"
)

// The fold of a run's life: created, resumed by a drive, ended.

func (st *RunState) onRunCreated(ev event.Event, d event.RunCreatedData) error {
	if st.LastSeq != 0 {
		return fmt.Errorf("run %s: run_created at seq %d: the run was created at seq 1", st.RunID, ev.Seq)
	}
	st.Created = d
	st.Status = StatusQueued
	st.CreatedAt = ev.TS
	st.indexCopies()
	if len(st.Created.Workflow) > 0 {
		st.Workflow, st.WorkflowErr = workflow.ParseCached(st.Created.Workflow)
	}
	if st.Workflow != nil {
		if t := st.Workflow.Trigger(); t != nil {
			st.setOutput(t.ID, st.Created.Input)
		}
	}
	st.initBrakes()
	return nil
}

// indexCopies indexes run_created's forked_from.copies by step id.
func (st *RunState) indexCopies() {
	if f := st.Created.ForkedFrom; f != nil && len(f.Copies) > 0 {
		st.copies = make(map[string]*event.CopiedStep, len(f.Copies))
		for i := range f.Copies {
			st.copies[f.Copies[i].StepID] = &f.Copies[i]
		}
	}
}

func (st *RunState) onRunResumed(_ event.Event, d event.RunResumedData) error {
	st.Resumes = d.ResumeCount
	st.CrashesAtStep = d.CrashesAtStep
	st.LastWorker = d.Worker
	st.DriveOpen = true
	st.Status = StatusRunning
	for _, id := range st.Order {
		if s := st.Steps[id]; s.Status == StepRunning && s.NodeType == workflow.TypeProcess {
			s.Resumes++
		}
	}
	return nil
}

func (st *RunState) onRunSucceeded(ev event.Event, d event.RunSucceededData) error {
	st.Output = d.Output
	st.end(StatusSucceeded, ev)
	return nil
}

func (st *RunState) onRunFailed(ev event.Event, d event.RunFailedData) error {
	st.Error, st.ErrorCode, st.FailedStep = d.Error, d.Code, d.StepID
	st.end(StatusFailed, ev)
	return nil
}

func (st *RunState) onRunCancelled(ev event.Event, d event.RunCancelledData) error {
	st.Error = "cancelled"
	if d.Reason != "" {
		st.Error = "cancelled: " + d.Reason
	}
	st.end(StatusCancelled, ev)
	return nil
}

func (st *RunState) end(s Status, ev event.Event) {
	st.Status = s
	st.EndedAt = ev.TS
	st.DriveOpen = false
}
