package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/eventstore"
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
// through REST, the NATS service and the durable command path: each is
// refused as bad input, nothing is written, and PAL keeps serving.
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

		msg, err := b.NC.Request("pal.api.runs.start", []byte(body), 10*time.Second)
		require.NoError(t, err, name)
		require.Equal(t, "400", msg.Header.Get("Nats-Service-Error-Code"), "%s: %s", name, msg.Data)

		_, err = b.JS.Publish(t.Context(), "pal.cmd.runs.start", []byte(body))
		require.NoError(t, err, name)
		select {
		case m := <-rejected:
			var rej runs.Rejection
			require.NoError(t, json.Unmarshal(m.Data, &rej))
			require.Equal(t, runs.CodeBadInput, rej.Code, "%s: %s", name, rej.Error)
		case <-time.After(30 * time.Second):
			t.Fatalf("%s: no rejection on the command path", name)
		}
	}
	after := b.journalState(t)
	require.Equal(t, before.Journal, after.Journal, "nothing was written to the journal")
	// Still serving.
	r := b.post(t, "/v1/runs", `{"workflow":`+seqWorkflow(1)+`}`, "Authorization", "Bearer "+testToken)
	require.Equal(t, http.StatusCreated, r.status, "%s", r.body)
}
