package runs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/internal/paltest"
	"github.com/palrun/pal/runs"
	"github.com/palrun/pal/workers"
)

// bundle is one test's PAL (see paltest.Stack), with the workers' logs
// when a test asks for them.
type bundle struct {
	*paltest.Stack
	logs *logCapture
}

func setup(t *testing.T, opts ...paltest.Option) *bundle {
	t.Helper()
	return &bundle{Stack: paltest.New(t, opts...)}
}

// worker starts an in-process worker with tools; it stops when the test
// ends. After captureLogs it logs into the capture too.
func (b *bundle) worker(t *testing.T, id string, tools map[string]workers.Tool) *workers.Worker {
	t.Helper()
	opts := []paltest.WorkerOption{paltest.Tools(tools)}
	if b.logs != nil {
		h := slog.NewTextHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelDebug})
		opts = append(opts, paltest.WorkerLogger(slog.New(slog.NewMultiHandler(h, paltest.Logger(t).Handler()))))
	}
	return b.Worker(t, id, opts...)
}

// commands runs a durable command processor until the test ends.
func (b *bundle) commands(t *testing.T) {
	t.Helper()
	p := runs.NewCommandProcessor(b.Runs, paltest.Logger(t))
	require.NoError(t, p.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, p.Stop(ctx))
	})
}

func data[T any](t *testing.T, ev event.Event) T {
	t.Helper()
	var v T
	require.NoError(t, ev.DecodeData(&v))
	return v
}

func find(evs []event.Event, k event.Kind, step string) []event.Event {
	var out []event.Event
	for _, ev := range evs {
		if ev.Kind == k && (step == "" || ev.StepID == step) {
			out = append(out, ev)
		}
	}
	return out
}

// seqWorkflow is a chain of n ai-steps s1..sn, each quoting the previous
// step's output.
func seqWorkflow(n int, prov string) string {
	return paltest.Chain(fmt.Sprintf("seq-%d", n), n, func(i int, prev string) (string, string) {
		id := fmt.Sprintf("s%d", i)
		prompt := fmt.Sprintf("step %d of {{input.topic}}", i)
		if i > 1 {
			prompt = fmt.Sprintf("step %d after: {{steps.%s.output.text}}", i, prev)
		}
		return id, fmt.Sprintf(`{"id":%q,"type":"ai-step","data":{"provider":%q,"model":"gpt-4o-mini","prompt":%q}}`, id, prov, prompt)
	})
}

// echoChain is a chain of n echo-tool steps t1..tn.
func echoChain(n int) string {
	return paltest.Chain(fmt.Sprintf("echo-%d", n), n, func(i int, _ string) (string, string) {
		id := fmt.Sprintf("t%d", i)
		return id, fmt.Sprintf(`{"id":%q,"type":"tool","data":{"tool":"echo","input":{"i":%d}}}`, id, i)
	})
}

// logCapture keeps the workers' log lines so tests can await them.
type logCapture struct {
	mu      sync.Mutex
	buf     strings.Builder
	changed chan struct{}
}

// captureLogs makes the bundle's workers (started after this call) log
// into the returned capture.
func (b *bundle) captureLogs(t *testing.T) *logCapture {
	b.logs = &logCapture{changed: make(chan struct{})}
	return b.logs
}

func (l *logCapture) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	close(l.changed)
	l.changed = make(chan struct{})
	return len(p), nil
}

func (l *logCapture) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// wait blocks until the logs contain s.
func (l *logCapture) wait(t *testing.T, s string) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		l.mu.Lock()
		found, changed := strings.Contains(l.buf.String(), s), l.changed
		l.mu.Unlock()
		if found {
			return
		}
		select {
		case <-changed:
		case <-timeout:
			t.Fatalf("no log line with %q; logs:\n%s", s, l.String())
		}
	}
}

// createOrphan writes run_created with no work message, as a start that
// crashed before queueing leaves a run.
func createOrphan(t *testing.T, b *bundle, wf string) string {
	t.Helper()
	runID := event.NewRunID()
	ev := event.MustNew(event.RunCreated, "", 0, event.RunCreatedData{Workflow: json.RawMessage(wf), Input: json.RawMessage(`{}`)})
	ev.WorkerID = "test"
	_, err := b.Store.Append(context.Background(), runID, eventstore.Head{}, ev)
	require.NoError(t, err)
	return runID
}
