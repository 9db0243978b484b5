package workers_test

import (
	"log/slog"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest"
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

// appendRaw writes hand-made events to a run's journal, as a crashed worker
// would have left them.
func appendRaw(t *testing.T, b *bundle, runID string, evs ...event.Event) {
	t.Helper()
	for i := range evs {
		if evs[i].WorkerID == "" {
			evs[i].WorkerID = "crashed-worker"
		}
	}
	b.AppendRaw(t, runID, evs...)
}

func key(runID, step string, attempt int) string { return event.IdempotencyKey(runID, step, attempt) }

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
