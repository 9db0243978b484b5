package workers

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/internal/retry"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/workflow"
)

// Threads (docs/architecture.md §7.3.1): a thread step (an ai-step
// or agent with thread: true, in a run started with a thread) holds its
// thread from its first model call until its turns are appended:
//
//  1. join, in the call's branch, before the model call: read the
//     thread; while another run's step holds it, wait (the step's
//     sub-step "thread" is running, journaled); then append the step's
//     open (fenced on the thread's last sequence: of two waiters one
//     wins, the other reads again and waits). A step that finds its own
//     open (a resumed call) does not open again. The request starts with
//     the thread's turns (the last threadWindow of them).
//  2. settle, on the drive's goroutine, once the step's step_completed
//     is durable (after each flush that carries one, and when a drive
//     loads the run: a crash between the two is settled by the next
//     drive): append the step's turns, unless the thread has them.
//  3. release, when the run ends: a close for each hold the run still
//     has (a step that failed). A waiter that finds the holder's run
//     ended without either closes the hold itself.
//
// Every record is written at most once per (kind, run, step): the writer
// reads the thread before it appends, and appends fenced on what it
// read, so a crash, a redelivery or a second drive neither loses nor
// doubles a turn.

// threadStep names a step's thread: the run's thread id, and the step
// that holds it (an agent's, for its turns).
type threadStep struct {
	id     string
	owner  string
	window int
}

// The settings of a thread's bound (eventstore.ThreadLimits).
const (
	EnvThreadMaxTurns = "PAL_THREAD_MAX_TURNS"
	EnvThreadMaxBytes = "PAL_THREAD_MAX_BYTES"
)

// threadWaitName is the sub-step that shows a thread step waiting for
// another run's.
const threadWaitName = "thread"

// threadPoll paces a waiting step's reads of the thread's tail: 50 ms,
// growing to 1 s.
var threadPoll = retry.Policy{Initial: 50 * time.Millisecond, Max: time.Second, Multiplier: 2}

// threadOf returns the thread of plan p's LLM call, if it continues one.
func threadOf(thread string, p engine.StepPlan) (threadStep, bool) {
	if thread == "" || p.Node == nil || p.Exec != engine.ExecLLM {
		return threadStep{}, false
	}
	on, window := workflow.ThreadOf(p.Node)
	if !on {
		return threadStep{}, false
	}
	owner := p.StepID
	if p.NodeType == workflow.TypeAgent {
		if i := strings.LastIndex(owner, ".turn["); i >= 0 {
			owner = owner[:i]
		}
	}
	return threadStep{id: thread, owner: owner, window: window}, true
}

// joinThread holds the call's thread for its step and returns the
// thread's turns to send before the step's own messages.
func (c *call) joinThread(ts threadStep) ([]provider.Message, error) {
	store, runID := c.d.w.store, c.d.runID
	waited, by := false, ""
	for n := 0; ; n++ {
		t, err := store.ReadThread(c.ctx, ts.id)
		if err != nil {
			return nil, err
		}
		if h, busy := t.HeldBy(runID); busy && !t.Has(event.ThreadOpen, runID, ts.owner) {
			ended, err := store.RunEnded(c.ctx, h.RunID)
			if err != nil {
				return nil, err
			}
			if ended {
				// The holder's run ended without releasing (a crash
				// after its end): release for it.
				_, err := store.AppendThread(c.ctx, t, event.ThreadRecord{Kind: event.ThreadClose, RunID: h.RunID, StepID: h.StepID,
					TS: c.d.w.now(), Reason: "its run ended"}, c.d.w.cfg.ThreadLimits)
				if err != nil && !errors.Is(err, eventstore.ErrThreadMoved) {
					return nil, err
				}
				continue
			}
			if !waited {
				waited, by = true, h.RunID
				if err := c.threadWaiting(ts, h.RunID, false); err != nil {
					return nil, err
				}
			}
			if err := c.awaitThread(ts.id, t.StreamSeq, h.RunID, n); err != nil {
				return nil, err
			}
			continue
		}
		if !t.Has(event.ThreadOpen, runID, ts.owner) {
			if err := c.d.w.cfg.ThreadLimits.Full(t); err != nil {
				return nil, permanent("step %s: %v", c.p.StepID, err)
			}
			_, err := store.AppendThread(c.ctx, t, event.ThreadRecord{Kind: event.ThreadOpen, RunID: runID, StepID: ts.owner,
				TS: c.d.w.now()}, c.d.w.cfg.ThreadLimits)
			switch {
			case errors.Is(err, eventstore.ErrThreadMoved):
				continue
			case errors.Is(err, eventstore.ErrThreadFull):
				return nil, permanent("step %s: %v", c.p.StepID, err)
			case err != nil:
				return nil, err
			}
			continue // read it back: the turns before the open
		}
		if waited {
			if err := c.threadWaiting(ts, by, true); err != nil {
				return nil, err
			}
		}
		return threadMessages(t, runID, ts), nil
	}
}

// awaitThread waits until thread id has moved past stream sequence seq
// or the run holding it has ended, looking at the thread's last record
// (one Direct Get) and the holder's last event at threadPoll's pace: a
// waiter reads the whole thread only when something changed.
func (c *call) awaitThread(id string, seq uint64, holder string, n int) error {
	for ; ; n++ {
		if err := sleepCtx(c.ctx, threadPoll.Wait(n)); err != nil {
			return err
		}
		tail, err := c.d.w.store.ThreadTail(c.ctx, id)
		if err != nil || tail != seq {
			return err
		}
		if ended, err := c.d.w.store.RunEnded(c.ctx, holder); err != nil || ended {
			return err
		}
	}
}

// threadMessages are the turns of t before the step's open, the last
// window of them when the step sets one.
func threadMessages(t event.Thread, runID string, ts threadStep) []provider.Message {
	var open uint64
	for _, h := range t.Holds {
		if h.RunID == runID && h.StepID == ts.owner {
			open = h.Seq
		}
	}
	var out []provider.Message
	for _, turn := range t.Turns {
		if open > 0 && turn.Seq > open {
			break
		}
		out = append(out, provider.Message{Role: turn.Role, Content: turn.Content})
	}
	if ts.window > 0 && len(out) > ts.window {
		out = out[len(out)-ts.window:]
	}
	return out
}

// threadWaiting journals the step's wait for the thread: its sub-step
// "thread" started, or completed with whom it waited for.
func (c *call) threadWaiting(ts threadStep, holder string, done bool) error {
	p := c.p
	return c.journal(func() error {
		if done {
			out, _ := json.Marshal(map[string]string{"thread": ts.id, "waited_for": holder})
			c.d.emit(event.SubstepCompleted, p.StepID, p.Attempt, event.SubstepCompletedData{Name: threadWaitName, Output: out})
		} else {
			c.d.emit(event.SubstepStarted, p.StepID, p.Attempt, event.SubstepStartedData{Name: threadWaitName})
		}
		return c.d.flush()
	})
}

// sleepCtx waits d or until ctx ends.
func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// settleThreads appends the turns of every thread step of the run whose
// step_completed is durable and whose turns the drive has not seen in
// the thread; with release, it also closes the run's holds that have no
// turns (the run ended). On the drive's goroutine, after a flush.
func (d *drive) settleThreads(release bool) error {
	thread := d.st.Created.Thread
	if thread == "" || d.st.Workflow == nil {
		return nil
	}
	var due []threadTurns
	for _, id := range d.st.Order {
		s := d.st.Steps[id]
		if s == nil || s.Status != engine.StepCompleted || d.threadDone[id] {
			continue
		}
		if tt, ok := d.threadTurnsOf(id, s); ok {
			due = append(due, tt)
		}
	}
	if d.threadDone == nil {
		d.threadDone = map[string]bool{}
	}
	if len(due) == 0 && !release {
		return nil
	}
	t, err := d.w.store.ReadThread(d.ctx, thread)
	if err != nil {
		return err
	}
	for i := 0; i < len(due); i++ {
		tt := due[i]
		if !t.Has(event.ThreadTurns, d.runID, tt.step) && !t.Has(event.ThreadClose, d.runID, tt.step) {
			next, err := d.w.store.AppendThread(d.ctx, t, event.ThreadRecord{Kind: event.ThreadTurns, RunID: d.runID,
				StepID: tt.step, TS: d.w.now(), Turns: tt.turns}, d.w.cfg.ThreadLimits)
			if errors.Is(err, eventstore.ErrThreadMoved) {
				if t, err = d.w.store.ReadThread(d.ctx, thread); err != nil {
					return err
				}
				i--
				continue
			}
			if errors.Is(err, eventstore.ErrThreadFull) {
				// The step's answer stands; the thread keeps what it has
				// and is released.
				d.log.Warn("thread full: the step's turns are not kept", "thread", thread, "step_id", tt.step, "err", err)
				next, err = d.w.store.AppendThread(d.ctx, t, event.ThreadRecord{Kind: event.ThreadClose, RunID: d.runID,
					StepID: tt.step, TS: d.w.now(), Reason: err.Error()}, d.w.cfg.ThreadLimits)
			}
			if err != nil {
				return err
			}
			t = next
		}
		d.threadDone[tt.step] = true
	}
	if !release {
		return nil
	}
	for _, h := range t.Holds {
		if h.RunID != d.runID {
			continue
		}
		_, err := d.w.store.AppendThread(d.ctx, t, event.ThreadRecord{Kind: event.ThreadClose, RunID: d.runID,
			StepID: h.StepID, TS: d.w.now(), Reason: "the run ended"}, d.w.cfg.ThreadLimits)
		if err != nil && !errors.Is(err, eventstore.ErrThreadMoved) {
			return err
		}
		return d.settleThreads(true) // read again: one close at a time
	}
	return nil
}

// completes reports whether evs hold a step_completed.
func completes(evs []event.Event) bool {
	for _, ev := range evs {
		if ev.Kind == event.StepCompleted {
			return true
		}
	}
	return false
}

// releaseThread settles the run's thread before its end is journaled: a
// run that has ended has its turns in the thread and holds it no more.
func (d *drive) releaseThread() error {
	if d.st.Created.Thread == "" {
		return nil
	}
	if err := d.flush(); err != nil {
		return err
	}
	return d.settleThreads(true)
}

// threadTurns are a completed thread step's turns.
type threadTurns struct {
	step  string
	turns []event.ThreadTurn
}

// threadTurnsOf returns the turns of completed step id, when it is a
// thread step: an ai-step's own messages and its answer; an agent's
// prompt and its final answer.
func (d *drive) threadTurnsOf(id string, s *engine.Step) (threadTurns, bool) {
	node, ok := engine.NodeForStep(d.st.Workflow, id)
	if !ok {
		return threadTurns{}, false
	}
	on, _ := workflow.ThreadOf(node)
	if !on {
		return threadTurns{}, false
	}
	var turns []event.ThreadTurn
	switch node.Type {
	case workflow.TypeAIStep:
		var in engine.AIInput
		var out engine.LLMOutput
		if json.Unmarshal(s.Input, &in) != nil || json.Unmarshal(s.Output, &out) != nil {
			return threadTurns{}, false
		}
		for _, m := range in.Messages {
			if m.Role != provider.RoleSystem {
				turns = append(turns, event.ThreadTurn{Role: m.Role, Content: m.Content})
			}
		}
		turns = append(turns, event.ThreadTurn{Role: provider.RoleAssistant, Content: out.Text})
	case workflow.TypeAgent:
		var in engine.AIInput
		var out engine.AgentOutput
		first := d.st.Steps[id+".turn[0]"]
		if first == nil || json.Unmarshal(first.Input, &in) != nil || len(in.Messages) == 0 || json.Unmarshal(s.Output, &out) != nil {
			return threadTurns{}, false
		}
		turns = append(turns, event.ThreadTurn{Role: in.Messages[0].Role, Content: in.Messages[0].Content},
			event.ThreadTurn{Role: provider.RoleAssistant, Content: out.Text})
	default:
		return threadTurns{}, false
	}
	return threadTurns{step: id, turns: turns}, true
}
