package engine_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
)

// ev builds a raw envelope of run_a for fold tests.
func ev(seq uint64, k event.Kind, stepID string, attempt int, data string) event.Event {
	return event.Event{V: event.Version, RunID: "run_a", Seq: seq, Kind: k, StepID: stepID, Attempt: attempt,
		TS: baseTS.Add(time.Duration(seq) * time.Second), WorkerID: "worker-a", Data: json.RawMessage(data)}
}

func created(seq uint64) event.Event {
	return ev(seq, event.RunCreated, "", 0, `{"input":{"text":"hi"},"depth":0}`)
}

func resumed(seq uint64) event.Event {
	return ev(seq, event.RunResumed, "", 0, `{"worker":"worker-a","resume_count":1,"crashed":false}`)
}

func TestFoldErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		evs  []event.Event
		want string
		// lastSeq is the seq of the last event folded before the error.
		lastSeq uint64
	}{
		{"gap in seq", []event.Event{created(1), resumed(3)}, "seq 3 after 1: journal is not gapless", 1},
		{"first seq is not 1", []event.Event{ev(2, event.RunCreated, "", 0, `{"input":{},"depth":0}`)}, "seq 2 after 0", 0},
		{"repeated seq", []event.Event{created(1), resumed(2), resumed(2)}, "seq 2 after 2", 2},
		{"seq going back", []event.Event{created(1), resumed(2), ev(1, event.RunCancelled, "", 0, `{}`)}, "seq 1 after 2", 2},
		{"first event not run_created", []event.Event{resumed(1)}, "first event is run_resumed, want run_created", 0},
		{"first event a step", []event.Event{ev(1, event.StepStarted, "draft", 1, `{}`)}, "want run_created", 0},
		{"second run_created", []event.Event{created(1), resumed(2), created(3)}, "run_created at seq 3", 2},
		{"event of another run", []event.Event{created(1), func() event.Event { e := resumed(2); e.RunID = "run_b"; return e }()},
			"event of run run_b in its journal", 1},
		{"event after run_succeeded", []event.Event{created(1), resumed(2), ev(3, event.RunSucceeded, "", 0, `{"output":null}`), resumed(4)},
			"run_resumed at seq 4 after the run ended", 3},
		{"event after run_failed", []event.Event{created(1), ev(2, event.RunFailed, "", 0, `{"error":"x","code":"internal"}`),
			ev(3, event.StepStarted, "draft", 1, `{}`)}, "step_started at seq 3 after the run ended", 2},
		{"second terminal event", []event.Event{created(1), ev(2, event.RunCancelled, "", 0, `{}`), ev(3, event.RunCancelled, "", 0, `{}`)},
			"run_cancelled at seq 3 after the run ended", 2},
		{"unknown kind", []event.Event{created(1), ev(2, "step_exploded", "draft", 1, `{}`)}, `unknown event kind "step_exploded" at seq 2`, 1},
		{"empty kind", []event.Event{created(1), ev(2, "", "", 0, `{}`)}, `unknown event kind ""`, 1},
	}
	// Data that does not decode, for every kind whose payload the fold
	// reads.
	bad := map[event.Kind]string{
		event.RunCreated:          `{"input":{},"depth":"deep"}`,
		event.RunResumed:          `{"resume_count":"two"}`,
		event.StepStarted:         `{"input":{},"idempotency_key":7}`,
		event.StepCompleted:       `{"output":{},"duration_ms":"slow"}`,
		event.StepFailed:          `{"error":["x"]}`,
		event.StepRetrying:        `{"attempt":"2"}`,
		event.StepWaiting:         `{"reason":1}`,
		event.SideEffectDelivered: `{"status":"OK"}`,
		event.ChildRunCreated:     `{"child_run_id":{}}`,
		event.RunSucceeded:        `[]`,
		event.RunFailed:           `{"code":false}`,
		event.RunCancelled:        `"because"`,
	}
	for k, data := range bad {
		evs := []event.Event{created(1), ev(2, k, "draft", 1, data)}
		last := uint64(1)
		if k == event.RunCreated {
			evs, last = evs[1:], 0
			evs[0].Seq = 1
		}
		tests = append(tests, struct {
			name    string
			evs     []event.Event
			want    string
			lastSeq uint64
		}{"bad " + string(k) + " data", evs, fmt.Sprintf("decoding %s data of run run_a", k), last})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			st, err := engine.Fold(tt.evs)
			require.Error(t, err)
			require.ErrorContains(t, err, tt.want)
			require.NotNil(t, st)
			require.Equal(t, tt.lastSeq, st.LastSeq, "the bad event is not folded")
		})
	}
}

// FoldRead marks events that do not fold with ErrUnfoldable, so callers
// can tell a permanent failure from a read error, which it passes on as
// it is.
func TestFoldReadMarksUnfoldable(t *testing.T) {
	t.Parallel()
	_, err := engine.FoldRead([]event.Event{created(1), resumed(2), created(3)}, nil)
	require.ErrorIs(t, err, engine.ErrUnfoldable)
	require.ErrorContains(t, err, "the journal does not fold: run run_a: run_created at seq 3")
	readErr := errors.New("nats: timeout")
	_, err = engine.FoldRead(nil, readErr)
	require.Equal(t, readErr, err)
	st, err := engine.FoldRead([]event.Event{created(1), resumed(2)}, nil)
	require.NoError(t, err)
	require.Equal(t, engine.StatusRunning, st.Status)
}

func TestFoldEmpty(t *testing.T) {
	t.Parallel()
	st, err := engine.Fold(nil)
	require.NoError(t, err)
	require.Zero(t, st.LastSeq)
	require.Equal(t, engine.Status(""), st.Status)
}

func TestApplyAfterErrorContinues(t *testing.T) {
	t.Parallel()
	// A refused event leaves the state as it was: the next good event
	// folds.
	st, err := engine.Fold([]event.Event{created(1)})
	require.NoError(t, err)
	require.Error(t, st.Apply(ev(2, event.RunResumed, "", 0, `{"resume_count":"x"}`)))
	require.Equal(t, engine.StatusQueued, st.Status)
	require.NoError(t, st.Apply(resumed(2)))
	require.Equal(t, engine.StatusRunning, st.Status)
	require.Equal(t, uint64(2), st.LastSeq)
}

func TestFoldIgnoresRecordOnlyKinds(t *testing.T) {
	t.Parallel()
	base := []event.Event{created(1), resumed(2)}
	st, err := engine.Fold(base)
	require.NoError(t, err)
	want := summarise(st, engine.Next(st.Workflow, st, st.UpdatedAt))

	evs := append(base,
		ev(3, event.AnomalyDetected, "", 0, `{"anomaly":"cost_spike","value":3.5,"threshold":1,"action":"warn"}`),
		ev(4, event.ConfidenceEvaluated, "draft", 1, `{"score":0.4}`),
		ev(5, event.ConfidenceGateBypassed, "draft", 1, `{}`))
	st, err = engine.Fold(evs)
	require.NoError(t, err)
	got := summarise(st, engine.Next(st.Workflow, st, st.UpdatedAt))
	require.Equal(t, uint64(5), got.LastSeq)
	got.LastSeq, got.UpdatedAt = want.LastSeq, want.UpdatedAt
	require.Equal(t, want, got)
}

func TestFoldStepTransitions(t *testing.T) {
	t.Parallel()
	key1 := event.IdempotencyKey("run_a", "notify", 1)
	evs := []event.Event{
		created(1), resumed(2),
		ev(3, event.StepStarted, "notify", 1, `{"node_id":"notify","node_type":"connector","input":{"url":"u"},"idempotency_key":"`+key1+`"}`),
		ev(4, event.SideEffectClaimed, "notify", 1, `{"idempotency_key":"`+key1+`","connector":"webhook","target":"u"}`),
		// A stray receipt of another attempt does not count.
		ev(5, event.SideEffectDelivered, "notify", 7, `{"idempotency_key":"x","status":500}`),
	}
	st, err := engine.Fold(evs)
	require.NoError(t, err)
	s, ok := st.Steps["notify"]
	require.True(t, ok)
	require.Equal(t, engine.StepRunning, s.Status)
	require.True(t, s.Claimed)
	require.False(t, s.Delivered)
	require.Zero(t, s.DeliveryStatus)
	require.Equal(t, key1, s.Key)
	require.Equal(t, baseTS.Add(3*time.Second), s.StartedAt)

	// A journaled retry clears the claim: the retry may send again.
	require.NoError(t, st.Apply(ev(6, event.StepRetrying, "notify", 1, `{"attempt":2,"of":3,"error":"502","class":"connector","delay_ms":1500}`)))
	require.Equal(t, engine.StepRetrying, s.Status)
	require.False(t, s.Claimed)
	require.Equal(t, 2, s.Attempt)
	require.Equal(t, 1, s.Retries)
	require.Equal(t, "502", s.Error)
	require.Equal(t, baseTS.Add(6*time.Second+1500*time.Millisecond), s.RetryAt)

	key2 := event.IdempotencyKey("run_a", "notify", 2)
	require.NoError(t, st.Apply(ev(7, event.StepStarted, "notify", 2, `{"node_id":"notify","node_type":"connector","idempotency_key":"`+key2+`"}`)))
	require.Equal(t, engine.StepRunning, s.Status)
	require.Empty(t, s.Error, "a new start clears the last error")
	require.NoError(t, st.Apply(ev(8, event.SideEffectClaimed, "notify", 2, `{}`)))
	require.NoError(t, st.Apply(ev(9, event.SideEffectDelivered, "notify", 2, `{"idempotency_key":"`+key2+`","status":204}`)))
	require.True(t, s.Claimed)
	require.True(t, s.Delivered)
	require.Equal(t, 204, s.DeliveryStatus)
	require.NoError(t, st.Apply(ev(10, event.StepCompleted, "notify", 2, `{"output":{"delivery":"delivered","status":204},"delivery":"delivered","duration_ms":90}`)))
	require.Equal(t, engine.StepCompleted, s.Status)
	require.Equal(t, "delivered", s.Delivery)
	require.Equal(t, int64(90), s.DurationMs)
	require.Equal(t, "notify", st.LastCompleted)
	require.Equal(t, []string{"notify"}, st.Order)

	// Child runs and waits.
	require.NoError(t, st.Apply(ev(11, event.ChildRunCreated, "research", 1, `{"child_run_id":"run_cabc"}`)))
	require.NoError(t, st.Apply(ev(12, event.StepWaiting, "research", 1, `{"reason":"child","child_run_id":"run_cabc"}`)))
	r := st.Steps["research"]
	require.Equal(t, "run_cabc", r.ChildRunID)
	require.Equal(t, engine.StepWaiting, r.Status)
	require.Equal(t, engine.StatusWaiting, st.Status)
	require.False(t, st.DriveOpen, "a parked run has no open drive")
	require.Equal(t, []string{"notify", "research"}, st.Order)
	_, ok = st.Steps["nope"]
	require.False(t, ok)
}

func TestFoldCrashCounting(t *testing.T) {
	t.Parallel()
	evs := []event.Event{created(1), resumed(2),
		ev(3, event.StepStarted, "draft", 1, `{}`),
		ev(4, event.RunResumed, "", 0, `{"worker":"worker-b","resume_count":2,"crashed":true,"crashes_at_step":1}`),
		ev(5, event.RunResumed, "", 0, `{"worker":"worker-c","resume_count":3,"crashed":true,"crashes_at_step":2}`),
	}
	st, err := engine.Fold(evs)
	require.NoError(t, err)
	require.Equal(t, 3, st.Resumes)
	require.Equal(t, 2, st.CrashesAtStep)
	require.True(t, st.DriveOpen)
	require.Equal(t, "worker-c", st.LastWorker)

	require.NoError(t, st.Apply(ev(6, event.StepCompleted, "draft", 1, `{"output":"ok","usage":{"input_tokens":1,"output_tokens":2,"total_tokens":3,"cost_usd":0.5},"duration_ms":1}`)))
	require.Zero(t, st.CrashesAtStep, "a completed step resets the crash count")
	require.Equal(t, event.Usage{InputTokens: 1, OutputTokens: 2, TotalTokens: 3, CostUSD: 0.5}, st.Usage)
	require.True(t, st.DriveOpen)

	require.NoError(t, st.Apply(ev(7, event.RunSucceeded, "", 0, `{"output":"ok"}`)))
	require.False(t, st.DriveOpen)
	require.Equal(t, json.RawMessage(`"ok"`), st.Output)
	require.Equal(t, baseTS.Add(7*time.Second), st.EndedAt)
}

func TestStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		s        engine.Status
		terminal bool
	}{
		{engine.StatusQueued, false},
		{engine.StatusRunning, false},
		{engine.StatusWaiting, false},
		{engine.StatusSucceeded, true},
		{engine.StatusFailed, true},
		{engine.StatusCancelled, true},
	}
	for _, tt := range tests {
		require.Equal(t, tt.terminal, tt.s.Terminal(), tt.s)
	}
}

// TestFoldDeterministic: the same journal always folds to the same state
// and the same next action, however it is folded and however often Next
// is asked.
func TestFoldDeterministic(t *testing.T) {
	t.Parallel()
	eachHistory(t, func(t *testing.T, _ string, evs []event.Event) {
		first := foldSummary(t, evs)
		require.Equal(t, string(first), string(foldSummary(t, evs)), "second fold")

		// One event at a time, as a worker folds what it appends.
		st := &engine.RunState{}
		for _, e := range evs {
			require.NoError(t, st.Apply(e))
		}
		a1 := engine.Next(st.Workflow, st, st.UpdatedAt)
		a2 := engine.Next(st.Workflow, st, st.UpdatedAt)
		require.Equal(t, summariseAction(a1), summariseAction(a2), "Next twice")
		require.Equal(t, a1, engine.Next(st.Workflow, st, st.UpdatedAt), "Next three times")
		require.Equal(t, string(first), string(stateSummary(t, st)), "incremental fold")

		// Through the wire again.
		var again []event.Event
		for _, e := range evs {
			body, err := event.Encode(e)
			require.NoError(t, err)
			got, err := event.Decode(body)
			require.NoError(t, err)
			again = append(again, got...)
		}
		require.Equal(t, string(first), string(foldSummary(t, again)), "after a wire round trip")
	})
}

// TestParseCacheDoesNotAlias: two runs that claim the same workflow hash
// for different snapshots each get their own workflow.
func TestParseCacheDoesNotAlias(t *testing.T) {
	t.Parallel()
	const hash = "0000000000000000000000000000000000000000000000000000000000000000"
	mk := func(wf string) *engine.RunState {
		t.Helper()
		data, err := json.Marshal(event.RunCreatedData{Workflow: json.RawMessage(wf), WorkflowHash: hash, Input: json.RawMessage(`{}`)})
		require.NoError(t, err)
		st, err := engine.Fold([]event.Event{ev(1, event.RunCreated, "", 0, string(data))})
		require.NoError(t, err)
		return st
	}
	a := mk(`{"name":"a","nodes":[{"id":"start","type":"trigger"}],"edges":[]}`)
	b := mk(`{"name":"b","nodes":[{"id":"begin","type":"trigger"}],"edges":[]}`)
	require.NoError(t, a.WorkflowErr)
	require.NoError(t, b.WorkflowErr)
	require.Equal(t, "a", a.Workflow.Name)
	require.Equal(t, "b", b.Workflow.Name)
	c := mk(`{"name":"c","nodes":[]}`)
	require.Error(t, c.WorkflowErr)
	require.Nil(t, c.Workflow)
}

// TestEveryKindFolds: every kind of the vocabulary has its fold, and a
// kind outside it does not fold.
func TestEveryKindFolds(t *testing.T) {
	t.Parallel()
	for _, k := range event.Kinds {
		if k == event.RunCreated {
			continue
		}
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			_, err := engine.Fold([]event.Event{created(1), ev(2, k, "a", 1, `{}`)})
			require.NoError(t, err)
		})
	}
	_, err := engine.Fold([]event.Event{created(1), ev(2, event.Kind("step_teleported"), "a", 1, `{}`)})
	require.ErrorContains(t, err, `unknown event kind "step_teleported"`)
}
