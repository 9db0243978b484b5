package engine

import (
	"bytes"
	"encoding/gob"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/workflow"
)

// StateVersion names the encoding EncodeState writes. A state encoded by
// another version is refused (DecodeState), and its reader folds the
// journal instead: bump it whenever RunState or the fold changes what a
// journal folds to. 2: run_created's prices.
const StateVersion = 3

// stateWire is a RunState as encoded: its exported fields, bar the parsed
// workflow (parsed again from run_created), and the unexported ones Apply
// goes on from, and Next's loop memos. The lazily decoded values are left
// out: they are rebuilt on use.
type stateWire struct {
	Version int
	State   RunState
	Cleared map[string]bool
	// RulesDefault: the run named no anomaly rules, and has the
	// defaults (gob does not tell a nil map from an empty one).
	RulesDefault bool
	// PricesJournaled: run_created journaled prices, maybe none (the
	// run is not priced with the legacy table, RunState.Prices).
	PricesJournaled bool
	Candidates      []event.AnomalyDetectedData
	CandKeys        map[string]bool
	ToolCalls       map[string]int
	Requests        map[[32]byte]int
	TurnKeys        map[string][32]byte
	Retries         int
	Costs           []float64
	Tokens          []float64
	Outputs         map[string]json.RawMessage
	// Loops are Next's memos of the loops in progress: a long loop's
	// finished iterations are not walked again on the first Next.
	Loops map[string]loopWire
}

// loopWire is a loopMemo bar its body, which the loop's step id names
// (loopMemo takes it on first use), and the decoded over and with.
type loopWire struct {
	Over, With string
	Done       int
	Results    []json.RawMessage
}

// EncodeState encodes st so that DecodeState gives back a state that
// folds on (Apply) and decides (Next) as st does.
func EncodeState(st *RunState) ([]byte, error) {
	w := stateWire{Version: StateVersion, State: *st, Cleared: st.cleared,
		RulesDefault: st.Created.Anomalies == nil, PricesJournaled: st.Created.Prices != nil, Candidates: st.br.candidates, CandKeys: st.br.candKeys,
		ToolCalls: st.br.toolCalls, Requests: st.br.requests, TurnKeys: st.br.turnKeys,
		Retries: st.br.retries, Costs: st.br.costs, Tokens: st.br.tokens}
	w.State.Workflow, w.State.WorkflowErr = nil, nil
	if len(st.outputs) > 0 {
		w.Outputs = make(map[string]json.RawMessage, len(st.outputs))
		for id, v := range st.outputs {
			raw, ok := v.(json.RawMessage)
			if !ok {
				return nil, fmt.Errorf("encoding run %s: output of %s is a %T", st.RunID, id, v)
			}
			w.Outputs[id] = raw
		}
	}
	if len(st.loops) > 0 {
		w.Loops = make(map[string]loopWire, len(st.loops))
		for sid, m := range st.loops {
			w.Loops[sid] = loopWire{Over: m.overRaw, With: m.withRaw, Done: m.done, Results: m.results}
		}
	}
	var buf bytes.Buffer
	if err := gob.NewEncoder(&buf).Encode(&w); err != nil {
		return nil, fmt.Errorf("encoding run %s: %w", st.RunID, err)
	}
	return buf.Bytes(), nil
}

// ErrStateVersion is DecodeState's error for a state of another version.
var ErrStateVersion = errors.New("state encoded by another version")

// DecodeState decodes what EncodeState wrote. The bytes are not trusted
// to be well formed: a state that does not decode, or is not a folded run,
// is an error. That they fold what the journal holds is the caller's to
// check (the head they were encoded at, against the journal).
func DecodeState(b []byte) (*RunState, error) {
	var w stateWire
	if err := gob.NewDecoder(bytes.NewReader(b)).Decode(&w); err != nil {
		return nil, fmt.Errorf("decoding a run state: %w", err)
	}
	if w.Version != StateVersion {
		return nil, fmt.Errorf("decoding a run state: version %d, want %d: %w", w.Version, StateVersion, ErrStateVersion)
	}
	st := &w.State
	if st.LastSeq == 0 || event.ValidateRunID(st.RunID) != nil {
		return nil, errors.New("decoding a run state: not a folded run")
	}
	// Gob sends no empty map: put back those Apply writes to.
	st.Steps = orEmpty(st.Steps)
	st.Decisions = orEmpty(st.Decisions)
	st.Warned = orEmpty(st.Warned)
	st.Anomalies = orEmpty(st.Anomalies)
	for id, s := range st.Steps {
		if s == nil || s.ID != id {
			return nil, fmt.Errorf("decoding run %s: bad step %q", st.RunID, id)
		}
	}
	st.cleared = orEmpty(w.Cleared)
	if w.PricesJournaled {
		st.Created.Prices = orEmpty(st.Created.Prices)
	}
	rules := DefaultAnomalies
	if !w.RulesDefault {
		st.Created.Anomalies = orEmpty(st.Created.Anomalies)
		rules = st.Created.Anomalies
	}
	st.br = brakes{rules: rules, candidates: w.Candidates, candKeys: orEmpty(w.CandKeys),
		toolCalls: orEmpty(w.ToolCalls), requests: orEmpty(w.Requests), turnKeys: orEmpty(w.TurnKeys),
		retries: w.Retries, costs: w.Costs, tokens: w.Tokens}
	if len(w.Outputs) > 0 {
		st.outputs = make(map[string]any, len(w.Outputs))
		for id, raw := range w.Outputs {
			st.outputs[id] = raw
		}
	}
	for sid, l := range w.Loops {
		if l.Done < 0 || l.Done != len(l.Results) {
			return nil, fmt.Errorf("decoding run %s: bad memo of loop %s", st.RunID, sid)
		}
		for i, r := range l.Results {
			if len(r) == 0 {
				l.Results[i] = nil // gob gives an empty value for a nil one
			}
		}
		if st.loops == nil {
			st.loops = map[string]*loopMemo{}
		}
		st.loops[sid] = &loopMemo{overRaw: l.Over, withRaw: l.With, done: l.Done, results: l.Results,
			items: decode(json.RawMessage(l.Over)), with: decode(json.RawMessage(l.With))}
	}
	st.indexCopies()
	if len(st.Created.Workflow) > 0 {
		st.Workflow, st.WorkflowErr = workflow.ParseCached(st.Created.Workflow)
	}
	return st, nil
}

func orEmpty[K comparable, V any](m map[K]V) map[K]V {
	if m == nil {
		return map[K]V{}
	}
	return m
}
