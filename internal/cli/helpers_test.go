package cli_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/connector"
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

func TestMain(m *testing.M) { testenv.Main(m) }

// bundle is one test's PAL for the pal binary: its own JetStream, an
// in-process worker whose LLM is a fake, and the binary.
type bundle struct {
	nats  *testenv.NATSServer
	nc    *nats.Conn
	js    jetstream.JetStream
	store *eventstore.Store
	llm   *providertest.Server
	bin   string
	dir   string
}

func setup(t *testing.T) *bundle {
	t.Helper()
	b := &bundle{nats: testenv.NATS(t), bin: testenv.PalBinary(t), dir: t.TempDir()}
	b.nc = b.nats.Conn(t)
	var err error
	b.js, err = jetstream.New(b.nc)
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, eventstore.Setup(ctx, b.js, eventstore.Config{LeaseTTL: time.Second}))
	b.store, err = eventstore.Open(ctx, b.js)
	require.NoError(t, err)
	testenv.CheckJournalOnCleanup(t, b.nc)

	b.llm = providertest.NewServer(t)
	b.llm.SetResponder(func(c providertest.Call) providertest.Reply {
		if strings.Contains(c.LastUser(), "FAIL") {
			return providertest.Reply{Status: 400}
		}
		return providertest.Reply{Text: "echo: " + c.LastUser()}
	})
	leases, err := eventstore.OpenLeases(ctx, b.js, time.Second)
	require.NoError(t, err)
	wh := webhook.New()
	w := workers.New(workers.Config{ID: "w1", Concurrency: 8, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))},
		b.store, leases, provider.Registry{
			"openai":    openai.New(openai.Config{APIKey: "test", BaseURL: b.llm.OpenAIBaseURL()}),
			"anthropic": anthropic.New(anthropic.Config{APIKey: "test", BaseURL: b.llm.AnthropicBaseURL()}),
		}, connector.Registry{wh.Kind(): wh})
	require.NoError(t, w.Start(ctx))
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, w.Stop(sctx))
	})
	return b
}

// result is one pal invocation.
type result struct {
	stdout, stderr string
	code           int
}

func (r result) String() string {
	return fmt.Sprintf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
}

// hermetic is the test's environment without PAL_*, DATABASE_URL and the
// providers' variables.
func hermetic(extra ...string) []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "PAL_") || strings.HasPrefix(kv, "DATABASE_URL=") ||
			strings.HasPrefix(kv, "OPENAI_") || strings.HasPrefix(kv, "ANTHROPIC_") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

// pal runs the binary against the bundle's NATS with env added.
func (b *bundle) pal(t *testing.T, env []string, args ...string) result {
	t.Helper()
	return runPal(t, b.bin, append([]string{"PAL_NATS_URL=" + b.nats.URL()}, env...), args...)
}

func runPal(t *testing.T, bin string, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = hermetic(env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("running pal %s: %v", strings.Join(args, " "), err)
	}
	return r
}

// file writes content to a file in the test's directory.
func (b *bundle) file(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(b.dir, name)
	require.NoError(t, os.WriteFile(p, []byte(content), 0o644))
	return p
}

// start starts a run with the binary and returns its id.
func (b *bundle) start(t *testing.T, wf, input string) string {
	t.Helper()
	r := b.pal(t, nil, "run", "start", "--workflow", b.file(t, "wf.json", wf), "--input", input)
	require.Equal(t, 0, r.code, "%s", r)
	id := strings.TrimSpace(r.stdout)
	require.NoError(t, event.ValidateRunID(id), "%s", r)
	return id
}

// waitEnd waits for the run's terminal event.
func (b *bundle) waitEnd(t *testing.T, runID string) event.Event {
	t.Helper()
	return b.waitFor(t, runID, func(ev event.Event) bool { return ev.Kind.Terminal() })
}

func (b *bundle) waitFor(t *testing.T, runID string, fn func(event.Event) bool) event.Event {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var found event.Event
	err := b.store.Watch(ctx, runID, eventstore.Head{}, func(ev event.Event) error {
		if fn(ev) {
			found = ev
			return eventstore.ErrStopWatch
		}
		return nil
	})
	require.NoError(t, err)
	return found
}

func (b *bundle) events(t *testing.T, runID string) []event.Event {
	t.Helper()
	evs, _, err := b.store.Read(context.Background(), runID)
	require.NoError(t, err)
	return evs
}

// journal is what a refused command must leave as it was.
func (b *bundle) journal(t *testing.T) testenv.Journal { return testenv.ReadJournal(t, b.nc) }

func decodeJSON[T any](t *testing.T, s string) T {
	t.Helper()
	var v T
	require.NoError(t, json.Unmarshal([]byte(s), &v), "output: %s", s)
	return v
}

// seqWorkflow is a chain of n ai-steps s1..sn; a prompt with FAIL in it
// makes the fake LLM refuse the call.
func seqWorkflow(n int) string {
	var nodes, edges []string
	nodes = append(nodes, `{"id":"start","type":"trigger"}`)
	prev := "start"
	for i := 1; i <= n; i++ {
		id := fmt.Sprintf("s%d", i)
		nodes = append(nodes, fmt.Sprintf(`{"id":%q,"type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"step %d: {{input.text}}"}}`, id, i))
		edges = append(edges, fmt.Sprintf(`{"from":%q,"to":%q}`, prev, id))
		prev = id
	}
	return fmt.Sprintf(`{"name":"seq-%d","nodes":[%s],"edges":[%s]}`, n, strings.Join(nodes, ","), strings.Join(edges, ","))
}
