package workers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/runs"
)

// TestTracesOfAKilledDrive: a real pal worker exporting OTLP/HTTP to an
// in-process receiver is killed with kill -9 in the middle of step s3; a
// second worker finishes the run. The receiver gets exactly two traces
// for the run, the ones journaled on the two run_resumed events: the
// killed drive's holds its pal.resume span and the spans of the step
// attempts that ended (s1, s2, each with its GenAI chat span), never its
// root span (a killed process ends no span); the second drive's root
// span links to the first drive's, and its step spans carry the trace
// context sent as traceparent by the webhook and the http tool.
func TestTracesOfAKilledDrive(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	otlp := testenv.StartOTLP(t)
	var (
		mu      sync.Mutex
		toolHdr string
	)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		toolHdr = r.Header.Get("traceparent")
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ok":true}`))
	}))
	t.Cleanup(api.Close)
	wf := fmt.Sprintf(`{"name":"traced","nodes":[{"id":"start","type":"trigger"},
		{"id":"s1","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"one"}},
		{"id":"s2","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"two"}},
		{"id":"s3","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"three"}},
		{"id":"notify","type":"connector","data":{"kind":"webhook","url":%q,"body":{"n":1}}},
		{"id":"call","type":"tool","data":{"tool":"http","input":{"method":"GET","url":%q}}}],
		"edges":[{"from":"start","to":"s1"},{"from":"s1","to":"s2"},{"from":"s2","to":"s3"},
		{"from":"s3","to":"notify"},{"from":"notify","to":"call"}]}`, p.Hook.URL(), api.URL)

	runID := event.NewRunID()
	hold := p.LLM.Hold(providertest.ByKey(key(runID, "s3", 1)))
	w1 := p.palWorker(t, "w1", otlp.Env()...)
	_, err := runs.New(p.Store).Start(context.Background(), runs.StartCommand{Rights: runs.AllRights, RunID: runID, Workflow: json.RawMessage(wf)})
	require.NoError(t, err)
	_, err = hold.Wait(ctxFor(t, 30*time.Second))
	require.NoError(t, err, w1.Output())
	// The spans of s1 and s2 ended before s3's call; let them be exported
	// (within OTEL_BSP_SCHEDULE_DELAY) before the kill.
	require.NoError(t, otlp.WaitFor(ctxFor(t, 30*time.Second), func(spans []testenv.Span) bool {
		return len(stepSpans(spans, runID, "s1", "s2")) == 2
	}), w1.Output())
	w1.Kill()
	w2 := p.palWorker(t, "w2", otlp.Env()...)
	hold.Release()
	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, runID).Kind, w2.Output())

	// The journal names the two drives' traces.
	evs := p.Events(t, runID)
	resumed := find(evs, event.RunResumed, "")
	require.Len(t, resumed, 2)
	t1, t2 := resumed[0].TraceID, resumed[1].TraceID
	require.Len(t, t1, 32)
	require.Len(t, t2, 32)
	require.NotEqual(t, t1, t2)
	for _, ev := range evs {
		switch {
		case ev.Seq < resumed[0].Seq:
			require.Empty(t, ev.TraceID, "seq %d %s: written before any drive", ev.Seq, ev.Kind)
		case ev.WorkerID == "w1":
			require.Equal(t, t1, ev.TraceID, "seq %d %s", ev.Seq, ev.Kind)
		case ev.WorkerID == "w2":
			require.Equal(t, t2, ev.TraceID, "seq %d %s", ev.Seq, ev.Kind)
		}
	}

	// The second drive's root span ends when the run ends; wait for it.
	require.NoError(t, otlp.WaitFor(ctxFor(t, 30*time.Second), func(spans []testenv.Span) bool {
		return len(named(spans, t2, "pal.drive")) == 1 && len(stepSpans(spans, runID, "call")) == 1
	}))
	spans := otlp.Spans()
	traces := map[string]bool{}
	for _, s := range spans {
		if s.Attrs["pal.run_id"] == runID {
			traces[s.TraceID] = true
		}
	}
	require.Equal(t, map[string]bool{t1: true, t2: true}, traces, "exactly the two journaled traces")

	// The killed drive: its resume span and its finished step attempts,
	// no root span.
	require.Empty(t, named(spans, t1, "pal.drive"), "a killed drive never ends its root span")
	require.Len(t, named(spans, t1, "pal.resume"), 1)
	first := stepSpans(spans, runID, "s1", "s2")
	require.Len(t, first, 2)
	for _, s := range first {
		require.Equal(t, t1, s.TraceID)
		require.Equal(t, t1[16:], s.ParentSpanID, "a step span's parent is its drive's root span (span id = low half of the trace id)")
		require.Equal(t, "completed", s.Attrs["pal.outcome"])
		require.Equal(t, "ai-step", s.Attrs["pal.node_type"])
		require.Equal(t, "1", s.Attrs["pal.attempt"])
		llm := children(spans, s)
		require.Len(t, llm, 1, "one GenAI span under %s", s.Attrs["pal.step_id"])
		require.Equal(t, "chat gpt-4o-mini", llm[0].Name)
		require.Equal(t, "openai", llm[0].Attrs["gen_ai.system"])
		require.Equal(t, "gpt-4o-mini", llm[0].Attrs["gen_ai.request.model"])
		require.NotEmpty(t, llm[0].Attrs["gen_ai.usage.input_tokens"])
		require.NotEqual(t, "0", llm[0].Attrs["gen_ai.usage.output_tokens"])
	}

	// The second drive: a root span linked to the first drive's, the
	// steps it ran, none of those the first drive finished.
	root := named(spans, t2, "pal.drive")[0]
	require.Equal(t, t2[16:], root.SpanID)
	require.Equal(t, []string{t1 + "/" + t1[16:]}, root.Links)
	require.Equal(t, "true", root.Attrs["pal.crashed"])
	require.Equal(t, "done", root.Attrs["pal.outcome"])
	require.Equal(t, []string{t1 + "/" + t1[16:]}, named(spans, t2, "pal.resume")[0].Links)
	second := stepSpans(spans, runID, "s3", "notify", "call")
	require.Len(t, second, 3)
	byStep := map[string]testenv.Span{}
	for _, s := range second {
		require.Equal(t, t2, s.TraceID)
		require.Equal(t, "completed", s.Attrs["pal.outcome"])
		byStep[s.Attrs["pal.step_id"]] = s
	}
	require.Len(t, stepSpans(spans, runID, "s1", "s2"), 2, "the second drive ran no step the first finished")

	// traceparent: version-traceid-spanid-flags of the step's span.
	hooks := p.Hook.Requests()
	require.Len(t, hooks, 1)
	require.Equal(t, "00-"+t2+"-"+byStep["notify"].SpanID+"-01", hooks[0].Header.Get("traceparent"))
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, "00-"+t2+"-"+byStep["call"].SpanID+"-01", toolHdr)
}

// stepSpans returns the run's pal.step spans of the given steps.
func stepSpans(spans []testenv.Span, runID string, steps ...string) []testenv.Span {
	var out []testenv.Span
	for _, s := range spans {
		if s.Name == "pal.step" && s.Attrs["pal.run_id"] == runID && slices.Contains(steps, s.Attrs["pal.step_id"]) {
			out = append(out, s)
		}
	}
	return out
}

// named returns the spans of trace traceID called name.
func named(spans []testenv.Span, traceID, name string) []testenv.Span {
	var out []testenv.Span
	for _, s := range spans {
		if s.TraceID == traceID && s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func children(spans []testenv.Span, parent testenv.Span) []testenv.Span {
	var out []testenv.Span
	for _, s := range spans {
		if s.TraceID == parent.TraceID && s.ParentSpanID == parent.SpanID {
			out = append(out, s)
		}
	}
	return out
}
