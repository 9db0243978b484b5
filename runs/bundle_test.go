package runs_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/runs"
	"github.com/palrun/pal/workers"
)

// bundle is one test's PAL (see paltest.Stack), with the workers' logs
// when a test asks for them.
type bundle struct {
	*paltest.Stack
	logs *paltest.LogCapture
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

func seqWorkflow(n int, prov string) string { return paltest.SeqWorkflow(n, prov) }

func echoChain(n int) string { return paltest.EchoChain(n) }

// captureLogs makes the bundle's workers (started after this call) log
// into the returned capture.
func (b *bundle) captureLogs(t *testing.T) *paltest.LogCapture {
	b.logs = paltest.NewLogCapture()
	return b.logs
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
