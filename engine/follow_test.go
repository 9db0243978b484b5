package engine_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
)

// TestHistoriesFollowNext replays every saved journal event by event, as a
// worker would have written it, and checks that each step event is what
// Frontier asked for at that point, with the steps the drive had in
// flight busy: the step, the attempt, the key and the input it planned,
// and the run's end. It also checks that Frontier never plans a step that
// already completed, nor one in flight.
func TestHistoriesFollowNext(t *testing.T) {
	t.Parallel()
	eachHistory(t, func(t *testing.T, _ string, evs []event.Event) { foldFollowingNext(t, evs) })
}

// foldFollowingNext folds evs, checking before each event after the first
// that it follows what Frontier planned (checkFollowsNext), and returns
// the state after them.
func foldFollowingNext(t *testing.T, evs []event.Event) *engine.RunState {
	t.Helper()
	st := &engine.RunState{}
	busy := map[string]bool{}
	for i, ev := range evs {
		if i > 0 {
			checkFollowsNext(t, st, busy, ev)
		}
		require.NoError(t, st.Apply(ev))
		trackBusy(busy, ev)
	}
	return st
}

func checkFollowsNext(t *testing.T, st *engine.RunState, busy map[string]bool, ev event.Event) {
	t.Helper()
	at := fmt.Sprintf("seq %d (%s %s)", ev.Seq, ev.Kind, ev.StepID)
	next := engine.Frontier(context.Background(), st.Workflow, st, ev.TS, busy)
	if rs, ok := next.(engine.RunSteps); ok {
		for _, p := range rs.Plans {
			s, seen := st.Steps[p.StepID]
			require.False(t, seen && s.Status == engine.StepCompleted, "%s: Frontier plans completed step %s", at, p.StepID)
			require.False(t, busy[p.StepID], "%s: Frontier plans step %s, in flight", at, p.StepID)
			require.Equal(t, event.IdempotencyKey(st.RunID, p.StepID, p.Attempt), p.Key, at)
		}
		if len(rs.Plans) > 0 {
			next = engine.RunStep{Plan: rs.Plans[0]}
		}
	}
	if ev.Kind == event.StepFailed {
		var d event.StepFailedData
		require.NoError(t, ev.DecodeData(&d))
		if d.Class == event.ClassInterrupted {
			// A step in flight when another failed the run.
			require.True(t, busy[ev.StepID] || st.Steps[ev.StepID].Status == engine.StepRunning, "%s: interrupted, not in flight", at)
			_, ok := next.(engine.Fail)
			require.True(t, ok, "%s: interrupted, but Frontier says %#v", at, next)
			require.NotEmpty(t, d.InterruptedBy, at)
			return
		}
	}
	switch ev.Kind {
	case event.AnomalyDetected, event.BudgetWarning, event.BudgetExceeded:
		// The brakes' notes are Next's, to the letter.
		n, ok := next.(engine.Note)
		require.True(t, ok, "%s: Next says %#v", at, next)
		require.Equal(t, n.Kind, ev.Kind, at)
		require.Equal(t, n.StepID, ev.StepID, at)
		want, err := json.Marshal(n.Data)
		require.NoError(t, err)
		require.JSONEq(t, string(want), string(ev.Data), at)
		return
	case event.StepWaiting:
		var d event.StepWaitingData
		require.NoError(t, ev.DecodeData(&d))
		if d.Reason == event.WaitBudget || d.Reason == event.WaitAnomaly {
			p, ok := next.(engine.Park)
			require.True(t, ok, "%s: Next says %#v", at, next)
			require.Equal(t, engine.Park{Reason: d.Reason, StepID: ev.StepID}, p, at)
			return
		}
		if d.Reason != event.WaitApproval {
			return // a subagent waits for its child: the worker's finding
		}
		pp, a := planIn(st, busy, ev.StepID, ev.TS)
		require.NotNil(t, pp, "%s: Frontier says %#v", at, a)
		p := *pp
		require.NotNil(t, p.Wait, "%s: Next planned no wait", at)
		require.False(t, p.Wait.Waiting, "%s: waiting twice", at)
		require.Equal(t, p.Wait.TimeoutMs > 0, d.TimeoutAt != "", at)
		if d.TimeoutAt != "" {
			// The deadline was planned before this event, so not after
			// the one Next gives now.
			ts, err := time.Parse(time.RFC3339Nano, d.TimeoutAt)
			require.NoError(t, err)
			require.False(t, ts.After(p.Wait.TimeoutAt), "%s: deadline %s later than planned %s", at, ts, p.Wait.TimeoutAt)
		}
	case event.StepStarted, event.StepCompleted, event.StepRetrying, event.StepFailed,
		event.SideEffectClaimed, event.SideEffectDelivered:
		pp, a := planIn(st, busy, ev.StepID, ev.TS)
		require.NotNil(t, pp, "%s: Frontier says %#v", at, a)
		p := *pp
		require.Equal(t, ev.Attempt, p.Attempt, at)
		switch ev.Kind {
		case event.StepStarted:
			var d event.StepStartedData
			require.NoError(t, ev.DecodeData(&d))
			require.False(t, p.Started, "%s: the attempt had started already", at)
			require.Equal(t, p.Key, d.IdempotencyKey, at)
			require.Equal(t, p.NodeType, d.NodeType, at)
			require.JSONEq(t, string(p.Input), string(d.Input), at)
		case event.StepCompleted:
			if p.Pure {
				var d event.StepCompletedData
				require.NoError(t, ev.DecodeData(&d))
				require.JSONEq(t, string(p.Output), string(d.Output), at)
			} else {
				require.True(t, p.Started, at)
			}
		case event.SideEffectClaimed:
			var d event.SideEffectClaimedData
			require.NoError(t, ev.DecodeData(&d))
			require.True(t, p.Started, at)
			require.False(t, p.Claimed, "%s: claimed twice", at)
			require.Equal(t, p.Key, d.IdempotencyKey, at)
		case event.SideEffectDelivered:
			require.True(t, p.Claimed, at)
			require.False(t, p.Delivered, "%s: delivered twice", at)
		default:
			require.True(t, p.Started, at)
		}
	case event.RunSucceeded:
		c, ok := next.(engine.Complete)
		require.True(t, ok, "%s: Next says %#v", at, next)
		var d event.RunSucceededData
		require.NoError(t, ev.DecodeData(&d))
		require.JSONEq(t, string(c.Output), string(d.Output), at)
	case event.RunFailed:
		var d event.RunFailedData
		require.NoError(t, ev.DecodeData(&d))
		if d.Code == event.CodeCrashLoop {
			return // the worker's decision, not the engine's
		}
		f, ok := next.(engine.Fail)
		require.True(t, ok, "%s: Next says %#v", at, next)
		require.Equal(t, f.Code, d.Code, at)
		require.Equal(t, f.StepID, d.StepID, at)
		require.Equal(t, f.Error, d.Error, at)
	}
}
