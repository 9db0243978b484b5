package natsauth_test

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/connector"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/eventstore/natsauth"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/projections"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/receipt"
	"github.com/palrun/pal/runs"
	"github.com/palrun/pal/workers"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// violations collects the permission violations a connection is told of.
type violations struct {
	mu   sync.Mutex
	errs []string
	ch   chan struct{}
}

func newViolations() *violations { return &violations{ch: make(chan struct{})} }

func (v *violations) option() nats.Option {
	return nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if !errors.Is(err, nats.ErrPermissionViolation) {
			return
		}
		v.mu.Lock()
		defer v.mu.Unlock()
		v.errs = append(v.errs, err.Error())
		close(v.ch)
		v.ch = make(chan struct{})
	})
}

func (v *violations) all() []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return append([]string(nil), v.errs...)
}

// wait waits until a violation naming subject has been reported.
func (v *violations) wait(tb testing.TB, subject string) {
	tb.Helper()
	timeout := time.After(10 * time.Second)
	for {
		v.mu.Lock()
		for _, e := range v.errs {
			if strings.Contains(e, `"`+subject+`"`) {
				v.mu.Unlock()
				return
			}
		}
		ch := v.ch
		v.mu.Unlock()
		select {
		case <-ch:
		case <-timeout:
			tb.Fatalf("no permissions violation for %q; got %q", subject, v.all())
		}
	}
}

// The client users of setup besides natsauth.DefaultUser (every scope):
// starter may read and start, ana (the approver approvalWF names) may
// read and approve; ghost may read and start as far as NATS is concerned,
// but PAL does not know it (PAL_NATS_USERS).
const (
	starter = "starter"
	ana     = "ana"
	ghost   = "ghost"
)

// bundle is PAL with its accounts as pal dev sets them up: a worker (with
// the command processor, signing receipts) connected as worker, the NATS
// service on the api role, a projector as projector, and a client
// connection as the client account's DefaultUser.
type bundle struct {
	srv      *testenv.NATSServer
	admin    *nats.Conn
	store    *eventstore.Store // the worker's
	apiStore *eventstore.Store // the api role's
	pstore   *eventstore.Store // the projector role's
	runs     *runs.Client
	pool     *pgxpool.Pool
	proj     *projections.Projector
	keys     *receipt.Keys // the worker's signing key
	receipts *receipt.Store
	client   *nats.Conn
	cjs      jetstream.JetStream
	cviol    *violations
	palViol  *violations // PAL's own connections: must stay empty
	// The tool "slow" signals slowStarted, then waits for slowRelease; it
	// records whether its context was cancelled first.
	slowStarted   chan struct{}
	slowRelease   chan struct{}
	slowCancelled atomic.Bool
}

func setup(t *testing.T) *bundle { t.Helper(); return setupWith(t, true) }

// setupWith is setup; journalCheck false is for a test that corrupts a
// journal on purpose (testenv.CheckJournalOnCleanup).
func setupWith(t *testing.T, journalCheck bool) *bundle {
	t.Helper()
	ctx := context.Background()
	srv := testenv.NATS(t, testenv.ClientUsers(
		natsauth.User{Name: starter, Scopes: natsauth.ScopeRead | natsauth.ScopeStart},
		natsauth.User{Name: ana, Scopes: natsauth.ScopeRead | natsauth.ScopeApprove},
		natsauth.User{Name: ghost, Scopes: natsauth.ScopeRead | natsauth.ScopeStart}))
	var known natsauth.Users // what PAL's processes are told
	for _, u := range srv.Users() {
		if u.Name != ghost {
			known = append(known, u)
		}
	}
	b := &bundle{srv: srv, cviol: newViolations(), palViol: newViolations(),
		slowStarted: make(chan struct{}, 1), slowRelease: make(chan struct{})}
	b.admin = b.srv.Conn(t)
	if journalCheck {
		testenv.CheckJournalOnCleanup(t, b.admin)
	}
	log := paltest.Logger(t)

	wnc := b.srv.ConnAs(t, natsauth.Worker, b.palViol.option())
	wjs, err := jetstream.New(wnc)
	require.NoError(t, err)
	require.NoError(t, eventstore.Setup(ctx, wjs, eventstore.Config{LeaseTTL: time.Second}))
	b.store, err = eventstore.Open(ctx, wjs)
	require.NoError(t, err)
	leases, err := eventstore.OpenLeases(ctx, wjs, time.Second)
	require.NoError(t, err)
	_, priv, err := ed25519.GenerateKey(nil)
	require.NoError(t, err)
	b.keys = &receipt.Keys{Current: receipt.NewKey(priv)}
	b.receipts, err = receipt.Open(ctx, wjs, b.store)
	require.NoError(t, err)
	w := workers.New(workers.Config{ID: "w1", Logger: log, Receipts: b.receipts, SigningKey: b.keys.Current},
		b.store, leases, provider.Registry{}, connector.Registry{})
	w.RegisterTool("slow", func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
		b.slowStarted <- struct{}{}
		select {
		case <-b.slowRelease:
			return json.RawMessage(`{}`), nil
		case <-ctx.Done():
			b.slowCancelled.Store(true)
			return nil, ctx.Err()
		}
	})
	w.RegisterTool("big", func(context.Context, json.RawMessage) (json.RawMessage, error) {
		return json.Marshal(strings.Repeat("b", bigSize))
	})
	require.NoError(t, w.Start(ctx))
	t.Cleanup(func() { require.NoError(t, w.Stop(context.Background())) })
	b.runs = runs.New(b.store, runs.WithUsers(known))
	cmds := runs.NewCommandProcessor(b.runs, log)
	require.NoError(t, cmds.Start(ctx))
	t.Cleanup(func() { require.NoError(t, cmds.Stop(context.Background())) })
	// The NATS service as pal server runs it: on the api role.
	anc := b.srv.ConnAs(t, natsauth.API, b.palViol.option())
	ajs, err := jetstream.New(anc)
	require.NoError(t, err)
	b.apiStore, err = eventstore.Open(ctx, ajs)
	require.NoError(t, err)
	svc, err := api.StartService(ctx, anc, runs.New(b.apiStore, runs.WithUsers(known)), log)
	require.NoError(t, err)
	t.Cleanup(func() { _ = svc.Stop() })

	pnc := b.srv.ConnAs(t, natsauth.Projector, b.palViol.option())
	pjs, err := jetstream.New(pnc)
	require.NoError(t, err)
	b.pstore, err = eventstore.Open(ctx, pjs)
	require.NoError(t, err)
	b.pool = testenv.Postgres(t).Pool(t)
	_, err = projections.Migrate(ctx, b.pool)
	require.NoError(t, err)
	b.proj = projections.New(b.pool, b.pstore, projections.Config{Logger: log})
	require.NoError(t, b.proj.Start(ctx))
	t.Cleanup(func() { require.NoError(t, b.proj.Stop(context.Background())) })

	b.client = b.srv.ConnAs(t, natsauth.Client, b.cviol.option())
	b.cjs, err = jetstream.New(b.client)
	require.NoError(t, err)
	t.Cleanup(func() {
		require.Empty(t, b.palViol.all(), "PAL's own roles hit a permissions violation")
	})
	return b
}

// state is what a forgery must leave unchanged: the journal stream, the
// lease bucket and the projection.
type state struct {
	Events, Leases       jetstream.StreamState
	LeaseKeys            string
	Runs, Steps, Journal string
}

func (b *bundle) state(t *testing.T) state {
	t.Helper()
	ctx := context.Background()
	js, err := jetstream.New(b.admin)
	require.NoError(t, err)
	var s state
	info, err := js.Stream(ctx, eventstore.EventsStream)
	require.NoError(t, err)
	s.Events = info.CachedInfo().State
	// The projection has caught up with the journal.
	require.Eventually(t, func() bool { return b.proj.Stats().Checkpoint == s.Events.LastSeq }, 30*time.Second, 5*time.Millisecond)
	linfo, err := js.Stream(ctx, "KV_"+eventstore.LeaseBucket)
	require.NoError(t, err)
	s.Leases = linfo.CachedInfo().State
	s.Leases.Consumers = 0 // watches come and go
	s.Events.Consumers = 0
	kv, err := js.KeyValue(ctx, eventstore.LeaseBucket)
	require.NoError(t, err)
	keys, err := kv.ListKeys(ctx)
	require.NoError(t, err)
	var ks []string
	for k := range keys.Keys() {
		if !strings.Contains(k, ".") { // not a worker's presence entry
			ks = append(ks, k)
		}
	}
	s.LeaseKeys = strings.Join(ks, ",")
	q := func(sql string) string {
		var out *string
		require.NoError(t, b.pool.QueryRow(ctx, sql).Scan(&out))
		if out == nil {
			return ""
		}
		return *out
	}
	s.Runs = q(`SELECT string_agg(r::text, '|' ORDER BY run_id) FROM runs r`)
	s.Steps = q(`SELECT string_agg(s::text, '|' ORDER BY run_id, step_id, attempt) FROM steps s`)
	s.Journal = q(`SELECT string_agg(run_id || ':' || seq || ':' || kind, '|' ORDER BY run_id, seq) FROM journal_events`)
	return s
}

const echoWF = `{"name":"echo","nodes":[{"id":"start","type":"trigger"},{"id":"t1","type":"tool","data":{"tool":"echo","input":{"i":1}}}],"edges":[{"from":"start","to":"t1"}]}`

const slowWF = `{"name":"slow","nodes":[{"id":"start","type":"trigger"},{"id":"t1","type":"tool","data":{"tool":"slow"}}],"edges":[{"from":"start","to":"t1"}]}`

const approvalWF = `{"name":"gate","nodes":[{"id":"start","type":"trigger"},
 {"id":"ok","type":"approval","data":{"prompt":"go?","approvers":["ana"]}},
 {"id":"t1","type":"tool","data":{"tool":"echo","input":{"i":1}}}],
 "edges":[{"from":"start","to":"ok"},{"from":"ok","to":"t1"}]}`

func (b *bundle) start(t *testing.T, wf string) string {
	t.Helper()
	res, err := b.runs.Start(context.Background(), runs.StartCommand{Rights: runs.AllRights, Workflow: json.RawMessage(wf), Input: json.RawMessage(`{}`), By: "test"})
	require.NoError(t, err)
	return res.RunID
}

func (b *bundle) waitStatus(t *testing.T, runID string, want string) {
	t.Helper()
	require.Eventually(t, func() bool {
		v, err := b.runs.Get(context.Background(), runID)
		return err == nil && string(v.Status) == want
	}, 30*time.Second, 10*time.Millisecond, "run %s never %s", runID, want)
}

func envelope(runID string, seq uint64, kind event.Kind, data string) []byte {
	return fmt.Appendf(nil, `{"v":1,"run_id":%q,"seq":%d,"kind":%q,"ts":"2026-01-01T00:00:00Z","worker_id":"evil","data":%s}`,
		runID, seq, kind, data)
}

// TestClientForgeries tries each forgery of docs/architecture.md §5.6 as
// the client role: each is refused by the server, and the journal, the
// leases and the projection are as they were.
func TestClientForgeries(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	runA, runB := b.start(t, echoWF), b.start(t, echoWF)
	b.waitStatus(t, runA, "succeeded")
	b.waitStatus(t, runB, "succeeded")
	gate := b.start(t, approvalWF)
	b.waitStatus(t, gate, "waiting")
	// A parked run's worker releases its lease just after step_waiting:
	// take the snapshot once it has.
	require.Eventually(t, func() bool { return b.state(t).LeaseKeys == "" }, 30*time.Second, 10*time.Millisecond,
		"the parked run's lease was never released")
	before := b.state(t)

	pub := func(t *testing.T, subject string, data []byte, hdr nats.Header) {
		t.Helper()
		pctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		_, err := b.cjs.PublishMsg(pctx, &nats.Msg{Subject: subject, Data: data, Header: hdr})
		require.Error(t, err, "publishing to %s", subject)
		b.cviol.wait(t, subject)
	}
	expect := func(seq uint64) nats.Header {
		return nats.Header{"Nats-Expected-Last-Subject-Sequence": []string{fmt.Sprint(seq)}}
	}
	t.Run("step_completed and run_succeeded", func(t *testing.T) {
		subj := eventstore.EventsSubject(gate)
		pub(t, subj, envelope(gate, 3, event.StepCompleted, `{"step_id":"ok","attempt":1,"output":{},"usage":{"cost_usd":123456.78}}`), nil)
		pub(t, subj, envelope(gate, 4, event.RunSucceeded, `{}`), nil)
	})
	t.Run("non-JSON message", func(t *testing.T) {
		pub(t, eventstore.EventsSubject(runA), []byte("not json"), nil)
	})
	t.Run("run B's event on run A's subject", func(t *testing.T) {
		pub(t, eventstore.EventsSubject(runA), envelope(runB, 99, event.RunCancelled, `{"reason":"x"}`), nil)
	})
	t.Run("run_created for a run nobody started", func(t *testing.T) {
		pub(t, eventstore.EventsSubject("run_forged"), envelope("run_forged", 1, event.RunCreated, `{"workflow":{},"input":{},"depth":-7}`), expect(0))
	})
	t.Run("squat a lease", func(t *testing.T) {
		pub(t, "$KV."+eventstore.LeaseBucket+"."+gate, []byte("evil/00000000"), nil)
	})
	t.Run("approval_received", func(t *testing.T) {
		pub(t, eventstore.EventsSubject(gate), envelope(gate, 3, event.ApprovalReceived, `{"step_id":"ok","decision":"approve","approver":"ana"}`), nil)
	})
	t.Run("enqueue and timers", func(t *testing.T) {
		pub(t, eventstore.WorkSubject("", gate), nil, nil)
		pub(t, "pal.timer.fire."+gate, nil, nil)
	})
	t.Run("core publish on pal.ctl.cancel", func(t *testing.T) {
		subj := eventstore.CancelPrefix + gate
		require.NoError(t, b.client.Publish(subj, nil))
		require.NoError(t, b.client.Flush())
		b.cviol.wait(t, subj)
	})
	jsAPI := func(t *testing.T, subject, body string) {
		t.Helper()
		rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		_, err := b.client.RequestWithContext(rctx, subject, []byte(body))
		require.Error(t, err, "request %s", subject)
		b.cviol.wait(t, subject)
	}
	t.Run("delete or purge PAL_EVENTS", func(t *testing.T) {
		dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		err := b.cjs.DeleteStream(dctx, eventstore.EventsStream)
		require.Error(t, err)
		b.cviol.wait(t, "$JS.API.STREAM.DELETE.PAL_EVENTS")
		jsAPI(t, "$JS.API.STREAM.PURGE.PAL_EVENTS", `{}`)
		jsAPI(t, "$JS.API.STREAM.UPDATE.PAL_EVENTS", `{"name":"PAL_EVENTS","subjects":["pal.events.*"],"deny_delete":false}`)
		jsAPI(t, "$JS.API.STREAM.CREATE.EVIL", `{"name":"EVIL","subjects":["pal.>"]}`)
		jsAPI(t, "$JS.API.STREAM.MSG.DELETE.PAL_EVENTS", `{"seq":1}`)
	})
	t.Run("durable consumer", func(t *testing.T) {
		cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		_, err := b.cjs.CreateConsumer(cctx, eventstore.EventsStream, jetstream.ConsumerConfig{Durable: projections.DefaultName})
		require.Error(t, err)
		b.cviol.wait(t, "$JS.API.CONSUMER.CREATE.PAL_EVENTS.pal-projector")
		jsAPI(t, "$JS.API.CONSUMER.DURABLE.CREATE.PAL_EVENTS.squat", `{"stream_name":"PAL_EVENTS","config":{"durable_name":"squat"}}`)
		jsAPI(t, "$JS.API.CONSUMER.DELETE.PAL_EVENTS.pal-projector", ``)
		jsAPI(t, "$JS.API.CONSUMER.CREATE.PAL_WORK.steal", `{"stream_name":"PAL_WORK","config":{"name":"steal"}}`)
		jsAPI(t, "$JS.API.CONSUMER.MSG.NEXT.PAL_CMDS.pal-commands", `{"batch":1}`)
	})
	t.Run("read PAL's replies", func(t *testing.T) {
		_, err := b.client.Subscribe(natsauth.Inbox+".>", func(*nats.Msg) {})
		require.NoError(t, err)
		require.NoError(t, b.client.Flush())
		b.cviol.wait(t, natsauth.Inbox+".>")
	})
	t.Run("answer as the service", func(t *testing.T) {
		_, err := b.client.Subscribe("pal.api.runs.get", func(*nats.Msg) {})
		require.NoError(t, err)
		require.NoError(t, b.client.Flush())
		b.cviol.wait(t, "pal.api.runs.get")
	})

	// The cancel notice reached no worker, nothing else landed anywhere.
	require.Equal(t, before, b.state(t))
	v, err := b.runs.Get(ctx, gate)
	require.NoError(t, err)
	require.Equal(t, "waiting", string(v.Status))
}

// TestClientAllowed: what the client account is for works, with no
// permissions violation: a durable start command a worker carries out
// (its starter the client user), the NATS service, reading a journal
// (ordered consumer, Direct Get) and watching the leases (consumers made
// through the guard).
func TestClientAllowed(t *testing.T) {
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	kv, err := b.cjs.KeyValue(ctx, eventstore.LeaseBucket)
	require.NoError(t, err)
	watch, err := kv.WatchAll(ctx)
	require.NoError(t, err)
	defer func() { _ = watch.Stop() }()
	// Before the end-of-history marker: the workers' presence entries
	// (keys with a dot, never a run id).
	for e := range watch.Updates() {
		if e == nil {
			break
		}
		require.True(t, strings.HasPrefix(e.Key(), "w."), "lease %s before the run started", e.Key())
	}

	// The client starts a deployed workflow (the worker role deploys it).
	_, err = b.runs.Deploy(ctx, runs.DeployCommand{Workflow: json.RawMessage(slowWF), Rights: runs.AllRights})
	require.NoError(t, err)
	cmd := `{"workflow":"slow","input":{},"idempotency_key":"roles-1"}`
	_, err = b.cjs.Publish(ctx, natsauth.CommandSubject(runs.CmdStart, natsauth.DefaultUser), []byte(cmd))
	require.NoError(t, err)
	runID := runs.RunIDForKey("roles-1")
	<-b.slowStarted
	// The watch sees the worker take the run's lease.
	for e := range watch.Updates() {
		if e != nil && e.Key() == runID {
			require.True(t, strings.HasPrefix(string(e.Value()), "w1/"))
			break
		}
	}
	close(b.slowRelease)
	// The api role watches the journal (as SSE feeds do) to the end.
	require.NoError(t, b.apiStore.Watch(ctx, runID, eventstore.Head{}, func(ev event.Event) error {
		if ev.Kind.Terminal() {
			return eventstore.ErrStopWatch
		}
		return nil
	}))
	b.waitStatus(t, runID, "succeeded")
	evs, _, err := b.store.Read(ctx, runID)
	require.NoError(t, err)
	require.Equal(t, natsauth.DefaultUser, evs[0].WorkerID, "the client user started the run")

	m, err := b.client.RequestWithContext(ctx, "pal.api.runs.get", fmt.Appendf(nil, `{"run_id":%q}`, runID))
	require.NoError(t, err)
	var view struct {
		RunID  string `json:"run_id"`
		Status string `json:"status"`
	}
	require.NoError(t, json.Unmarshal(m.Data, &view), string(m.Data))
	require.Equal(t, runID, view.RunID)
	require.Equal(t, "succeeded", view.Status)

	// The journal through an ordered consumer, then its last event by
	// Direct Get.
	want := testenv.ReadJournal(t, b.admin).Kinds(runID)
	cons, err := b.cjs.OrderedConsumer(ctx, eventstore.EventsStream, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{eventstore.EventsSubject(runID)}})
	require.NoError(t, err)
	var got []event.Kind
	for len(got) < len(want) {
		msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
		require.NoError(t, err)
		var ev event.Event
		require.NoError(t, json.Unmarshal(msg.Data(), &ev))
		got = append(got, ev.Kind)
	}
	require.Equal(t, want, got)
	stream, err := b.cjs.Stream(ctx, eventstore.EventsStream)
	require.NoError(t, err)
	last, err := stream.GetLastMsgForSubject(ctx, eventstore.EventsSubject(runID))
	require.NoError(t, err)
	require.Contains(t, string(last.Data), `"kind":"run_succeeded"`)
	require.NoError(t, b.client.Flush())
	require.Empty(t, b.cviol.all())
}

// bigSize is the tool "big"'s output: above the blob threshold.
const bigSize = 2 * eventstore.DefaultBlobThreshold

const bigWF = `{"name":"big","nodes":[{"id":"start","type":"trigger"},{"id":"t1","type":"tool","data":{"tool":"big"}}],"edges":[{"from":"start","to":"t1"}]}`

// TestBigValuesUnderRoles: a big output goes through PAL_BLOBS under the
// roles: the worker puts and reads it, the projector and the api role read
// it, the client may read it and cannot write there. PAL's own roles hit no
// violation (setup's cleanup).
func TestBigValuesUnderRoles(t *testing.T) {
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	runID := b.start(t, bigWF)
	b.waitStatus(t, runID, "succeeded")
	want, _ := json.Marshal(strings.Repeat("b", bigSize))

	evs, _, err := b.apiStore.Read(ctx, runID)
	require.NoError(t, err)
	var out json.RawMessage
	for _, ev := range evs {
		if ev.Kind == event.StepCompleted {
			var d event.StepCompletedData
			require.NoError(t, ev.DecodeData(&d))
			out = d.Output
		}
	}
	require.Equal(t, string(want), string(out), "the api role reads the value")
	require.Eventually(t, func() bool {
		var n int
		err := b.pool.QueryRow(ctx, `SELECT length(output::text) FROM steps WHERE run_id = $1 AND step_id = 't1'`, runID).Scan(&n)
		return err == nil && n == len(want)
	}, 30*time.Second, 20*time.Millisecond, "the projector writes the value to steps.output")

	obs, err := b.cjs.ObjectStore(ctx, eventstore.BlobBucket)
	require.NoError(t, err)
	got, err := obs.GetBytes(ctx, event.BlobSum(want))
	require.NoError(t, err)
	require.Equal(t, want, got, "the client reads the value")
	require.NoError(t, b.client.Flush())
	require.Empty(t, b.cviol.all())

	// The api role keeps a start's big input (and a fork's big copies) as
	// a blob: a value no worker put before.
	in, _ := json.Marshal(map[string]string{"v": strings.Repeat("i", bigSize)})
	res, err := runs.New(b.apiStore).Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: json.RawMessage(bigWF), Input: in, By: "test"})
	require.NoError(t, err)
	b.waitStatus(t, res.RunID, "succeeded")
	evs, _, err = b.store.Read(ctx, res.RunID)
	require.NoError(t, err)
	require.JSONEq(t, string(in), string(createdData(t, evs[0]).Input))

	// The client cannot put a value.
	require.NoError(t, b.client.Publish("$O."+eventstore.BlobBucket+".C.x", []byte("x")))
	b.cviol.wait(t, "$O."+eventstore.BlobBucket+".C.x")
}

func createdData(t *testing.T, ev event.Event) event.RunCreatedData {
	t.Helper()
	var d event.RunCreatedData
	require.NoError(t, ev.DecodeData(&d))
	return d
}

// TestProjectorName: the projector's consumer name in the roles is the
// projector's.
func TestProjectorName(t *testing.T) {
	p := natsauth.For(natsauth.Projector)
	require.Contains(t, p.PubAllow, "$JS.API.CONSUMER.MSG.NEXT.PAL_EVENTS."+projections.DefaultName)
}

// TestWorkerTakeoverUnderRoles: with the roles on, a worker whose
// connection closes mid-step (as a killed process's does) has its run
// resumed by another worker long before its 30 s lease would expire:
// probing the presence subject, answering probes, revoking the lease and
// requeueing the run all pass the worker role, with no violation.
func TestWorkerTakeoverUnderRoles(t *testing.T) {
	srv := testenv.NATS(t, testenv.Roles())
	viol := newViolations()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const ttl = 30 * time.Second
	started := make(chan string, 2)
	type side struct {
		nc *nats.Conn
		w  *workers.Worker
	}
	var store *eventstore.Store
	start := func(id string) side {
		nc := srv.ConnAs(t, natsauth.Worker, viol.option())
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		require.NoError(t, eventstore.Setup(ctx, js, eventstore.Config{LeaseTTL: ttl}))
		st, err := eventstore.Open(ctx, js)
		require.NoError(t, err)
		store = st
		leases, err := eventstore.OpenLeases(ctx, js, ttl)
		require.NoError(t, err)
		w := workers.New(workers.Config{ID: id, Logger: paltest.Logger(t)}, st, leases, provider.Registry{}, connector.Registry{})
		w.RegisterTool("slow", func(ctx context.Context, _ json.RawMessage) (json.RawMessage, error) {
			started <- id
			<-ctx.Done() // only a takeover ends it: the first driver's connection closes
			return nil, ctx.Err()
		})
		require.NoError(t, w.Start(ctx))
		return side{nc: nc, w: w}
	}
	sides := map[string]side{"w1": start("w1"), "w2": start("w2")}
	t.Cleanup(func() {
		for _, s := range sides {
			_ = s.w.Stop(context.Background())
		}
	})
	runID := event.NewRunID()
	_, err := runs.New(store).Start(ctx, runs.StartCommand{Rights: runs.AllRights, RunID: runID, Workflow: json.RawMessage(slowWF), Input: json.RawMessage(`{}`)})
	require.NoError(t, err)
	first := <-started
	closed := time.Now()
	sides[first].nc.Close() // its subscriptions go with it, as a dead process's do
	var second string
	select {
	case second = <-started:
	case <-ctx.Done():
		t.Fatal("no other worker took the run over")
	}
	require.NotEqual(t, first, second)
	require.Less(t, time.Since(closed), ttl/3, "taken over only after the lease would have expired")
	require.Empty(t, viol.all(), "the worker role hit a permissions violation")
}

// TestRetentionUnderRoles: the projector role may do what retention does
// (purge a run's journal from PAL_EVENTS) without a permissions violation,
// and leaves PAL_BLOBS alone.
func TestRetentionUnderRoles(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	ajs, err := jetstream.New(b.admin)
	require.NoError(t, err)
	obs, err := ajs.ObjectStore(ctx, eventstore.BlobBucket) // made by Setup
	require.NoError(t, err)
	_, err = obs.PutBytes(ctx, "blob-old", []byte("old"))
	require.NoError(t, err)
	res, err := b.runs.Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: json.RawMessage(echoWF),
		Input: json.RawMessage(`{"doc":{"blob":"blob-old","size":3}}`), By: "test"})
	require.NoError(t, err)
	old := res.RunID
	b.waitStatus(t, old, "succeeded")
	// Two runs with the same big input, kept in PAL_BLOBS once.
	big := `{"doc":"` + strings.Repeat("b", 300<<10) + `"}`
	sum := event.BlobSum([]byte(big))
	var twins []string
	for range 2 {
		res, err := b.runs.Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: json.RawMessage(echoWF), Input: json.RawMessage(big), By: "test"})
		require.NoError(t, err)
		b.waitStatus(t, res.RunID, "succeeded")
		twins = append(twins, res.RunID)
	}
	later := b.start(t, echoWF) // so no removed run's last message is the stream's last
	b.waitStatus(t, later, "succeeded")
	b.state(t) // the projection has caught up
	age := func(ids ...string) {
		_, err := b.pool.Exec(ctx, "UPDATE runs SET ended_at = now() - interval '2 hours' WHERE run_id = ANY($1)", ids)
		require.NoError(t, err)
	}
	age(old, twins[0])

	p := projections.New(b.pool, b.pstore, projections.Config{Retention: time.Hour, Logger: paltest.Logger(t)})
	n, err := p.RemoveExpired(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, n)
	_, head, err := b.store.LastEvent(ctx, old)
	require.NoError(t, err)
	require.Zero(t, head.Seq, "the journal is purged")
	_, err = obs.GetInfo(ctx, "blob-old")
	require.NoError(t, err, "a look-alike reference in a value names no blob")
	_, err = obs.GetInfo(ctx, sum)
	require.NoError(t, err, "the blob the kept twin references stays")
	evs, _, err := b.store.Read(ctx, twins[1])
	require.NoError(t, err)
	var created event.RunCreatedData
	require.NoError(t, json.Unmarshal(evs[0].Data, &created))
	require.Equal(t, big, string(created.Input), "the kept twin reads its input")

	age(twins[1])
	n, err = p.RemoveExpired(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	_, err = obs.GetInfo(ctx, sum)
	require.ErrorIs(t, err, jetstream.ErrObjectNotFound, "no run references the blob: retention deleted it")
	_, head, err = b.store.LastEvent(ctx, later)
	require.NoError(t, err)
	require.Positive(t, head.Seq)
}

// TestSnapshotsUnderRoles: the worker role puts, reads and deletes a run's
// snapshot in PAL_SNAPSHOTS and checks its head against the journal; the
// client may not write there. PAL's own roles hit no violation (setup's
// cleanup).
func TestSnapshotsUnderRoles(t *testing.T) {
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	runID := b.start(t, bigWF)
	b.waitStatus(t, runID, "succeeded")
	head, err := b.store.LastHead(ctx, runID)
	require.NoError(t, err)
	require.NoError(t, b.store.CheckHead(ctx, runID, head))
	snap := []byte(strings.Repeat("s", 300<<10)) // more than one chunk
	require.NoError(t, b.store.PutSnapshot(ctx, runID, snap))
	require.NoError(t, b.store.PutSnapshot(ctx, runID, snap[:10])) // replaced
	got, err := b.store.GetSnapshot(ctx, runID)
	require.NoError(t, err)
	require.Equal(t, snap[:10], got)
	require.NoError(t, b.store.DeleteSnapshot(ctx, runID))
	_, err = b.store.GetSnapshot(ctx, runID)
	require.ErrorIs(t, err, eventstore.ErrNoSnapshot)

	require.NoError(t, b.client.Publish("$O."+eventstore.SnapshotBucket+".C.x", []byte("x")))
	b.cviol.wait(t, "$O."+eventstore.SnapshotBucket+".C.x")
}

// TestWatchUnderWorkerRole: a watch on the worker role (what pal run
// watch and start --wait do with pal dev's dev.env) takes the journal's
// republished copies live, not at the watch's 10 s resync, and is refused
// nothing.
func TestWatchUnderWorkerRole(t *testing.T) {
	srv := testenv.NATS(t, testenv.Roles())
	viol := newViolations()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	wnc := srv.ConnAs(t, natsauth.Worker, viol.option())
	js, err := jetstream.New(wnc)
	require.NoError(t, err)
	require.NoError(t, eventstore.Setup(ctx, js, eventstore.Config{}))
	store, err := eventstore.Open(ctx, js)
	require.NoError(t, err)
	runID := event.NewRunID()
	ev := func(k event.Kind) event.Event {
		return event.Event{Kind: k, WorkerID: "w1", Data: json.RawMessage(`{}`)}
	}
	h, err := store.Append(ctx, runID, eventstore.Head{}, ev(event.RunCreated))
	require.NoError(t, err)

	got := make(chan event.Event, 10)
	done := make(chan error, 1)
	go func() {
		done <- store.Watch(ctx, runID, eventstore.Head{}, func(e event.Event) error {
			got <- e
			if e.Kind.Terminal() {
				return eventstore.ErrStopWatch
			}
			return nil
		})
	}()
	// The history comes from Direct Gets, after the watch subscribed.
	select {
	case e := <-got:
		require.Equal(t, event.RunCreated, e.Kind)
	case err := <-done:
		t.Fatalf("the watch ended: %v", err)
	case <-ctx.Done():
		t.Fatal("no history from the watch")
	}
	appended := time.Now()
	_, err = store.Append(ctx, runID, h, ev(event.RunCancelled))
	require.NoError(t, err)
	select {
	case e := <-got:
		require.Equal(t, event.RunCancelled, e.Kind)
	case <-time.After(5 * time.Second):
		t.Fatal("the appended event did not reach the watch live (it waits for the 10 s resync)")
	}
	require.Less(t, time.Since(appended), 2*time.Second)
	require.NoError(t, <-done)
	require.NoError(t, wnc.Flush()) // any -ERR from the server has come in
	require.Empty(t, viol.all(), "the worker role hit a permissions violation")
}
