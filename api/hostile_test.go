package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/eventstore"
	palv1 "github.com/palrun/pal/proto/pal/v1"
	"github.com/palrun/pal/runs"
)

// hostileWorkflows are starts that once killed or stalled PAL: a
// condition nested ~450,000 parentheses deep (under the 1 MiB body
// limit), a memory bomb and a CPU bomb.
func hostileWorkflows() map[string]string {
	cond := func(c string) string {
		return fmt.Sprintf(`{"name":"bomb","nodes":[{"id":"start","type":"trigger"},
			{"id":"a","type":"tool","data":{"tool":"echo","input":{}}}],
			"edges":[{"from":"start","to":"a","condition":%q}]}`, c)
	}
	return map[string]string{
		"nested parens": cond(strings.Repeat("(", 450_000) + "true" + strings.Repeat(")", 450_000)),
		"repeat bomb":   cond(`len(repeat(repeat("a", 999999), 999999)) > 0`),
		"range bomb":    cond(`any(1..999990000, {# > 0})`),
	}
}

// TestHostileWorkflowsAreRefusedOnEveryPath sends each hostile workflow
// through every path that takes a definition, as a caller that may
// deploy (PAL's own account on NATS): REST's start and deploy, the NATS
// service's deploy and start, and the durable start all refuse it as bad
// input. Nothing is written or deployed, and PAL keeps serving.
func TestHostileWorkflowsAreRefusedOnEveryPath(t *testing.T) {
	t.Parallel()
	b := setup(t)
	svc, err := api.StartService(t.Context(), b.NC, b.Runs, nil)
	require.NoError(t, err)
	t.Cleanup(func() { _ = svc.Stop() })
	p := runs.NewCommandProcessor(b.Runs, nil)
	require.NoError(t, p.Start(t.Context()))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, p.Stop(ctx))
	})
	rejected := make(chan *nats.Msg, 16)
	sub, err := b.NC.ChanSubscribe(eventstore.RejectedSubject, rejected)
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	before := b.journalState(t)

	for name, wf := range hostileWorkflows() {
		body := `{"workflow":` + wf + `}`
		require.Less(t, len(body), 1<<20, name)

		r := b.post(t, "/v1/runs", body, "Authorization", "Bearer "+testToken)
		m := requireError(t, r, http.StatusBadRequest, "bad_input")
		require.Contains(t, m["detail"], "workflow", name)

		r = b.do(t, http.MethodPut, "/v1/workflows/bomb", strings.NewReader(wf), "Authorization", "Bearer "+testToken)
		requireError(t, r, http.StatusBadRequest, "bad_input")

		msg, err := b.NC.Request(eventstore.WorkflowDeploySubject, []byte(wf), 10*time.Second)
		require.NoError(t, err, name)
		require.Equal(t, "400", msg.Header.Get("Nats-Service-Error-Code"), "%s: %s", name, msg.Data)
		msg, err = b.NC.Request("pal.api.runs.start", []byte(body), 10*time.Second)
		require.NoError(t, err, name)
		require.Equal(t, "400", msg.Header.Get("Nats-Service-Error-Code"), "%s: %s", name, msg.Data)

		_, err = b.JS.Publish(t.Context(), "pal.cmd.runs.start", []byte(body))
		require.NoError(t, err, name)
		select {
		case m := <-rejected:
			var rej runs.Rejection
			require.NoError(t, json.Unmarshal(m.Data, &rej))
			require.Equal(t, "bad_input", rej.Code, "%s: %s", name, rej.Error)
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: no rejection on the command path", name)
		}
	}
	after := b.journalState(t)
	require.Equal(t, before.Journal, after.Journal, "nothing was written to the journal")
	require.Equal(t, before.Streams[eventstore.WorkflowStream], after.Streams[eventstore.WorkflowStream], "nothing was deployed")
	// Still serving.
	r := b.post(t, "/v1/runs", `{"workflow":`+seqWorkflow(1)+`}`, "Authorization", "Bearer "+testToken)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
}

// TestOversizedHeaders: headers over MaxHeaderBytes (here an
// Idempotency-Key) are refused with PAL's JSON error, 431 too_large, not
// Go's plain text, and a gRPC call's with RESOURCE_EXHAUSTED; nothing is
// started.
func TestOversizedHeaders(t *testing.T) {
	t.Parallel()
	b := setup(t)
	before := b.journalState(t)
	// Over Go's own limit of old (64 KiB, plus its 4 KiB of slack).
	big := strings.Repeat("k", api.MaxHeaderBytes+8<<10)
	r := b.post(t, "/v1/runs", fmt.Sprintf(`{"workflow":%s}`, echoWorkflow), "Idempotency-Key", big)
	m := requireError(t, r, http.StatusRequestHeaderFieldsTooLarge, "too_large")
	require.Contains(t, m["detail"], strconv.Itoa(api.MaxHeaderBytes))
	requireError(t, b.get(t, "/v1/runs/run_x", "X-Padding", big[:api.MaxHeaderBytes]), http.StatusRequestHeaderFieldsTooLarge, "too_large")
	require.Equal(t, before, b.journalState(t), "nothing was written")
	// Under the bound is served.
	requireError(t, b.get(t, "/v1/runs/run_x", "X-Padding", big[:api.MaxHeaderBytes-1024]), http.StatusNotFound, "not_found")

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := b.grpcClient(t).GetRun(metadata.AppendToOutgoingContext(withBearer(ctx, testToken), "x-padding", big),
		&palv1.GetRunRequest{RunId: "run_x"})
	require.Equal(t, codes.ResourceExhausted, status.Code(err), "%v", err)
	require.Contains(t, status.Convert(err).Message(), "request headers are larger than the limit")
}
