package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/projections"
)

// testToken is the bearer token of the bundle's API (named "ci", with
// the default scopes); adminToken (named "lead") has scope admin.
const (
	testToken  = "test-token-0123456789"
	adminToken = "admin-token-0123456789"
)

// bearerOf is the headers argument of do, post and get that sends tok.
func bearerOf(tok string) []string { return []string{"Authorization", "Bearer " + tok} }

// bundle is one test's PAL (see paltest.Stack) behind the REST API: the
// API on 127.0.0.1 and, when asked for, a worker whose LLM is the fake.
type bundle struct {
	*paltest.Stack
	srv    *api.Server
	url    string
	client *http.Client
}

type bundleCfg struct {
	worker    bool
	runs      api.RunLister
	keepAlive time.Duration
	ready     func(context.Context) error
	tokens    []api.Token
	insecure  bool
	stack     []paltest.Option
	// handler, when set, adjusts the handler's config last.
	handler func(*api.HandlerConfig)
}

type bundleOpt func(*bundleCfg)

// withWorker runs an in-process worker whose LLM is the bundle's fake.
func withWorker() bundleOpt { return func(c *bundleCfg) { c.worker = true } }

func withRuns(r api.RunLister) bundleOpt { return func(c *bundleCfg) { c.runs = r } }

func withKeepAlive(d time.Duration) bundleOpt { return func(c *bundleCfg) { c.keepAlive = d } }

func withReady(f func(context.Context) error) bundleOpt { return func(c *bundleCfg) { c.ready = f } }

func withTokens(tokens []api.Token, insecure bool) bundleOpt {
	return func(c *bundleCfg) { c.tokens, c.insecure = tokens, insecure }
}

// withHandler adjusts the handler's config.
func withHandler(f func(*api.HandlerConfig)) bundleOpt { return func(c *bundleCfg) { c.handler = f } }

// withoutJournalCheck is for a test that corrupts a journal on purpose.
func withoutJournalCheck() bundleOpt {
	return func(c *bundleCfg) { c.stack = append(c.stack, paltest.NoJournalCheck()) }
}

func setup(t testing.TB, opts ...bundleOpt) *bundle {
	t.Helper()
	cfg := bundleCfg{tokens: []api.Token{{Name: "ci", Secret: testToken}, {Name: "lead", Secret: adminToken, Scopes: api.ScopeAdmin}}}
	for _, o := range opts {
		o(&cfg)
	}
	b := &bundle{Stack: paltest.New(t, cfg.stack...)}
	if cfg.worker {
		b.Worker(t, "w1")
		// The worker pins PAL_WORK once at start (Store.PinWork); wait for
		// it, so journalState does not see it land mid-test.
		work, err := b.JS.Stream(context.Background(), eventstore.WorkStream)
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			_, err := work.GetLastMsgForSubject(context.Background(), eventstore.WorkPinSubject)
			return err == nil
		}, 30*time.Second, 5*time.Millisecond, "the worker's PAL_WORK pin")
	}
	hc := api.HandlerConfig{Store: b.Store, NC: b.NC, Runs: cfg.runs, Ready: cfg.ready, Tokens: cfg.tokens,
		Insecure: cfg.insecure, Logger: paltest.Logger(t), KeepAlive: cfg.keepAlive}
	if cfg.handler != nil {
		cfg.handler(&hc)
	}
	b.srv = api.NewServer("127.0.0.1:0", api.NewHandler(hc), paltest.Logger(t))
	b.Serve(t, "the REST API", b.srv)
	b.url = b.srv.URL()
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	b.client = &http.Client{Transport: tr, Timeout: 60 * time.Second}
	t.Cleanup(tr.CloseIdleConnections)
	return b
}

// response is an answer with its body read.
type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) json(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	require.NoError(t, json.Unmarshal(r.body, &m), "body: %s", r.body)
	return m
}

// do sends a request with the bundle's token (unless headers set
// Authorization, "" for none).
func (b *bundle) do(t testing.TB, method, path string, body io.Reader, headers ...string) response {
	t.Helper()
	req, err := http.NewRequest(method, b.url+path, body)
	require.NoError(t, err)
	req.Header.Set("Authorization", "Bearer "+testToken)
	for i := 0; i+1 < len(headers); i += 2 {
		if headers[i+1] == "" {
			req.Header.Del(headers[i])
			continue
		}
		req.Header.Set(headers[i], headers[i+1])
	}
	res, err := b.client.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	data, err := io.ReadAll(res.Body)
	require.NoError(t, err)
	return response{status: res.StatusCode, header: res.Header, body: data}
}

func (b *bundle) post(t testing.TB, path, body string, headers ...string) response {
	t.Helper()
	return b.do(t, http.MethodPost, path, strings.NewReader(body), headers...)
}

func (b *bundle) get(t testing.TB, path string, headers ...string) response {
	t.Helper()
	return b.do(t, http.MethodGet, path, nil, headers...)
}

// requireError checks an error answer: status, code and a detail.
func requireError(t testing.TB, r response, status int, code string) map[string]any {
	t.Helper()
	require.Equal(t, status, r.status, "body: %s", r.body)
	require.Equal(t, "application/json", r.header.Get("Content-Type"))
	m := r.json(t)
	require.Equal(t, code, m["error"], "body: %s", r.body)
	require.NotEmpty(t, m["detail"], "body: %s", r.body)
	return m
}

// journalState is everything a refused request must leave as it was.
type journalState struct {
	Journal testenv.Journal
	Streams map[string]uint64 // stream → last sequence
}

func (b *bundle) journalState(t testing.TB) journalState {
	t.Helper()
	s := journalState{Journal: testenv.ReadJournal(t, b.NC), Streams: map[string]uint64{}}
	ctx := context.Background()
	for _, name := range []string{eventstore.EventsStream, eventstore.WorkStream, eventstore.CommandsStream, eventstore.WorkflowStream} {
		st, err := b.JS.Stream(ctx, name)
		require.NoError(t, err)
		info, err := st.Info(ctx)
		require.NoError(t, err)
		s.Streams[name] = info.State.LastSeq
	}
	// Leases of runs only: a worker's presence entry (w.<token>, two
	// subject tokens) is rewritten while it lives and is no run's state.
	st, err := b.JS.Stream(ctx, "KV_"+eventstore.LeaseBucket)
	require.NoError(t, err)
	info, err := st.Info(ctx, jetstream.WithSubjectFilter("$KV."+eventstore.LeaseBucket+".*"))
	require.NoError(t, err)
	var leases uint64
	for _, n := range info.State.Subjects {
		leases += n
	}
	s.Streams["KV_"+eventstore.LeaseBucket] = leases
	return s
}

// seqWorkflow is a chain of n ai-steps s1..sn.
func seqWorkflow(n int) string {
	return paltest.Chain(fmt.Sprintf("seq-%d", n), n, func(i int, _ string) (string, string) {
		id := fmt.Sprintf("s%d", i)
		return id, fmt.Sprintf(`{"id":%q,"type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"step %d of {{input.topic}}"}}`, id, i)
	})
}

// echoWorkflow is one echo tool step.
const echoWorkflow = `{"name":"echo","nodes":[{"id":"start","type":"trigger"},{"id":"a","type":"tool","data":{"tool":"echo"}}],"edges":[{"from":"start","to":"a"}]}`

// sseEvent is one server-sent event.
type sseEvent struct {
	id    uint64
	kind  string
	data  []byte
	event event.Event
}

// sseStream reads an event stream.
type sseStream struct {
	res    *http.Response
	r      *bufio.Reader
	cancel context.CancelFunc
	// comments counts comment lines (keep-alives).
	comments int
}

// openSSE opens GET /v1/runs/{id}/events; headers as in do.
func (b *bundle) openSSE(t testing.TB, client *http.Client, runID, query string, headers ...string) (*sseStream, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.url+"/v1/runs/"+runID+"/events"+query, nil)
	if err != nil {
		cancel()
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+testToken)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	res, err := client.Do(req)
	if err != nil {
		cancel()
		return nil, err
	}
	return &sseStream{res: res, r: bufio.NewReader(res.Body), cancel: cancel}, nil
}

// next returns the next event, or io.EOF when the server ended the stream.
func (s *sseStream) next() (sseEvent, error) {
	var ev sseEvent
	have := false
	for {
		line, err := s.r.ReadString('\n')
		if err != nil {
			if err == io.EOF && line == "" && !have {
				return ev, io.EOF
			}
			if err == io.EOF {
				return ev, io.ErrUnexpectedEOF
			}
			return ev, err
		}
		line = strings.TrimSuffix(line, "\n")
		switch {
		case line == "":
			if have {
				if err := json.Unmarshal(ev.data, &ev.event); err != nil {
					return ev, fmt.Errorf("event %d: %w: %s", ev.id, err, ev.data)
				}
				return ev, nil
			}
		case strings.HasPrefix(line, ":"):
			s.comments++
		case strings.HasPrefix(line, "id: "):
			n, err := strconv.ParseUint(strings.TrimPrefix(line, "id: "), 10, 64)
			if err != nil {
				return ev, fmt.Errorf("bad id line %q", line)
			}
			ev.id, have = n, true
		case strings.HasPrefix(line, "event: "):
			ev.kind, have = strings.TrimPrefix(line, "event: "), true
		case strings.HasPrefix(line, "data: "):
			ev.data, have = append(ev.data, strings.TrimPrefix(line, "data: ")...), true
		case strings.HasPrefix(line, "retry: "):
		default:
			return ev, fmt.Errorf("unexpected line %q", line)
		}
	}
}

func (s *sseStream) close() {
	s.cancel()
	_ = s.res.Body.Close()
}

// readUntil reads events until one matches fn (inclusive).
func (s *sseStream) readUntil(t testing.TB, fn func(sseEvent) bool) []sseEvent {
	t.Helper()
	var out []sseEvent
	for {
		ev, err := s.next()
		require.NoError(t, err)
		out = append(out, ev)
		if fn(ev) {
			return out
		}
	}
}

// readAll reads events until the server ends the stream.
func (s *sseStream) readAll(t testing.TB) []sseEvent {
	t.Helper()
	var out []sseEvent
	for {
		ev, err := s.next()
		if err == io.EOF {
			return out
		}
		require.NoError(t, err)
		out = append(out, ev)
	}
}

// migratedPool is a pool on a fresh Postgres holding the projections'
// tables: the read model a server's run listing reads (withRuns).
func migratedPool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	pool := testenv.Postgres(t).Pool(t)
	_, err := projections.Migrate(context.Background(), pool)
	require.NoError(t, err)
	return pool
}

// project serves a projector of the bundle's journal into pool.
func (b *bundle) project(t testing.TB, pool *pgxpool.Pool) *projections.Projector {
	t.Helper()
	p := projections.New(pool, b.Store, projections.Config{Logger: paltest.Logger(t)})
	b.Serve(t, "the projector", p)
	return p
}
