package workers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/connector"
	"github.com/palrun/pal/connector/connectortest"
	"github.com/palrun/pal/connector/webhook"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/internal/testenv"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/provider/anthropic"
	"github.com/palrun/pal/provider/openai"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/workers"
)

// bundle is one test's PAL: its own JetStream, fake LLM provider and
// webhook receiver.
type bundle struct {
	nats   *testenv.NATSServer
	nc     *nats.Conn
	js     jetstream.JetStream
	store  *eventstore.Store
	leases *eventstore.Leases
	llm    *providertest.Server
	hook   *connectortest.Receiver
	ttl    time.Duration
	logs   *logCapture
}

type bundleOpt func(*bundleCfg)

type bundleCfg struct {
	strict bool
	ttl    time.Duration
}

func strictMode() bundleOpt { return func(c *bundleCfg) { c.strict = true } }

func setup(t *testing.T, opts ...bundleOpt) *bundle {
	t.Helper()
	cfg := bundleCfg{ttl: time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	var nopts []testenv.NATSOption
	if cfg.strict {
		nopts = append(nopts, testenv.Strict())
	}
	b := &bundle{nats: testenv.NATS(t, nopts...), ttl: cfg.ttl}
	b.nc = b.nats.Conn(t)
	var err error
	b.js, err = jetstream.New(b.nc)
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, eventstore.Setup(ctx, b.js, eventstore.Config{LeaseTTL: cfg.ttl}))
	b.store, err = eventstore.Open(ctx, b.js, eventstore.WithPacking(cfg.strict))
	require.NoError(t, err)
	b.leases, err = eventstore.OpenLeases(ctx, b.js, cfg.ttl)
	require.NoError(t, err)
	b.llm = providertest.NewServer(t)
	b.hook = connectortest.NewReceiver(t)
	testenv.CheckJournalOnCleanup(t, b.nc)
	return b
}

func (b *bundle) providers() provider.Registry {
	return provider.Registry{
		"openai":    openai.New(openai.Config{APIKey: "test", BaseURL: b.llm.OpenAIBaseURL()}),
		"anthropic": anthropic.New(anthropic.Config{APIKey: "test", BaseURL: b.llm.AnthropicBaseURL()}),
	}
}

func testLogger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// worker starts an in-process worker; it stops when the test ends.
func (b *bundle) worker(t *testing.T, id string, tools map[string]workers.Tool) *workers.Worker {
	t.Helper()
	wh := webhook.New()
	log := testLogger(t)
	if b.logs != nil {
		log = slog.New(slog.NewTextHandler(io.MultiWriter(b.logs, tWriterIfVerbose(t)), &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	w := workers.New(workers.Config{ID: id, Concurrency: 8, Logger: log}, b.store, b.leases,
		b.providers(), connector.Registry{wh.Kind(): wh})
	for name, fn := range tools {
		w.RegisterTool(name, fn)
	}
	require.NoError(t, w.Start(context.Background()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, w.Stop(ctx))
	})
	return w
}

func (b *bundle) start(t *testing.T, wf, input string) string {
	t.Helper()
	res, err := workers.StartRun(context.Background(), b.store, workers.StartRequest{
		Workflow: json.RawMessage(wf), Input: json.RawMessage(input), Writer: "test"})
	require.NoError(t, err)
	require.True(t, res.Created)
	return res.RunID
}

// waitEnd waits for the run's terminal event.
func (b *bundle) waitEnd(t *testing.T, runID string) event.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var final event.Event
	err := b.store.Watch(ctx, runID, eventstore.Head{}, func(ev event.Event) error {
		if ev.Kind.Terminal() {
			final = ev
			return eventstore.ErrStopWatch
		}
		return nil
	})
	require.NoError(t, err, "run %s did not end", runID)
	return final
}

func (b *bundle) events(t *testing.T, runID string) []event.Event {
	t.Helper()
	evs, _, err := b.store.Read(context.Background(), runID)
	require.NoError(t, err)
	return evs
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

// seqWorkflow is a chain of n ai-steps s1..sn, each quoting the previous
// step's output.
func seqWorkflow(n int, prov string) string {
	var nodes, edges []string
	nodes = append(nodes, `{"id":"start","type":"trigger"}`)
	prev := "start"
	for i := 1; i <= n; i++ {
		id := fmt.Sprintf("s%d", i)
		prompt := fmt.Sprintf("step %d of {{input.topic}}", i)
		if i > 1 {
			prompt = fmt.Sprintf("step %d after: {{steps.%s.output.text}}", i, prev)
		}
		nodes = append(nodes, fmt.Sprintf(`{"id":%q,"type":"ai-step","data":{"provider":%q,"model":"gpt-4o-mini","prompt":%q}}`, id, prov, prompt))
		edges = append(edges, fmt.Sprintf(`{"from":%q,"to":%q}`, prev, id))
		prev = id
	}
	return fmt.Sprintf(`{"name":"seq-%d","nodes":[%s],"edges":[%s]}`, n, strings.Join(nodes, ","), strings.Join(edges, ","))
}

func tWriterIfVerbose(t *testing.T) io.Writer {
	if testing.Verbose() {
		return tWriter{t}
	}
	return io.Discard
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
