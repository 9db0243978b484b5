package workers_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/receipt"
	"github.com/palrun/pal/runs"
	"github.com/palrun/pal/workers"
)

// The JetStream round trips of the hot paths, counted: the requests (a
// publish or API call whose answer the sender waits for) the path sends
// on its connection (testenv.Requests), by what they are for. The counts
// are ceilings, written in docs/performance.md ("Round trips"): a change
// that adds one fails here, and one that is deliberate updates both.
// Some requests are sent together and waited for at once (a start's
// three); the count is of requests, not of waits.

// TestRoundTripsOfAStart: runs.Client.Start of a workflow already
// deployed reads the registry, then puts the run in the in-flight index,
// appends its run_created and publishes its work message: three
// requests, sent together. A start that brings its definition reads the
// latest version's key and finds it the same (nothing is deployed); one
// that names the workflow reads the latest key and, the first time, that
// version's (the store keeps the versions it read). The first start of a
// definition (the bucket's binding, the deploy's two
// writes) is not counted.
func TestRoundTripsOfAStart(t *testing.T) {
	t.Parallel()
	c := setupCounted(t, false)
	wf := paltest.EchoChain(1)
	c.start(t, wf)
	_, sent := c.start(t, wf)
	requireTrips(t, map[string]int{tripRegistry: 1, tripInflight: 1, tripAppend: 1, tripWork: 1}, sent)

	t.Run("named", func(t *testing.T) {
		var named struct{ Name string }
		require.NoError(t, json.Unmarshal([]byte(wf), &named))
		ref, err := json.Marshal(named.Name)
		require.NoError(t, err)
		_, sent := c.start(t, string(ref))
		requireTrips(t, map[string]int{tripRegistry: 2, tripInflight: 1, tripAppend: 1, tripWork: 1}, sent)
		// Again: the version read is kept, and only the latest key is read.
		_, sent = c.start(t, string(ref))
		requireTrips(t, map[string]int{tripRegistry: 1, tripInflight: 1, tripAppend: 1, tripWork: 1}, sent)
	})
}

// TestRoundTripsOfAStep: one echo step of a sequential run, from the
// step's tool call to the next one's, is the append of its step_completed
// and of the next step_started. In process durability they are two
// messages, each a round trip; packed (strict durability) one.
func TestRoundTripsOfAStep(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		strict bool
		want   int
	}{{"process", false, 2}, {"strict", true, 1}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := setupCounted(t, tc.strict)
			d := c.driveChain(t, 4)
			for i, sent := range d.steps {
				t.Logf("step %d: %q", i+2, sent)
				requireTrips(t, map[string]int{tripAppend: tc.want}, sent)
			}
		})
	}
}

// TestRoundTripsOfAFirstDrive: a run's first drive, from its work
// message to its first step's call, takes the lease, reads the journal
// and appends run_resumed with the first step_started (two messages in
// process durability).
func TestRoundTripsOfAFirstDrive(t *testing.T) {
	t.Parallel()
	c := setupCounted(t, false)
	d := c.driveChain(t, 1)
	requireTrips(t, map[string]int{tripLease: 1, tripRead: 1, tripAppend: 2}, d.first)
}

// TestRoundTripsOfARunEnd: the end of a run, from its last step's call to
// the drive's end, appends the step's step_completed and run_succeeded
// (two messages in process durability), acks the work message (a double
// ack, which waits), releases the lease and stores the signed receipt.
// The in-flight index's purge is published without waiting.
func TestRoundTripsOfARunEnd(t *testing.T) {
	t.Parallel()
	c := setupCounted(t, false)
	d := c.driveChain(t, 1)
	requireTrips(t, map[string]int{tripAppend: 2, tripAck: 1, tripLease: 1, tripReceipt: 1}, d.end)
}

// What a request is for, by its subject.
const (
	tripInflight = "in-flight index"
	tripWork     = "work message"
	tripAppend   = "journal append"
	tripRead     = "journal read"
	tripLease    = "lease"
	tripAck      = "work ack"
	tripReceipt  = "receipt"
	tripRegistry = "registry of deployed workflows"
)

func tripOf(subject string) string {
	switch {
	case strings.HasPrefix(subject, "$KV."+eventstore.InflightBucket+"."):
		return tripInflight
	case strings.HasPrefix(subject, eventstore.WorkPrefix):
		return tripWork
	case strings.HasPrefix(subject, eventstore.EventsPrefix):
		return tripAppend
	case strings.HasPrefix(subject, "$JS.API.DIRECT.GET."+eventstore.EventsStream),
		strings.HasPrefix(subject, "$JS.API.STREAM.MSG.GET."+eventstore.EventsStream):
		return tripRead
	case strings.HasPrefix(subject, "$KV."+eventstore.LeaseBucket+"."):
		return tripLease
	case strings.HasPrefix(subject, "$JS.ACK."+eventstore.WorkStream+"."):
		return tripAck
	case strings.HasPrefix(subject, "$KV."+eventstore.ReceiptBucket+"."):
		return tripReceipt
	case strings.HasPrefix(subject, "$JS.API.DIRECT.GET."+eventstore.WorkflowStream+"."),
		strings.HasPrefix(subject, "$KV."+eventstore.WorkflowBucket+"."):
		return tripRegistry
	}
	return subject // anything else stands for itself
}

// requireTrips fails if sent holds more requests of a kind than want
// allows, or any of a kind want does not name.
func requireTrips(t *testing.T, want map[string]int, sent []string) {
	t.Helper()
	got := map[string]int{}
	for _, s := range sent {
		got[tripOf(s)]++
	}
	for kind, n := range got {
		require.LessOrEqual(t, n, want[kind],
			"round trips for %s grew (sent %q); if that is meant, say so in docs/performance.md (Round trips) and here", kind, sent)
	}
	t.Logf("round trips: %v", got)
}

// counted is a worker, a store and a front door on a connection whose
// requests are counted.
type counted struct {
	*bundle
	reqs  *testenv.Requests
	store *eventstore.Store
	runs  *runs.Client
	w     *workers.Worker
	work  jetstream.Consumer

	mu    sync.Mutex
	calls []int // the request count at each echo call
}

func setupCounted(t *testing.T, strict bool) *counted {
	t.Helper()
	// A lease that outlives the test: no renewal lands among the counts.
	opts := []paltest.Option{paltest.LeaseTTL(time.Hour)}
	if strict {
		opts = append(opts, paltest.Strict())
	}
	b := setup(t, opts...)
	ctx := ctxFor(t, 30*time.Second)
	nc, reqs := b.NATS.CountRequests(t)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	store, err := eventstore.Open(ctx, js, eventstore.WithPacking(strict))
	require.NoError(t, err)
	leases, err := eventstore.OpenLeases(ctx, js, b.TTL)
	require.NoError(t, err)
	rs, err := receipt.Open(ctx, js, store)
	require.NoError(t, err)
	key, err := receipt.WriteKey(filepath.Join(t.TempDir(), "pal.key"))
	require.NoError(t, err)
	c := &counted{bundle: b, reqs: reqs, store: store, runs: runs.New(store)}
	c.w = workers.New(workers.Config{ID: "counted", Logger: paltest.Logger(t), Receipts: rs, SigningKey: key}, store, leases, nil, nil)
	// echo, which marks where each call fell among the requests: every
	// request before the call has been written by then (the drive waited
	// for its answer).
	c.w.RegisterTool("echo", func(_ context.Context, in json.RawMessage) (json.RawMessage, error) {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.calls = append(c.calls, reqs.Mark())
		return in, nil
	})
	c.work, err = store.WorkConsumer(ctx, "")
	require.NoError(t, err)
	return c
}

// mark is the request count once every request sent so far is counted
// (a request is counted when the connection writes it).
func (c *counted) mark(t *testing.T) int {
	t.Helper()
	require.NoError(t, c.store.JetStream().Conn().Flush())
	return c.reqs.Mark()
}

// since is the subjects of the requests sent after mark, once every
// request sent so far is counted.
func (c *counted) since(t *testing.T, mark int) []string {
	t.Helper()
	require.NoError(t, c.store.JetStream().Conn().Flush())
	return c.reqs.Since(mark)
}

// start starts a run of wf (a definition, or a deployed workflow's name
// as a JSON string) on the front door, counted.
func (c *counted) start(t *testing.T, wf string) (runID string, sent []string) {
	t.Helper()
	mark := c.mark(t)
	res, err := c.runs.Start(ctxFor(t, 30*time.Second), runs.StartCommand{Rights: runs.AllRights, Workflow: json.RawMessage(wf), Input: json.RawMessage(`{}`), By: "test"})
	require.NoError(t, err)
	return res.RunID, c.since(t, mark)
}

// driven is one drive of a run of echo steps, its requests cut at the
// steps' calls.
type driven struct {
	first []string   // from the work message to the first call
	steps [][]string // from each call to the next
	end   []string   // from the last call to the drive's end
}

// driveChain starts a run of n echo steps, fetches its work message and
// drives it as the fetch loop does (the fetch is not counted), to its
// end.
func (c *counted) driveChain(t *testing.T, n int) driven {
	t.Helper()
	ctx := ctxFor(t, 30*time.Second)
	runID, _ := c.start(t, paltest.EchoChain(n))
	batch, err := c.work.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	require.NoError(t, err)
	msg := <-batch.Messages()
	require.NotNil(t, msg, "no work message")
	require.Equal(t, eventstore.WorkSubject("", runID), msg.Subject())
	c.mu.Lock()
	c.calls = nil
	c.mu.Unlock()
	mark := c.mark(t)
	workers.Handle(ctx, c.w, msg)
	sent := c.since(t, 0)
	require.True(t, c.WaitEnd(t, runID).Kind.Terminal())
	c.mu.Lock()
	calls := append([]int{mark}, c.calls...)
	c.mu.Unlock()
	require.Len(t, calls, n+1, "echo calls")
	d := driven{first: sent[calls[0]:calls[1]], end: sent[calls[n]:]}
	for i := 1; i < n; i++ {
		d.steps = append(d.steps, sent[calls[i]:calls[i+1]])
	}
	return d
}
