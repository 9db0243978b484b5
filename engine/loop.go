package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/workflow"
)

// planLoop walks the loop's iterations in order from the first
// unfinished one, adding to f what each iteration in progress has ready:
// at most the loop's concurrency iterations are in progress at once, so
// later ones start as earlier ones finish. When all are done (or until is
// met) the loop step completes with {"iterations","results","stopped"},
// the results in the items' order whatever order the iterations finished
// in. The leading iterations found finished are memoized in st
// (loopMemo), so each walk starts at the first unfinished one: a step's
// cost does not grow with the iterations before it.
func (f *frontier) planLoop(wf *workflow.Workflow, node *workflow.Node, id StepID, env workflow.Env) {
	st := f.st
	sid := id.String()
	d, err := st.loopData(node)
	if err != nil {
		f.add(invalidNode(sid, err))
		return
	}
	body, ok := wf.Sub(node.ID)
	if !ok {
		f.add(invalidNode(sid, errors.New("loop has no parsed body")))
		return
	}
	m, n, stopped, fail := st.loopRange(sid, d, body, env)
	if fail != nil {
		f.add(fail)
		return
	}
	results := m.results
	open := 0 // iterations in progress
	for i := m.done; i < n && open < d.Parallel(); i++ {
		var item any
		if d.Over != "" {
			item = m.items.([]any)[i]
		}
		in := map[string]any{"item": item, "index": i, "with": m.with}
		scope := id.iteration(i)
		ienv := scopeEnv(st, body, scope, in)
		out, finished := f.walk(body, scope, ienv)
		if f.stop != nil {
			return
		}
		if !finished {
			open++
			continue
		}
		if open > 0 {
			// Finished ahead of one in progress: its result is taken,
			// in order, once those before it are.
			continue
		}
		if d.Until != "" {
			v, err := body.EvalContext(f.ctx, d.Until, ienv)
			if err != nil {
				f.add(loopFailed(sid, "until: %v", err))
				return
			}
			if b, _ := v.(bool); b {
				stopped = LoopStoppedUntil
				results = append(results[:i:i], out)
				break
			}
		}
		results = append(results, out)
		if f.ctx.Err() == nil {
			// Finished, and the loop goes on: no later event but one of
			// this iteration's steps (which Apply watches for) changes that.
			m.results, m.done = results, i+1
		}
	}
	if open > 0 {
		return
	}
	if results == nil {
		results = []json.RawMessage{}
	}
	p := basePlan(st, node, sid, ExecPure)
	p.Input, _ = json.Marshal(LoopInput{Iterations: len(results)})
	p.Output, _ = json.Marshal(LoopOutput{Iterations: len(results), Results: results, Stopped: stopped})
	p.Pure = true
	f.add(RunStep{Plan: p})
}

// loopRange renders the loop's over and with: the memo of the loop
// under them, how many iterations it runs, and why it stops after the
// last. A non-nil Action fails the run.
func (st *RunState) loopRange(sid string, d *workflow.LoopData, body *workflow.Workflow, env workflow.Env) (*loopMemo, int, string, Action) {
	n := d.Iterations()
	var overRaw, withRaw json.RawMessage
	var err error
	if d.Over != "" {
		if overRaw, err = workflow.RenderJSON(json.RawMessage(strconv.Quote(d.Over)), env); err != nil {
			return nil, 0, "", loopFailed(sid, "over: %v", err)
		}
	}
	if len(d.With) > 0 {
		if withRaw, err = workflow.RenderJSON(d.With, env); err != nil {
			return nil, 0, "", loopFailed(sid, "with: %v", err)
		}
	}
	m := st.loopMemo(sid, body, overRaw, withRaw)
	if d.Over == "" {
		return m, n, LoopStoppedMax, nil
	}
	arr, ok := m.items.([]any)
	if !ok {
		return nil, 0, "", loopFailed(sid, "over gave %s, want an array", string(overRaw))
	}
	if len(arr) > n {
		return nil, 0, "", loopFailed(sid, "over gave %d items, more than maxIterations (%d)", len(arr), n)
	}
	return m, len(arr), LoopStoppedItems, nil
}

// loopFailed fails the run at loop step sid.
func loopFailed(sid, format string, args ...any) Fail {
	return Fail{Code: CodeLoop, StepID: sid, Error: fmt.Sprintf("loop %s: ", sid) + fmt.Sprintf(format, args...)}
}

// loopData is node.Loop(), decoded once per state.
func (st *RunState) loopData(node *workflow.Node) (*workflow.LoopData, error) {
	if d, ok := st.loopNodes[node]; ok {
		return d, nil
	}
	d, err := node.Loop()
	if err != nil {
		return nil, err
	}
	if st.loopNodes == nil {
		st.loopNodes = map[*workflow.Node]*workflow.LoopData{}
	}
	st.loopNodes[node] = d
	return d, nil
}

// loopMemo is what Next found of one loop step in progress: under the
// rendered over and with (and the body), iterations 0..done-1 finished
// without stopping the loop, with results. A finished iteration's walk
// reads only the steps of that iteration, which no event changes without
// naming one of them, so the memo holds until such an event (forget).
type loopMemo struct {
	body             *workflow.Workflow
	overRaw, withRaw string
	items, with      any // over and with, decoded
	done             int
	results          []json.RawMessage
}

// loopMemo returns the memo of loop step sid under body and the rendered
// over and with, a fresh one when it has none or they changed.
func (st *RunState) loopMemo(sid string, body *workflow.Workflow, over, with json.RawMessage) *loopMemo {
	if m, ok := st.loops[sid]; ok && (m.body == body || m.body == nil) && m.overRaw == string(over) && m.withRaw == string(with) {
		// A memo from a snapshot (DecodeState) has no body yet: a loop's
		// step id names its node, so its body is this one.
		m.body = body
		return m
	}
	m := &loopMemo{body: body, overRaw: string(over), withRaw: string(with), items: decode(over), with: decode(with)}
	if st.loops == nil {
		st.loops = map[string]*loopMemo{}
	}
	st.loops[sid] = m
	return m
}

// forget drops the loop memos an event of step id could change: that of
// the loop itself when it ends, and that of a loop whose finished
// iterations hold the step. A memo of a loop in progress normally meets
// only events of its current iteration, so this costs a prefix test per
// loop in progress.
func (st *RunState) forget(kind event.Kind, id string) {
	for k, m := range st.loops {
		if id == k {
			if kind == event.StepCompleted || kind == event.StepFailed {
				delete(st.loops, k)
			}
			continue
		}
		if len(id) <= len(k) || id[len(k)] != '[' || id[:len(k)] != k {
			continue
		}
		rest := id[len(k)+1:]
		end := strings.IndexByte(rest, ']')
		if end < 0 {
			continue
		}
		if i, err := parseIndex(rest[:end]); err != nil || i < m.done {
			delete(st.loops, k)
		}
	}
}
