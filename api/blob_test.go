package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/paltest/testenv"
	palv1 "github.com/palrun/pal/proto/pal/v1"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/runs"
)

// bigText is the answer of step big: 5 MiB, with an end a later step can
// tell apart.
var bigText = strings.Repeat("x", 5<<20-4) + "TAIL"

// bigWF: step big answers bigText; check reads the whole of it (a
// condition: templates are paths, and one render is at most 1 MiB); next
// sees both through its prompt's template.
const bigWF = `{"name":"big","nodes":[{"id":"start","type":"trigger"},
 {"id":"big","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"big"}},
 {"id":"check","type":"condition","data":{"expression":"string(len(steps.big.output.text)) + \":\" + steps.big.output.text[5242876:]"}},
 {"id":"next","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini",
  "prompt":"seen={{steps.check.output.result}} model={{steps.big.output.model}}"}}],
 "edges":[{"from":"start","to":"big"},{"from":"big","to":"check"},{"from":"check","to":"next"}]}`

// TestBigOutputSurvivesKill9 journals a 5 MiB step output through PAL_BLOBS
// in a real pal worker, kills it with kill -9 after that step completed, and
// has another worker resume the run: the later step sees the output through
// a template, and GET /v1/runs/{id} shows it whole.
//
// The lease TTL is 5 s, not the 1 s of the other kill tests: writing 5 MiB
// on a loaded machine can hold back a renewal past 1 s, and the takeover
// does not wait for the TTL (presence tells w2 that w1 is gone).
func TestBigOutputSurvivesKill9(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *bundleCfg) { c.stack = append(c.stack, paltest.LeaseTTL(5*time.Second)) })
	b.LLM.SetResponder(func(c providertest.Call) providertest.Reply {
		if c.LastUser() == "big" {
			return providertest.Reply{Text: bigText}
		}
		return providertest.Reply{Text: "echo: " + c.LastUser()}
	})
	bin := testenv.PalBinary(t)
	worker := func(id string) *testenv.Process {
		env := append([]string{"PAL_NATS_URL=" + b.NATS.URL(), "PAL_WORKER_ID=" + id, "PAL_LEASE_TTL=5s"}, b.LLM.Env()...)
		p := testenv.StartProcess(t, bin, []string{"worker"}, env)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, p.WaitForOutput(ctx, "worker ready"), "worker %s did not start:\n%s", id, p.Output())
		return p
	}
	runID := event.NewRunID()
	hold := b.LLM.Hold(providertest.ByKey(event.IdempotencyKey(runID, "next", 1)))
	w1 := worker("w1")
	_, err := runs.New(b.Store).Start(context.Background(), runs.StartCommand{Rights: runs.AllRights,
		RunID: runID, Workflow: json.RawMessage(bigWF), Input: json.RawMessage(`{}`), By: "test"})
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	_, err = hold.Wait(ctx)
	require.NoError(t, err, "w1 never reached step next:\n%s", w1.Output())
	w1.Kill() // step big is journaled; next is in flight
	worker("w2")
	hold.Release()
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)

	want := fmt.Sprintf("seen=%d:TAIL model=gpt-4o-mini", len(bigText))
	calls := b.LLM.CallsWithKey(event.IdempotencyKey(runID, "next", 1))
	require.Len(t, calls, 2, "next was sent by w1, then again by w2")
	for _, c := range calls {
		require.Equal(t, want, c.LastUser())
	}

	// The journal holds a reference, never the value.
	refs := 0
	for _, ev := range testenv.ReadJournal(t, b.NC)[runID] {
		require.Less(t, len(ev.Data), 64<<10, "seq %d (%s) carries the value", ev.Seq, ev.Kind)
		if _, ok, _ := event.BlobOf(ev); ok {
			refs++
		}
	}
	require.Equal(t, 1, refs, "big's step_completed names its blob")
	evs := b.Events(t, runID)
	rs := 0
	for _, ev := range evs {
		if ev.Kind == event.RunResumed {
			rs++
		}
	}
	require.Equal(t, 2, rs)

	r := b.get(t, "/v1/runs/"+runID)
	require.Equal(t, 200, r.status, "body: %.200s", r.body)
	var view runs.RunView
	require.NoError(t, json.Unmarshal(r.body, &view))
	var out struct{ Text string }
	for _, s := range view.Steps {
		if s.StepID == "big" {
			require.NoError(t, json.Unmarshal(s.Output, &out))
		}
	}
	require.Equal(t, bigText, out.Text, "GET /v1/runs/{id} shows the whole output")
}

// TestFeedShowsBlobReferences: the event feeds send a big value as its
// _blob reference (§6.4) whether the event was read from the history or
// arrived live: a client connected before the big step completed and one
// connected after the run ended get the same bytes for every event, over
// SSE and gRPC.
func TestFeedShowsBlobReferences(t *testing.T) {
	t.Parallel()
	b := setup(t, withWorker())
	big := strings.Repeat("y", 300<<10)
	b.LLM.SetResponder(func(c providertest.Call) providertest.Reply { return providertest.Reply{Text: big} })
	runID := event.NewRunID()
	hold := b.LLM.Hold(providertest.ByKey(event.IdempotencyKey(runID, "big", 1)))
	t.Cleanup(hold.Release)
	wf := `{"name":"big","nodes":[{"id":"start","type":"trigger"},
		{"id":"big","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"big"}}],"edges":[{"from":"start","to":"big"}]}`
	res := b.post(t, "/v1/runs", fmt.Sprintf(`{"workflow":%s,"input":{"doc":%q},"run_id":%q}`, wf, big, runID))
	require.Equal(t, 201, res.status, "%s", res.body)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := hold.Wait(ctx)
	require.NoError(t, err)

	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	early, err := b.openSSE(t, client, runID, "")
	require.NoError(t, err)
	defer early.close()
	seen := early.readUntil(t, func(ev sseEvent) bool { return ev.kind == string(event.StepStarted) })
	grpcEarly, err := b.grpcClient(t).StreamRunEvents(withBearer(ctx, testToken), &palv1.StreamRunEventsRequest{RunId: runID})
	require.NoError(t, err)
	var grpcSeen []*palv1.Event
	for len(grpcSeen) < len(seen) {
		ev, err := grpcEarly.Recv()
		require.NoError(t, err)
		grpcSeen = append(grpcSeen, ev)
	}
	hold.Release() // step_completed and run_succeeded arrive live
	seen = append(seen, early.readAll(t)...)
	for {
		ev, err := grpcEarly.Recv()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		grpcSeen = append(grpcSeen, ev)
	}

	late, err := b.openSSE(t, client, runID, "")
	require.NoError(t, err)
	defer late.close()
	history := late.readAll(t)
	require.Len(t, history, len(seen))
	require.Len(t, grpcSeen, len(seen))
	refs := 0
	for i := range seen {
		require.Equal(t, string(history[i].data), string(seen[i].data), "seq %d reads the same read or watched", seen[i].id)
		require.Equal(t, string(history[i].event.Data), string(grpcSeen[i].Data), "seq %d: gRPC sends the same data", seen[i].id)
		require.Less(t, len(seen[i].data), 64<<10, "seq %d (%s) carries the value", seen[i].id, seen[i].kind)
		if _, ok, _ := event.BlobOf(history[i].event); ok {
			refs++
		}
	}
	// run_created's input, step_completed's and run_succeeded's output.
	require.Equal(t, 3, refs, "the big values are references")
}
