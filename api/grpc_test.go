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
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/event"
	palv1 "github.com/palrun/pal/proto/pal/v1"
	"github.com/palrun/pal/provider/providertest"
)

// grpcClient dials the bundle's API address (gRPC shares the REST port).
func (b *bundle) grpcClient(t testing.TB) palv1.RunServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(strings.TrimPrefix(b.url, "http://"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	return palv1.NewRunServiceClient(conn)
}

func withBearer(ctx context.Context, tok string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+tok)
}

// TestGRPCStreamRunEventsResume streams a run from after_seq 3 while it
// runs, disconnects mid-run, and resumes from the last seq received: the
// union is every event after seq 3 exactly once, in order, through the
// terminal event, and each is the journal's envelope.
func TestGRPCStreamRunEventsResume(t *testing.T) {
	t.Parallel()
	b := setup(t, withWorker())
	const runID = "run_grpc"
	holdS3 := b.LLM.Hold(providertest.ByKey(event.IdempotencyKey(runID, "s3", 1)))
	holdS4 := b.LLM.Hold(providertest.ByKey(event.IdempotencyKey(runID, "s4", 1)))
	t.Cleanup(holdS3.Release)
	t.Cleanup(holdS4.Release)
	res := b.post(t, "/v1/runs", fmt.Sprintf(`{"workflow":%s,"input":{"topic":"gRPC"},"run_id":%q}`, seqWorkflow(5), runID))
	require.Equal(t, http.StatusCreated, res.status, "%s", res.body)
	b.WaitFor(t, runID, "s3 started", func(ev event.Event) bool { return ev.Kind == event.StepStarted && ev.StepID == "s3" })

	client := b.grpcClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sctx, disconnect := context.WithCancel(withBearer(ctx, testToken))
	first, err := client.StreamRunEvents(sctx, &palv1.StreamRunEventsRequest{RunId: runID, AfterSeq: 3})
	require.NoError(t, err)
	var got []*palv1.Event
	for { // up to s3's start, which is held at the provider
		ev, err := first.Recv()
		require.NoError(t, err)
		got = append(got, ev)
		if ev.Kind == string(event.StepStarted) && ev.StepId == "s3" {
			break
		}
	}
	disconnect()
	_, err = first.Recv()
	require.Equal(t, codes.Canceled, status.Code(err), "%v", err)

	// While the client is away the run moves on to s4.
	holdS3.Release()
	b.WaitFor(t, runID, "s4 started", func(ev event.Event) bool { return ev.Kind == event.StepStarted && ev.StepID == "s4" })
	second, err := client.StreamRunEvents(withBearer(ctx, testToken), &palv1.StreamRunEventsRequest{RunId: runID, AfterSeq: got[len(got)-1].Seq})
	require.NoError(t, err)
	live := false
	for {
		ev, err := second.Recv()
		if err == io.EOF {
			break
		}
		require.NoError(t, err)
		got = append(got, ev)
		if ev.Kind == string(event.StepStarted) && ev.StepId == "s4" && !live {
			live = true
			holdS4.Release() // the rest arrives live on the open stream
		}
	}
	require.True(t, live)

	journal := b.Events(t, runID)
	require.Equal(t, event.RunSucceeded, journal[len(journal)-1].Kind)
	require.Len(t, got, len(journal)-3, "every event after seq 3 exactly once")
	for i, ev := range got {
		want := journal[i+3]
		require.Equal(t, want.Seq, ev.Seq, "in seq order, no gap, no duplicate")
		require.Equal(t, string(want.Kind), ev.Kind)
		require.Equal(t, runID, ev.RunId)
		require.Equal(t, want.StepID, ev.StepId)
		require.Equal(t, want.Prev, ev.Prev)
		require.Equal(t, want.WorkerID, ev.WorkerId)
		require.JSONEq(t, string(want.Data), string(ev.Data))
		ts, err := time.Parse(time.RFC3339Nano, ev.Ts)
		require.NoError(t, err)
		require.True(t, want.TS.Equal(ts))
	}

	// After the terminal event the stream ends at once, with no events.
	third, err := client.StreamRunEvents(withBearer(ctx, testToken), &palv1.StreamRunEventsRequest{RunId: runID, AfterSeq: journal[len(journal)-1].Seq})
	require.NoError(t, err)
	_, err = third.Recv()
	require.Equal(t, io.EOF, err)

	// GetRun is the read model, the same bytes as REST's body.
	run, err := client.GetRun(withBearer(ctx, testToken), &palv1.GetRunRequest{RunId: runID})
	require.NoError(t, err)
	require.Equal(t, "succeeded", run.Status)
	require.Equal(t, journal[len(journal)-1].Seq, run.LastSeq)
	rest := b.get(t, "/v1/runs/"+runID)
	require.Equal(t, http.StatusOK, rest.status)
	require.JSONEq(t, string(rest.body), string(run.View))
	var view map[string]any
	require.NoError(t, json.Unmarshal(run.View, &view))
	require.Equal(t, runID, view["run_id"])
}

// TestGRPCErrors: bad and unknown run ids, missing, wrong and
// under-scoped tokens get their gRPC status codes, and REST still serves
// HTTP/1.1 on the same port.
func TestGRPCErrors(t *testing.T) {
	t.Parallel()
	b := setup(t, withTokens([]api.Token{
		{Name: "ci", Secret: testToken, Scopes: api.DefaultScopes},
		{Name: "starter", Secret: "starter-token-0123456789", Scopes: api.ScopeStart},
	}, false))
	client := b.grpcClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stream := func(ctx context.Context, id string) error {
		s, err := client.StreamRunEvents(ctx, &palv1.StreamRunEventsRequest{RunId: id})
		if err != nil {
			return err
		}
		_, err = s.Recv()
		return err
	}
	for _, tc := range []struct {
		name string
		ctx  context.Context
		id   string
		code codes.Code
	}{
		{"bad run id", withBearer(ctx, testToken), "../etc", codes.InvalidArgument},
		{"empty run id", withBearer(ctx, testToken), "", codes.InvalidArgument},
		{"huge run id", withBearer(ctx, testToken), strings.Repeat("r", 5000), codes.ResourceExhausted},
		{"unknown run", withBearer(ctx, testToken), "run_nobody", codes.NotFound},
		{"no token", ctx, "run_nobody", codes.Unauthenticated},
		{"wrong token", withBearer(ctx, "not-a-token"), "run_nobody", codes.Unauthenticated},
		{"no read scope", withBearer(ctx, "starter-token-0123456789"), "run_nobody", codes.PermissionDenied},
	} {
		err := stream(tc.ctx, tc.id)
		require.Equal(t, tc.code, status.Code(err), "StreamRunEvents, %s: %v", tc.name, err)
		_, err = client.GetRun(tc.ctx, &palv1.GetRunRequest{RunId: tc.id})
		require.Equal(t, tc.code, status.Code(err), "GetRun, %s: %v", tc.name, err)
	}
	r := b.get(t, "/v1/runs/run_nobody")
	require.Equal(t, http.StatusNotFound, r.status)
	require.Equal(t, "application/json", r.header.Get("Content-Type"), "REST answers JSON over HTTP/1.1")
}

// TestGRPCStreamRunEventsDeltas: with include_deltas, StreamRunEvents
// interleaves the text an LLM step streams (kind "delta", seq 0, data an
// event.Delta) with the journal's events: the text so far while the call
// is held, then the rest, adding up to the step's answer; every journal
// event once, in order. Without it, no delta.
func TestGRPCStreamRunEventsDeltas(t *testing.T) {
	t.Parallel()
	b := setup(t, withWorker())
	const runID = "run_grpc_deltas"
	hold := b.LLM.HoldAfter(providertest.ByKey(event.IdempotencyKey(runID, "s1", 1)), 2)
	t.Cleanup(hold.Release)
	res := b.post(t, "/v1/runs", fmt.Sprintf(`{"workflow":%s,"input":{"topic":"deltas"},"run_id":%q}`, seqWorkflow(1), runID))
	require.Equal(t, http.StatusCreated, res.status, "%s", res.body)
	ctx, cancel := context.WithTimeout(withBearer(context.Background(), testToken), time.Minute)
	defer cancel()
	client := b.grpcClient(t)
	s, err := client.StreamRunEvents(ctx, &palv1.StreamRunEventsRequest{RunId: runID, IncludeDeltas: true})
	require.NoError(t, err)
	_, err = hold.Wait(ctx)
	require.NoError(t, err)

	var deltas []event.Delta
	var journal []*palv1.Event
	recv := func() *palv1.Event {
		ev, err := s.Recv()
		require.NoError(t, err)
		if ev.Kind != "delta" {
			journal = append(journal, ev)
			return ev
		}
		require.Zero(t, ev.Seq, "a delta has no seq: a resume is by the journal's")
		require.Equal(t, "s1", ev.StepId)
		var d event.Delta
		require.NoError(t, json.Unmarshal(ev.Data, &d))
		deltas = append(deltas, d)
		return ev
	}
	for len(deltas) < 2 {
		recv()
	}
	require.Equal(t, "echo: step", deltas[0].Text+deltas[1].Text, "the text so far, while the call is held")
	hold.Release()
	for {
		if ev := recv(); ev.Kind == string(event.RunSucceeded) {
			break
		}
	}

	evs := b.Events(t, runID)
	require.Len(t, journal, len(evs), "every journal event once")
	var text strings.Builder
	for i, d := range deltas {
		require.Equal(t, i, d.Index, "in order, once each")
		text.WriteString(d.Text)
	}
	var answer string
	for i, ev := range evs {
		require.Equal(t, ev.Seq, journal[i].Seq)
		if ev.Kind == event.StepCompleted && ev.StepID == "s1" {
			var d event.StepCompletedData
			require.NoError(t, ev.DecodeData(&d))
			var out struct {
				Text string `json:"text"`
			}
			require.NoError(t, json.Unmarshal(d.Output, &out))
			answer = out.Text
		}
	}
	require.NotEmpty(t, answer)
	// A delta may come after the step_completed that ends its call (it is
	// then dropped by event.Streamed's rule); those read before the run
	// ended hold the answer's text in order.
	require.True(t, strings.HasPrefix(answer, text.String()) || text.String() == answer, "%q vs %q", text.String(), answer)

	// Without include_deltas the finished run streams its events only.
	plain, err := client.StreamRunEvents(ctx, &palv1.StreamRunEventsRequest{RunId: runID})
	require.NoError(t, err)
	n := 0
	for {
		ev, err := plain.Recv()
		if err != nil {
			require.ErrorIs(t, err, io.EOF)
			break
		}
		require.NotEqual(t, "delta", ev.Kind)
		n++
	}
	require.Equal(t, len(evs), n)
}
