package workers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/provider/providertest"
)

// streamWatcher watches a run as a client does: its journal and its
// deltas, on a connection of its own, in the order they arrive.
type streamWatcher struct {
	mu sync.Mutex
	// deltas are the deltas of the watched step, as given.
	deltas []event.Delta
	// atEnd is the step's streamed text when its step_completed came.
	atEnd    string
	done     bool
	streamed event.Streamed
	step     string
}

// watchStream starts a watcher of step in run on a new connection; it
// stops when the test ends.
func watchStream(t *testing.T, p *procBundle, runID, step string) *streamWatcher {
	t.Helper()
	js, err := jetstream.New(p.NATS.Conn(t))
	require.NoError(t, err)
	store, err := eventstore.Open(t.Context(), js)
	require.NoError(t, err)
	w := &streamWatcher{step: step}
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error, 1)
	go func() {
		stopped <- store.WatchWithDeltas(ctx, runID, eventstore.Head{}, func(ev event.Event) error {
			w.mu.Lock()
			defer w.mu.Unlock()
			if ev.Kind == event.StepCompleted && ev.StepID == step {
				w.atEnd, _, _ = w.streamed.Text(step)
				w.done = true
			}
			if event.Ends(ev) {
				w.streamed.End(ev.StepID, ev.Seq)
			}
			return nil
		}, func(d event.Delta) error {
			w.mu.Lock()
			defer w.mu.Unlock()
			if d.StepID == step {
				w.deltas = append(w.deltas, d)
			}
			w.streamed.Apply(d)
			return nil
		})
	}()
	t.Cleanup(func() {
		cancel()
		require.ErrorIs(t, <-stopped, context.Canceled)
	})
	return w
}

func (w *streamWatcher) view() (deltas []event.Delta, atEnd string, done bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]event.Delta(nil), w.deltas...), w.atEnd, w.done
}

// waitDeltas waits until the watcher has n deltas of its step.
func (w *streamWatcher) waitDeltas(t *testing.T, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		ds, _, _ := w.view()
		return len(ds) >= n
	}, 30*time.Second, 5*time.Millisecond)
}

// answer is n numbered words.
func answer(n int) string {
	words := make([]string, n)
	for i := range words {
		words[i] = fmt.Sprintf("word%d", i)
	}
	return strings.Join(words, " ")
}

const streamWorkflow = `{"name":"stream","nodes":[{"id":"start","type":"trigger"},
	{"id":"ask","type":"ai-step","data":{"provider":"anthropic","model":"claude-haiku-4-5","prompt":"tell me"}}],
	"edges":[{"from":"start","to":"ask"}]}`

// TestTwoWatchersSeeTheWholeText: a pal worker streams a step whose
// provider stops midway (held); one watcher watched from the start,
// another connects while the step is held. Both see the same whole text
// before the step's step_completed, in order, with no gap and no
// duplicate, and the journal holds no delta.
func TestTwoWatchersSeeTheWholeText(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	const words = 60
	text := answer(words)
	p.LLM.SetResponder(func(providertest.Call) providertest.Reply { return providertest.Reply{Text: text} })
	runID := event.NewRunID()
	hold := p.LLM.HoldAfter(providertest.ByKey(key(runID, "ask", 1)), 20)
	early := watchStream(t, p, runID, "ask")
	p.palWorker(t, "w1")
	p.startAs(t, runID, streamWorkflow, `{}`)

	_, err := hold.Wait(ctxFor(t, 30*time.Second))
	require.NoError(t, err)
	early.waitDeltas(t, 20)
	late := watchStream(t, p, runID, "ask")
	late.waitDeltas(t, 20) // the text so far, from PAL_DELTAS
	hold.Release()
	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, runID).Kind)

	for name, w := range map[string]*streamWatcher{"from the start": early, "mid-step": late} {
		require.Eventually(t, func() bool { _, _, done := w.view(); return done }, 30*time.Second, 5*time.Millisecond, name)
		ds, atEnd, _ := w.view()
		require.Equal(t, text, atEnd, "%s: the whole text before step_completed", name)
		require.Len(t, ds, words, name)
		for i, d := range ds {
			require.Equal(t, i, d.Index, "%s: in order, no gap, no duplicate", name)
			require.Equal(t, 1, d.Attempt)
			require.Equal(t, i == 0, d.Reset)
		}
	}
	ed, _, _ := early.view()
	ld, _, _ := late.view()
	require.Equal(t, ed, ld, "both watchers saw the same deltas")

	// The journal holds the answer once, in step_completed, and no delta.
	evs := p.Events(t, runID)
	var kinds []event.Kind
	for _, ev := range evs {
		kinds = append(kinds, ev.Kind)
	}
	require.Equal(t, []event.Kind{event.RunCreated, event.RunResumed, event.StepStarted, event.StepCompleted, event.RunSucceeded}, kinds)
	events, err := p.JS.Stream(t.Context(), eventstore.EventsStream)
	require.NoError(t, err)
	info, err := events.Info(t.Context(), jetstream.WithSubjectFilter(eventstore.EventsSubject(runID)))
	require.NoError(t, err)
	require.Equal(t, uint64(len(evs)), info.State.Msgs, "every journal message is an event")
	var out engine.LLMOutput
	require.NoError(t, json.Unmarshal(data[event.StepCompletedData](t, evs[3]).Output, &out))
	require.Equal(t, text, out.Text)
	deltas, err := p.JS.Stream(t.Context(), eventstore.DeltasStream)
	require.NoError(t, err)
	info, err = deltas.Info(t.Context(), jetstream.WithSubjectFilter(eventstore.DeltaSubject(runID)))
	require.NoError(t, err)
	require.Equal(t, uint64(words), info.State.Msgs, "the deltas are in PAL_DELTAS")
}

// TestKilledMidStreamStartsTheTextAgain: the worker streaming a step is
// killed (kill -9) in the middle of the answer; another takes the run
// over and sends the call again with the same idempotency key. The
// watcher sees the new call's first delta say so (reset), then the whole
// text of the new call; the run succeeds, and the provider saw the key
// twice.
func TestKilledMidStreamStartsTheTextAgain(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	p.LLM.Dedup(true)
	const words = 40
	text := answer(words)
	p.LLM.SetResponder(func(providertest.Call) providertest.Reply { return providertest.Reply{Text: text} })
	runID := event.NewRunID()
	k := key(runID, "ask", 1)
	var first atomic.Bool
	hold := p.LLM.HoldAfter(func(c providertest.Call) bool { return c.IdempotencyKey == k && first.CompareAndSwap(false, true) }, 15)
	defer hold.Release()
	watcher := watchStream(t, p, runID, "ask")
	w1 := p.palWorker(t, "w1")
	p.startAs(t, runID, streamWorkflow, `{}`)
	_, err := hold.Wait(ctxFor(t, 30*time.Second))
	require.NoError(t, err)
	watcher.waitDeltas(t, 15)
	w1.Kill()
	p.palWorker(t, "w2")
	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, runID).Kind)

	require.Eventually(t, func() bool { _, _, done := watcher.view(); return done }, 30*time.Second, 5*time.Millisecond)
	ds, atEnd, _ := watcher.view()
	require.Len(t, ds, 15+words, "the killed call's 15 deltas, then the new call's")
	for i, d := range ds[:15] {
		require.Equal(t, i, d.Index)
	}
	again := ds[15:]
	require.True(t, again[0].Reset, "the new call's first delta says so")
	require.Greater(t, again[0].Call, ds[0].Call, "a later call")
	require.Equal(t, ds[0].Attempt, again[0].Attempt, "the same attempt, resumed")
	var b strings.Builder
	for i, d := range again {
		require.Equal(t, i, d.Index)
		b.WriteString(d.Text)
	}
	require.Equal(t, text, b.String(), "the whole text of the new call")
	require.Equal(t, text, atEnd, "the watcher's text dropped the partial one")
	require.Equal(t, 2, p.LLM.Keys()[k], "the provider saw the same key twice")
	rs := resumesOf(t, p.Events(t, runID))
	require.Len(t, rs, 2)
	require.True(t, rs[1].Crashed)
}

// TestParallelStepsStreamApart: three ai-steps of one run stream at once
// (each held midway, all three in flight together); each step's watcher
// sees its own whole text before its step_completed, in order, with no
// gap and none of the others' deltas: each call has a sink of its own.
func TestParallelStepsStreamApart(t *testing.T) {
	t.Parallel()
	// A lease lost under load would run the steps again, and stream twice.
	p := setupProc(t, 3*time.Second)
	const words = 30
	p.LLM.SetResponder(func(c providertest.Call) providertest.Reply {
		return providertest.Reply{Text: c.LastUser() + " " + answer(words-1)}
	})
	runID := event.NewRunID()
	steps := []string{"a", "b", "c"}
	wf := `{"name":"three","nodes":[{"id":"start","type":"trigger"}`
	for _, s := range steps {
		wf += fmt.Sprintf(`,{"id":%q,"type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"step-%s"}}`, s, s)
	}
	wf += `],"edges":[{"from":"start","to":"a"},{"from":"start","to":"b"},{"from":"start","to":"c"}]}`
	holds := map[string]*providertest.Hold{}
	watchers := map[string]*streamWatcher{}
	for _, s := range steps {
		holds[s] = p.LLM.HoldAfter(providertest.ByKey(key(runID, s, 1)), 5)
		watchers[s] = watchStream(t, p, runID, s)
	}
	p.palWorker(t, "w1")
	p.startAs(t, runID, wf, `{}`)
	ctx := ctxFor(t, 30*time.Second)
	for _, s := range steps {
		_, err := holds[s].Wait(ctx)
		require.NoError(t, err)
		watchers[s].waitDeltas(t, 5)
	}
	require.Equal(t, 3, p.LLM.InFlight(), "the three calls stream at once")
	for _, s := range steps {
		holds[s].Release()
	}
	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, runID).Kind)

	calls := map[uint64]string{}
	for _, s := range steps {
		w := watchers[s]
		require.Eventually(t, func() bool { _, _, done := w.view(); return done }, 30*time.Second, 5*time.Millisecond, s)
		ds, atEnd, _ := w.view()
		require.Equal(t, "step-"+s+" "+answer(words-1), atEnd, "step %s: its whole text, and only its own", s)
		require.Len(t, ds, words, s)
		for i, d := range ds {
			require.Equal(t, i, d.Index, "step %s: in order, no gap, no duplicate", s)
			require.Equal(t, ds[0].Call, d.Call, "step %s: one call", s)
		}
		require.NotContains(t, calls, ds[0].Call, "each step's call is its own")
		calls[ds[0].Call] = s
	}
}
