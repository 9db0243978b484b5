// Package paltest is for tests only: one test's PAL stack, the same in every
// package that tests against a running PAL.
//
// A Stack is an embedded JetStream with PAL's streams set up, an event
// store and leases over it, a fake LLM provider (both wire formats) and a
// webhook receiver. Workers started with Stack.Worker call the fake
// provider and deliver webhooks for real.
//
// Invariants: everything a Stack starts stops when the test ends, and unless
// NoJournalCheck is given the journal is checked then (gapless, one terminal
// event per run, schema-valid), so a test cannot pass while leaving a
// broken journal behind. The services a test starts on it (Stack.Serve:
// its workers, and a projector, an HTTP API, … of its own) stop in
// reverse order when that test ends, on one service.Stack, as a pal
// process's parts do.
//
// Package-specific setup (a database, an HTTP API, the pal binary) stays
// with the tests that need it; a test bundle embeds or holds a *Stack.
package paltest

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
	"github.com/palrun/pal/connector/email"
	"github.com/palrun/pal/connector/webhook"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/internal/egress"
	"github.com/palrun/pal/internal/sandbox"
	"github.com/palrun/pal/internal/service"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/provider/anthropic"
	"github.com/palrun/pal/provider/openai"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/runs"
	"github.com/palrun/pal/workers"
)

// Stack is one test's PAL: its own JetStream, event store, leases, fake LLM
// provider and webhook receiver.
type Stack struct {
	NATS   *testenv.NATSServer
	NC     *nats.Conn
	JS     jetstream.JetStream
	Store  *eventstore.Store
	Leases *eventstore.Leases
	// Runs is the front door over Store (commands, the read model).
	Runs *runs.Client
	LLM  *providertest.Server
	Hook *connectortest.Receiver
	// TTL is the lease TTL given to eventstore.Setup and OpenLeases.
	TTL time.Duration

	mu sync.Mutex
	// services are what each test started with Serve.
	services map[testing.TB]*service.Stack
}

type config struct {
	strict         bool
	ttl            time.Duration
	noJournalCheck bool
}

// Option configures New.
type Option func(*config)

// Strict runs JetStream as PAL_DURABILITY=strict does (every append
// synced) and makes the store pack each append into one message.
func Strict() Option { return func(c *config) { c.strict = true } }

// LeaseTTL sets the lease TTL (default 1s). Zero leaves it to the event
// store: Setup then uses its default and leaves the work consumer's
// AckWait alone, as the API and the CLI do.
func LeaseTTL(d time.Duration) Option { return func(c *config) { c.ttl = d } }

// NoJournalCheck skips the journal check at cleanup, for a test that writes
// what is not a PAL event on purpose.
func NoJournalCheck() Option { return func(c *config) { c.noJournalCheck = true } }

// New sets up a Stack for tb. It fails the test if anything does not start.
func New(tb testing.TB, opts ...Option) *Stack {
	tb.Helper()
	cfg := config{ttl: time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	var nopts []testenv.NATSOption
	if cfg.strict {
		nopts = append(nopts, testenv.Strict())
	}
	s := &Stack{NATS: testenv.NATS(tb, nopts...), TTL: cfg.ttl}
	s.NC = s.NATS.Conn(tb)
	var err error
	s.JS, err = jetstream.New(s.NC)
	require.NoError(tb, err)
	ctx := context.Background()
	require.NoError(tb, eventstore.Setup(ctx, s.JS, eventstore.Config{LeaseTTL: cfg.ttl}))
	s.Store, err = eventstore.Open(ctx, s.JS, eventstore.WithPacking(cfg.strict))
	require.NoError(tb, err)
	s.Leases, err = eventstore.OpenLeases(ctx, s.JS, cfg.ttl)
	require.NoError(tb, err)
	s.Runs = runs.New(s.Store)
	s.LLM = providertest.NewServer(tb)
	s.Hook = connectortest.NewReceiver(tb)
	if !cfg.noJournalCheck {
		testenv.CheckJournalOnCleanup(tb, s.NC)
	}
	return s
}

// Providers is openai and anthropic, both pointed at the stack's fake LLM
// as pal dev's are (DevFake: a node's fake block reaches it).
func (s *Stack) Providers() provider.Registry {
	return provider.Registry{
		"openai":    openai.New(openai.Config{APIKey: "test", BaseURL: s.LLM.OpenAIBaseURL(), DevFake: true}),
		"anthropic": anthropic.New(anthropic.Config{APIKey: "test", BaseURL: s.LLM.AnthropicBaseURL(), DevFake: true}),
	}
}

type workerConfig struct {
	tools       map[string]workers.Tool
	concurrency int
	runLimit    int
	logger      *slog.Logger
	egress      *egress.Policy
	egressSet   bool
	secrets     map[string]string
	secretHosts map[string]string
	smtpURL     string
	sandbox     *sandbox.Runner
	queues      []string
	mcp         *workers.MCPConfig
}

// WorkerOption configures Stack.Worker.
type WorkerOption func(*workerConfig)

// Tools registers tools with the worker, by name.
func Tools(tools map[string]workers.Tool) WorkerOption {
	return func(c *workerConfig) { c.tools = tools }
}

// Concurrency sets how many runs the worker drives at once (default 8).
func Concurrency(n int) WorkerOption { return func(c *workerConfig) { c.concurrency = n } }

// RunConcurrency caps how many steps of one run the worker has in flight
// at once (default workers.DefaultRunConcurrency).
func RunConcurrency(n int) WorkerOption { return func(c *workerConfig) { c.runLimit = n } }

// WorkerLogger sets the worker's logger (default Logger(tb)).
func WorkerLogger(l *slog.Logger) WorkerOption { return func(c *workerConfig) { c.logger = l } }

// Egress sets what the worker's http tool and webhook may call (default:
// public addresses and loopback, where the tests' receivers listen). Pass
// nil for PAL's own default, which refuses loopback too.
func Egress(p *egress.Policy) WorkerOption {
	return func(c *workerConfig) { c.egress, c.egressSet = p, true }
}

// SMTP sets the SMTP server the worker's email connector sends to (default:
// none, and email steps fail).
func SMTP(url string) WorkerOption { return func(c *workerConfig) { c.smtpURL = url } }

// Secrets sets the worker's secrets, read by {{secrets.NAME}} (default:
// none).
func Secrets(m map[string]string) WorkerOption {
	return func(c *workerConfig) { c.secrets = m }
}

// SecretHosts binds the worker's secrets to hosts, by name, each a
// PAL_SECRET_<NAME>_HOSTS list (default: none, so a secret is sent
// nowhere).
func SecretHosts(m map[string]string) WorkerOption {
	return func(c *workerConfig) { c.secretHosts = m }
}

// Queues makes the worker take runs from these work queues (default: the
// default queue), setting up their consumers first.
func Queues(qs ...string) WorkerOption { return func(c *workerConfig) { c.queues = qs } }

// Sandbox sets what runs the worker's process steps (default: a sandbox
// with no mounts, made at the first process step).
func Sandbox(r *sandbox.Runner) WorkerOption { return func(c *workerConfig) { c.sandbox = r } }

// MCP sets the worker's MCP servers (PAL_MCP_CONFIG; default: none).
func MCP(cfg *workers.MCPConfig) WorkerOption { return func(c *workerConfig) { c.mcp = cfg } }

// Worker starts an in-process worker with the stack's providers and the
// webhook connector; it stops when the test ends.
func (s *Stack) Worker(tb testing.TB, id string, opts ...WorkerOption) *workers.Worker {
	tb.Helper()
	cfg := workerConfig{concurrency: 8}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.logger == nil {
		cfg.logger = Logger(tb)
	}
	if !cfg.egressSet {
		cfg.egress = (*egress.Policy)(nil).With(egress.Loopback...)
	}
	wh := webhook.New(webhook.WithEgress(cfg.egress))
	em := email.New(cfg.smtpURL, email.WithEgress(cfg.egress))
	secret := func(name string) (string, bool) { v, ok := cfg.secrets[name]; return v, ok }
	hosts := func(name string) (string, bool) { v, ok := cfg.secretHosts[name]; return v, ok }
	if len(cfg.queues) > 0 {
		require.NoError(tb, eventstore.Setup(context.Background(), s.JS, eventstore.Config{LeaseTTL: s.TTL, Queues: cfg.queues}))
	}
	w := workers.New(workers.Config{ID: id, Concurrency: cfg.concurrency, RunConcurrency: cfg.runLimit, Queues: cfg.queues, Logger: cfg.logger,
		Egress: cfg.egress, Secrets: secret, SecretHosts: hosts, Sandbox: cfg.sandbox, MCP: cfg.mcp},
		s.Store, s.Leases, s.Providers(), connector.Registry{wh.Kind(): wh, em.Kind(): em})
	for name, fn := range cfg.tools {
		w.RegisterTool(name, fn)
	}
	s.Serve(tb, "worker "+id, w)
	return w
}

// Serve starts svc for tb: the services tb started stop when it ends, the
// last started first, within 10 s, and a stop that fails fails the test.
// A start that fails fails the test once the services tb started before
// it have stopped.
func (s *Stack) Serve(tb testing.TB, name string, svc service.Service) {
	tb.Helper()
	s.mu.Lock()
	st := s.services[tb]
	if st == nil {
		st = &service.Stack{}
		if s.services == nil {
			s.services = map[testing.TB]*service.Stack{}
		}
		s.services[tb] = st
		tb.Cleanup(func() {
			s.mu.Lock()
			delete(s.services, tb)
			s.mu.Unlock()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			require.NoError(tb, st.Stop(ctx))
		})
	}
	s.mu.Unlock()
	require.NoError(tb, st.Start(context.Background(), name, svc))
}

// Start starts a run of workflow wf with input (JSON texts), written by
// "test" with every right (wf is deployed first), and returns its id.
func (s *Stack) Start(tb testing.TB, wf, input string) string {
	tb.Helper()
	res, err := s.Runs.Start(context.Background(), runs.StartCommand{
		Workflow: json.RawMessage(wf), Input: json.RawMessage(input), By: "test", Rights: runs.AllRights})
	require.NoError(tb, err)
	require.True(tb, res.Created)
	return res.RunID
}

// Deploy deploys workflow wf (a JSON text), by "test", and returns the
// version it made or found; a run starts it by name (NAME or
// NAME@VERSION), as a caller with only the right to start does.
func (s *Stack) Deploy(tb testing.TB, wf string) runs.DeployResult {
	tb.Helper()
	res, err := s.Runs.Deploy(context.Background(), runs.DeployCommand{Workflow: json.RawMessage(wf), By: "test", Rights: runs.AllRights})
	require.NoError(tb, err)
	return res
}

// WaitEnd waits up to a minute for the run's terminal event.
func (s *Stack) WaitEnd(tb testing.TB, runID string) event.Event {
	tb.Helper()
	return s.WaitFor(tb, runID, "the end", func(ev event.Event) bool { return ev.Kind.Terminal() })
}

// WaitFor waits up to a minute for the first event of the run that fn
// accepts; what names it in the failure message.
func (s *Stack) WaitFor(tb testing.TB, runID, what string, fn func(event.Event) bool) event.Event {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var found event.Event
	err := s.Store.Watch(ctx, runID, eventstore.Head{}, func(ev event.Event) error {
		if fn(ev) {
			found = ev
			return eventstore.ErrStopWatch
		}
		return nil
	})
	require.NoError(tb, err, "waiting for %s in run %s", what, runID)
	return found
}

// Events is the run's journal.
func (s *Stack) Events(tb testing.TB, runID string) []event.Event {
	tb.Helper()
	evs, _, err := s.Store.Read(context.Background(), runID)
	require.NoError(tb, err)
	return evs
}

// AppendRaw writes hand-made events after the run's current head; an event
// without a WorkerID is written by "test".
func (s *Stack) AppendRaw(tb testing.TB, runID string, evs ...event.Event) {
	tb.Helper()
	ctx := context.Background()
	head, err := s.Store.LastHead(ctx, runID)
	require.NoError(tb, err)
	for i := range evs {
		if evs[i].WorkerID == "" {
			evs[i].WorkerID = "test"
		}
	}
	_, err = s.Store.Append(ctx, runID, head, evs...)
	require.NoError(tb, err)
}

// Logger logs at debug level to the test's log under go test -v, and
// nowhere otherwise.
func Logger(tb testing.TB) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(tbWriter{tb}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// tbWriter writes each line to the test's log.
type tbWriter struct{ tb testing.TB }

func (w tbWriter) Write(p []byte) (int, error) {
	w.tb.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// Chain is a workflow named name: the trigger "start", then n nodes in a
// line. node gives the i-th (from 1) node's id and JSON; prev is the id of
// the node before it.
func Chain(name string, n int, node func(i int, prev string) (id, js string)) string {
	nodes := []string{`{"id":"start","type":"trigger"}`}
	var edges []string
	prev := "start"
	for i := 1; i <= n; i++ {
		id, js := node(i, prev)
		nodes = append(nodes, js)
		edges = append(edges, fmt.Sprintf(`{"from":%q,"to":%q}`, prev, id))
		prev = id
	}
	return fmt.Sprintf(`{"name":%q,"nodes":[%s],"edges":[%s]}`, name, strings.Join(nodes, ","), strings.Join(edges, ","))
}

// SeqWorkflow is a chain of n ai-steps s1..sn on provider prov, each
// quoting the previous step's output (the first quotes input.topic).
func SeqWorkflow(n int, prov string) string {
	return Chain(fmt.Sprintf("seq-%d", n), n, func(i int, prev string) (string, string) {
		id := fmt.Sprintf("s%d", i)
		prompt := fmt.Sprintf("step %d of {{input.topic}}", i)
		if i > 1 {
			prompt = fmt.Sprintf("step %d after: {{steps.%s.output.text}}", i, prev)
		}
		return id, fmt.Sprintf(`{"id":%q,"type":"ai-step","data":{"provider":%q,"model":"gpt-4o-mini","prompt":%q}}`, id, prov, prompt)
	})
}

// EchoChain is a chain of n built-in echo tool steps t1..tn.
func EchoChain(n int) string {
	return Chain(fmt.Sprintf("echo-%d", n), n, func(i int, _ string) (string, string) {
		id := fmt.Sprintf("t%d", i)
		return id, fmt.Sprintf(`{"id":%q,"type":"tool","data":{"tool":"echo","input":{"i":%d}}}`, id, i)
	})
}
