package event_test

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
)

var testTS = time.Date(2025, 1, 15, 10, 0, 0, 123456789, time.UTC)

// sampleEvent builds a complete envelope of run runID at seq.
func sampleEvent(t testing.TB, runID string, seq uint64, k event.Kind, stepID string, attempt int, payload any) event.Event {
	t.Helper()
	ev, err := event.New(k, stepID, attempt, payload)
	require.NoError(t, err)
	ev.RunID, ev.Seq, ev.TS, ev.WorkerID = runID, seq, testTS.Add(time.Duration(seq)*time.Millisecond), "worker-1"
	return ev
}

func sampleBatch(t testing.TB) []event.Event {
	t.Helper()
	const run = "run_01HZX3K7Q9V2M8N4P6R5T1W0YB"
	key := event.IdempotencyKey(run, "review", 1)
	completed := sampleEvent(t, run, 4, event.StepCompleted, "draft", 1, event.StepCompletedData{
		Output:     json.RawMessage(`{"text":"a short summary","model":"gpt-4o-mini"}`),
		Usage:      &event.Usage{InputTokens: 120, OutputTokens: 30, TotalTokens: 150, CostUSD: 0.000036},
		DurationMs: 812,
	})
	completed.TraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	started := sampleEvent(t, run, 5, event.StepStarted, "review", 1, event.StepStartedData{
		NodeID: "review", NodeType: "ai-step", IdempotencyKey: key,
		Input: json.RawMessage(`{"provider":"anthropic","model":"claude-sonnet-4-5","messages":[{"role":"user","content":"Check this summary: a short summary"}]}`),
	})
	return []event.Event{completed, started}
}

func TestEncodeDecodeRoundTrip(t *testing.T) {
	t.Parallel()
	batch := sampleBatch(t)

	t.Run("one event", func(t *testing.T) {
		t.Parallel()
		body, err := event.Encode(batch[0])
		require.NoError(t, err)
		require.Equal(t, byte('{'), body[0], "one event is encoded as an object")
		got, err := event.Decode(body)
		require.NoError(t, err)
		require.Equal(t, batch[:1], got)
	})

	t.Run("packed batch", func(t *testing.T) {
		t.Parallel()
		body, err := event.Encode(batch...)
		require.NoError(t, err)
		require.Equal(t, byte('['), body[0], "several events are encoded as an array")
		got, err := event.Decode(body)
		require.NoError(t, err)
		require.Equal(t, batch, got)
	})

	t.Run("batch of one", func(t *testing.T) {
		t.Parallel()
		body, err := json.Marshal(batch[:1])
		require.NoError(t, err)
		got, err := event.Decode(body)
		require.NoError(t, err)
		require.Equal(t, batch[:1], got)
	})

	t.Run("surrounding whitespace", func(t *testing.T) {
		t.Parallel()
		body, err := event.Encode(batch...)
		require.NoError(t, err)
		got, err := event.Decode([]byte("\n\t " + string(body) + " \r\n"))
		require.NoError(t, err)
		require.Equal(t, batch, got)
	})

	t.Run("wire form", func(t *testing.T) {
		t.Parallel()
		ev := event.MustNew(event.RunCancelled, "", 0, event.RunCancelledData{Reason: "user request"})
		ev.RunID, ev.Seq, ev.TS, ev.WorkerID = "run_x", 7, time.Date(2025, 1, 15, 10, 0, 0, 0, time.UTC), "api"
		body, err := event.Encode(ev)
		require.NoError(t, err)
		// step_id, attempt and trace_id are omitted when empty.
		require.JSONEq(t, `{"v":1,"run_id":"run_x","seq":7,"kind":"run_cancelled","ts":"2025-01-15T10:00:00Z",
			"worker_id":"api","data":{"reason":"user request"}}`, string(body))
	})
}

func TestEncodeNothing(t *testing.T) {
	t.Parallel()
	_, err := event.Encode()
	require.Error(t, err)
}

func TestDecodeMalformed(t *testing.T) {
	t.Parallel()
	valid := func(mut func(m map[string]any)) string {
		m := map[string]any{"v": 1, "run_id": "run_a", "seq": 1, "kind": "run_created",
			"ts": "2025-01-15T10:00:00Z", "worker_id": "w", "data": map[string]any{}}
		mut(m)
		b, err := json.Marshal(m)
		require.NoError(t, err)
		return string(b)
	}
	env := func(run string, seq int) string {
		return fmt.Sprintf(`{"v":1,"run_id":%q,"seq":%d,"kind":"step_started","ts":"2025-01-15T10:00:00Z","worker_id":"w","data":{}}`, run, seq)
	}
	tests := []struct {
		name string
		body string
		want string
	}{
		{"empty", "", "empty body"},
		{"only whitespace", " \n\t", "empty body"},
		{"not JSON", "hello", ""},
		{"truncated object", `{"v":1,"run_id":"run_a"`, ""},
		{"trailing garbage", valid(func(map[string]any) {}) + "x", ""},
		{"JSON string", `"run_created"`, ""},
		{"JSON number", `42`, ""},
		{"null", `null`, "unsupported version 0"},
		{"empty object", `{}`, "unsupported version 0"},
		{"empty batch", `[]`, "empty batch"},
		{"batch of null", `[null]`, "unsupported version 0"},
		{"batch of numbers", `[1,2]`, ""},
		{"wrong field type", valid(func(m map[string]any) { m["seq"] = "one" }), ""},
		{"negative seq", valid(func(m map[string]any) { m["seq"] = -1 }), ""},
		{"missing v", valid(func(m map[string]any) { delete(m, "v") }), "unsupported version 0"},
		{"wrong v", valid(func(m map[string]any) { m["v"] = 2 }), "unsupported version 2"},
		{"missing run_id", valid(func(m map[string]any) { delete(m, "run_id") }), "missing run_id"},
		{"empty run_id", valid(func(m map[string]any) { m["run_id"] = "" }), "missing run_id"},
		{"missing seq", valid(func(m map[string]any) { delete(m, "seq") }), "missing seq"},
		{"zero seq", valid(func(m map[string]any) { m["seq"] = 0 }), "missing seq"},
		{"missing kind", valid(func(m map[string]any) { delete(m, "kind") }), "missing kind"},
		{"bad element in batch", "[" + env("run_a", 1) + `,{"v":1}]`, "missing run_id"},
		{"batch with a gap", "[" + env("run_a", 1) + "," + env("run_a", 3) + "]", "not consecutive"},
		{"batch out of order", "[" + env("run_a", 2) + "," + env("run_a", 1) + "]", "not consecutive"},
		{"batch with a repeat", "[" + env("run_a", 2) + "," + env("run_a", 2) + "]", "not consecutive"},
		{"batch mixing runs", "[" + env("run_a", 1) + "," + env("run_b", 2) + "]", "not consecutive"},
		{"batch mixing runs later", "[" + env("run_a", 1) + "," + env("run_a", 2) + "," + env("run_b", 3) + "]", "not consecutive"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			evs, err := event.Decode([]byte(tt.body))
			require.ErrorIs(t, err, event.ErrMalformed)
			require.Nil(t, evs)
			if tt.want != "" {
				require.ErrorContains(t, err, tt.want)
			}
		})
	}
}

func TestDecodeKeepsUnknownKindsAndIgnoresUnknownPayloadFields(t *testing.T) {
	t.Parallel()
	// Decode checks the envelope only: kinds are the fold's business, and
	// payloads may grow.
	body := `{"v":1,"run_id":"run_a","seq":3,"kind":"some_future_kind","ts":"2025-01-15T10:00:00Z","worker_id":"w","data":{"new":true}}`
	evs, err := event.Decode([]byte(body))
	require.NoError(t, err)
	require.Len(t, evs, 1)
	require.Equal(t, event.Kind("some_future_kind"), evs[0].Kind)
	require.False(t, evs[0].Kind.Known())

	var d event.RunCancelledData
	ev := evs[0]
	ev.Data = json.RawMessage(`{"reason":"r","added_later":[1,2]}`)
	require.NoError(t, ev.DecodeData(&d))
	require.Equal(t, "r", d.Reason)
}

func TestNew(t *testing.T) {
	t.Parallel()
	ev, err := event.New(event.StepFailed, "draft", 2, event.StepFailedData{Error: "boom", Class: event.ClassLLM, DurationMs: 5})
	require.NoError(t, err)
	require.Equal(t, event.Version, ev.V)
	require.Equal(t, event.StepFailed, ev.Kind)
	require.Equal(t, "draft", ev.StepID)
	require.Equal(t, 2, ev.Attempt)
	require.JSONEq(t, `{"error":"boom","class":"llm","duration_ms":5}`, string(ev.Data))

	// A nil payload still gives an object, as the schema requires.
	ev, err = event.New(event.RunCancelled, "", 0, nil)
	require.NoError(t, err)
	require.Equal(t, `{}`, string(ev.Data))

	_, err = event.New(event.StepCompleted, "x", 1, map[string]any{"f": func() {}})
	require.ErrorContains(t, err, "step_completed")

	require.Panics(t, func() { event.MustNew(event.StepCompleted, "x", 1, make(chan int)) })
}

func TestDecodeData(t *testing.T) {
	t.Parallel()
	ev := event.Event{RunID: "run_a", Seq: 9, Kind: event.StepRetrying,
		Data: json.RawMessage(`{"attempt":2,"of":3,"error":"503","class":"llm","delay_ms":500}`)}
	var d event.StepRetryingData
	require.NoError(t, ev.DecodeData(&d))
	require.Equal(t, event.StepRetryingData{Attempt: 2, Of: 3, Error: "503", Class: "llm", DelayMs: 500}, d)

	ev.Data = nil
	require.NoError(t, ev.DecodeData(&d), "absent data decodes to nothing")

	ev.Data = json.RawMessage(`{"attempt":"two"}`)
	err := ev.DecodeData(&d)
	require.Error(t, err)
	for _, want := range []string{"step_retrying", "run_a", "seq 9"} {
		require.ErrorContains(t, err, want)
	}
}

func TestKinds(t *testing.T) {
	t.Parallel()
	seen := map[event.Kind]bool{}
	for _, k := range event.Kinds {
		require.True(t, k.Known(), k)
		require.False(t, seen[k], "duplicate kind %s", k)
		seen[k] = true
		require.Equal(t, strings.ToLower(string(k)), string(k))
	}
	require.Len(t, event.Kinds, 23, "the twenty-three kinds of docs/architecture.md §6.2")
	require.False(t, event.Kind("").Known())
	require.False(t, event.Kind("RUN_CREATED").Known())

	terminal := map[event.Kind]bool{event.RunSucceeded: true, event.RunFailed: true, event.RunCancelled: true}
	for _, k := range event.Kinds {
		require.Equal(t, terminal[k], k.Terminal(), k)
		require.Equal(t, k == event.ApprovalReceived || k == event.BudgetRaised || k == event.SignalReceived, k.Input(), k)
	}
}

func TestUsageAdd(t *testing.T) {
	t.Parallel()
	u := event.Usage{InputTokens: 1, OutputTokens: 2, TotalTokens: 3, CostUSD: 0.5}
	u.Add(event.Usage{InputTokens: 10, OutputTokens: 20, TotalTokens: 30, CostUSD: 0.25})
	require.Equal(t, event.Usage{InputTokens: 11, OutputTokens: 22, TotalTokens: 33, CostUSD: 0.75}, u)
}
