package natsauth_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore/natsauth"
	"github.com/palrun/pal/runs"
)

// answerOf is a NATS service answer: the body and the error header.
type answerOf struct {
	body   map[string]any
	status string
}

func (b *bundle) request(t *testing.T, nc *nats.Conn, subject string, body any) (answerOf, error) {
	t.Helper()
	raw, err := json.Marshal(body)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	m, err := nc.RequestWithContext(ctx, subject, raw)
	if err != nil {
		return answerOf{}, err
	}
	var a answerOf
	require.NoError(t, json.Unmarshal(m.Data, &a.body), "%s", m.Data)
	a.status = m.Header.Get("Nats-Service-Error-Code")
	return a, nil
}

// rejections collects pal.cmd.rejected as a client reads it.
func rejections(t *testing.T, nc *nats.Conn) chan runs.Rejection {
	t.Helper()
	ch := make(chan runs.Rejection, 100)
	_, err := nc.Subscribe("pal.cmd.rejected", func(m *nats.Msg) {
		var r runs.Rejection
		if json.Unmarshal(m.Data, &r) == nil {
			ch <- r
		}
	})
	require.NoError(t, err)
	require.NoError(t, nc.Flush())
	return ch
}

func nextRejection(t *testing.T, ch chan runs.Rejection, subject string) runs.Rejection {
	t.Helper()
	for {
		select {
		case r := <-ch:
			if r.Subject == subject {
				return r
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("no rejection of %s", subject)
		}
	}
}

// TestNATSCallerIsWhoServerSays: over the NATS service and the durable
// commands, a caller is the client user the server authenticated, with
// its scopes, whatever its body says. A user with read+start cannot
// approve, cancel or raise a budget (the server refuses the subjects:
// they are not in its permissions, under its own name or another's) and
// cannot force a resume (PAL refuses it: it needs admin) nor start a
// definition of its own (that needs deploy); it starts deployed workflows
// as itself. A user with approve approves as itself, and the journal
// names it; naming another approver is refused. A user PAL does not know
// is refused, whatever NATS lets it publish.
func TestNATSCallerIsWhoServerSays(t *testing.T) {
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	gate := b.start(t, approvalWF)
	b.waitStatus(t, gate, "waiting")
	slow := b.start(t, slowWF)
	<-b.slowStarted
	holder := func() string {
		kv, err := b.store.JetStream().KeyValue(ctx, "PAL_LEASES")
		require.NoError(t, err)
		e, err := kv.Get(ctx, slow)
		require.NoError(t, err)
		return string(e.Value())
	}
	held := holder()
	kindsBefore := b.journalKinds(t, gate)

	sviol := newViolations()
	snc := b.srv.ConnAsUser(t, starter, sviol.option())
	sjs, err := jetstream.New(snc)
	require.NoError(t, err)
	rejected := rejections(t, snc)

	// The service: approve, cancel and budget are not the starter's
	// subjects, whatever the body says.
	for kind, body := range map[string]map[string]any{
		runs.CmdApprove: {"run_id": gate, "step_id": "ok", "decision": "approve", "approver": ana},
		runs.CmdCancel:  {"run_id": gate, "reason": "mine now", "by": "root"},
		runs.CmdBudget:  {"run_id": gate, "add_usd": 1e12, "by": "ops"},
	} {
		_, err := b.request(t, snc, "pal.api.runs."+kind, body)
		require.Error(t, err, kind)
		sviol.wait(t, "pal.api.runs."+kind)
		// Nor as durable commands, under its own name or another's.
		for _, as := range []string{starter, ana, natsauth.DefaultUser} {
			subj := natsauth.CommandSubject(kind, as)
			raw, _ := json.Marshal(body)
			pctx, pcancel := context.WithTimeout(ctx, 300*time.Millisecond)
			_, err := sjs.Publish(pctx, subj, raw)
			pcancel()
			require.Error(t, err, subj)
			sviol.wait(t, subj)
		}
	}
	// A forced resume is the starter's subject, but not its scope: PAL
	// refuses it on both paths.
	a, err := b.request(t, snc, "pal.api.runs.resume", map[string]any{"run_id": slow, "force": true})
	require.NoError(t, err)
	require.Equal(t, "403", a.status)
	require.Equal(t, runs.CodeForbidden, a.body["code"])
	require.Equal(t, "force", a.body["field"])
	_, err = sjs.Publish(ctx, natsauth.CommandSubject(runs.CmdResume, starter), fmt.Appendf(nil, `{"run_id":%q,"force":true}`, slow))
	require.NoError(t, err)
	r := nextRejection(t, rejected, natsauth.CommandSubject(runs.CmdResume, starter))
	require.Equal(t, runs.CodeForbidden, r.Code)
	require.Equal(t, "force", r.Field)
	require.Equal(t, held, holder(), "the lease was not broken")

	// Without scope deploy it starts no definition of its own, on either
	// path: the refusal names the scope, and nothing is deployed.
	a, err = b.request(t, snc, "pal.api.runs.start", map[string]any{"workflow": json.RawMessage(echoWF), "input": map[string]any{}})
	require.NoError(t, err)
	require.Equal(t, "403", a.status)
	require.Equal(t, "workflow", a.body["field"])
	require.Contains(t, a.body["error"], "scope deploy")
	_, err = sjs.Publish(ctx, natsauth.CommandSubject(runs.CmdStart, starter), fmt.Appendf(nil, `{"workflow":%s,"input":{}}`, echoWF))
	require.NoError(t, err)
	r = nextRejection(t, rejected, natsauth.CommandSubject(runs.CmdStart, starter))
	require.Equal(t, runs.CodeForbidden, r.Code)
	require.Equal(t, "workflow", r.Field)
	wfs, err := b.runs.Workflows(ctx)
	require.NoError(t, err)
	for _, w := range wfs.Workflows {
		require.NotEqual(t, "echo", w.Name, "a refused start deployed nothing")
	}

	// What the starter may do, it does as itself: start what was deployed.
	_, err = b.runs.Deploy(ctx, runs.DeployCommand{Workflow: json.RawMessage(echoWF), Rights: runs.AllRights})
	require.NoError(t, err)
	a, err = b.request(t, snc, "pal.api.runs.start", map[string]any{"workflow": "echo", "input": map[string]any{}})
	require.NoError(t, err)
	started := a.body["run_id"].(string)
	b.waitStatus(t, started, "succeeded")
	evs, _, err := b.store.Read(ctx, started)
	require.NoError(t, err)
	require.Equal(t, starter, evs[0].WorkerID)

	// ana approves as itself, not as another.
	anc := b.srv.ConnAsUser(t, ana)
	ajs, err := jetstream.New(anc)
	require.NoError(t, err)
	arej := rejections(t, anc)
	a, err = b.request(t, anc, "pal.api.runs.approve", map[string]any{"run_id": gate, "step_id": "ok", "decision": "approve", "approver": "root"})
	require.NoError(t, err)
	require.Equal(t, "403", a.status)
	require.Equal(t, "approver", a.body["field"])
	_, err = ajs.Publish(ctx, natsauth.CommandSubject(runs.CmdApprove, ana), fmt.Appendf(nil, `{"run_id":%q,"step_id":"ok","decision":"approve","approver":"root"}`, gate))
	require.NoError(t, err)
	r = nextRejection(t, arej, natsauth.CommandSubject(runs.CmdApprove, ana))
	require.Equal(t, runs.CodeForbidden, r.Code)
	require.Equal(t, "approver", r.Field)
	require.Equal(t, kindsBefore, b.journalKinds(t, gate), "nothing the starter or a refused approval tried was written")
	v, err := b.runs.Get(ctx, gate)
	require.NoError(t, err)
	require.Equal(t, "waiting", string(v.Status))

	a, err = b.request(t, anc, "pal.api.runs.approve", map[string]any{"run_id": gate, "step_id": "ok", "decision": "approve"})
	require.NoError(t, err)
	require.Equal(t, true, a.body["ok"], "%v", a.body)
	b.waitStatus(t, gate, "succeeded")
	evs, _, err = b.store.Read(ctx, gate)
	require.NoError(t, err)
	var approval event.ApprovalReceivedData
	for _, ev := range evs {
		if ev.Kind == event.ApprovalReceived {
			require.NoError(t, ev.DecodeData(&approval))
			require.Equal(t, ana, ev.WorkerID, "the journal names the approver as its writer")
		}
	}
	require.Equal(t, ana, approval.Approver)

	// A user PAL does not know is refused on both paths.
	gnc := b.srv.ConnAsUser(t, ghost)
	gjs, err := jetstream.New(gnc)
	require.NoError(t, err)
	grej := rejections(t, gnc)
	a, err = b.request(t, gnc, "pal.api.runs.start", map[string]any{"workflow": json.RawMessage(echoWF), "input": map[string]any{}})
	require.NoError(t, err)
	require.Equal(t, "403", a.status)
	require.Contains(t, a.body["error"], "PAL_NATS_USERS")
	_, err = gjs.Publish(ctx, natsauth.CommandSubject(runs.CmdStart, ghost), fmt.Appendf(nil, `{"workflow":%s,"input":{}}`, echoWF))
	require.NoError(t, err)
	r = nextRejection(t, grej, natsauth.CommandSubject(runs.CmdStart, ghost))
	require.Equal(t, runs.CodeForbidden, r.Code)

	close(b.slowRelease)
	b.waitStatus(t, slow, "succeeded")
}
