package runs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/runs"
	"github.com/palrun/pal/workers"
)

// TestDurableForkResumeSignal carries out fork, resume and signal
// published on pal.cmd.runs.*, answered on the reply subject.
func TestDurableForkResumeSignal(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.commands(t)
	b.worker(t, "w1", nil)
	src := b.Start(t, echoChain(3), `{}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, src).Kind)

	do := func(subject, body string) runs.Answer { return durable(t, b, subject, body, "") }

	ans := do("pal.cmd.runs.fork", fmt.Sprintf(`{"run_id":%q,"from":"t3"}`, src))
	require.True(t, ans.OK, ans.Error)
	require.NotNil(t, ans.Fork)
	require.Equal(t, []string{"t1", "t2"}, ans.Fork.Copied)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, ans.RunID).Kind)
	created := data[event.RunCreatedData](t, b.Events(t, ans.RunID)[0])
	require.Equal(t, src, created.ForkedFrom.RunID)
	require.Equal(t, "pal.cmd", b.Events(t, ans.RunID)[0].WorkerID)

	wait := `{"name":"w","nodes":[{"id":"start","type":"trigger"},{"id":"hold","type":"wait","data":{"signal":"go"}}],
		"edges":[{"from":"start","to":"hold"}]}`
	id := b.Start(t, wait, `{}`)
	b.WaitFor(t, id, "the wait", func(ev event.Event) bool { return ev.Kind == event.StepWaiting })
	// The drive that journaled the wait lets go of the run just after it:
	// a resume refuses a run that is being driven.
	require.Eventually(t, func() bool {
		h, err := b.Leases.Holder(ctx, id)
		return err == nil && h == ""
	}, 10*time.Second, 10*time.Millisecond, "the parked run's lease released")
	ans = do("pal.cmd.runs.resume", fmt.Sprintf(`{"run_id":%q}`, id))
	require.True(t, ans.OK, ans.Error)
	ans = do("pal.cmd.runs.signal", fmt.Sprintf(`{"run_id":%q,"signal":"go","payload":{"ok":true}}`, id))
	require.True(t, ans.OK, ans.Error)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, id).Kind)
	last := b.Events(t, id)
	require.JSONEq(t, `{"ok":true}`, string(data[event.RunSucceededData](t, last[len(last)-1]).Output))
	sent := find(last, event.SignalReceived, "")
	require.Len(t, sent, 1)
	require.Equal(t, "pal.cmd", data[event.SignalReceivedData](t, sent[0]).By)
}

// A durable fork or retry delivered again (its worker crashed before the
// ack: the same message, the same Nats-Msg-Id) finds the run it made
// instead of making another: the Nats-Msg-Id is its idempotency key, under
// the kind's name.
func TestRedeliveredForkAndRetryFindTheRunTheyMade(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.commands(t)
	b.worker(t, "w1", map[string]workers.Tool{"boom": func(context.Context, json.RawMessage) (json.RawMessage, error) {
		return nil, &workers.ToolError{Err: errors.New("boom")}
	}})
	wf := `{"name":"f","nodes":[{"id":"start","type":"trigger"},{"id":"t1","type":"tool","data":{"tool":"echo","input":{"i":1}}},
		{"id":"t2","type":"tool","data":{"tool":"boom","input":{}}}],"edges":[{"from":"start","to":"t1"},{"from":"t1","to":"t2"}]}`
	src := b.Start(t, wf, `{}`)
	require.Equal(t, event.RunFailed, b.WaitEnd(t, src).Kind)

	// The first delivery goes through PAL_CMDS; the redelivery is the
	// same message handled again, Do with the same Nats-Msg-Id.
	first := map[string]runs.Answer{}
	bodies := map[string]string{
		runs.CmdFork:  fmt.Sprintf(`{"run_id":%q,"from":"t2"}`, src),
		runs.CmdRetry: fmt.Sprintf(`{"run_id":%q}`, src),
	}
	for kind, body := range bodies {
		ans := durable(t, b, "pal.cmd.runs."+kind, body, "req-"+kind)
		require.True(t, ans.OK, ans.Error)
		first[kind] = ans

		again, _, err := b.Runs.Do(ctx, kind, []byte(body), "req-"+kind, runs.PALCaller("pal.cmd"))
		require.NoError(t, err)
		require.Equal(t, ans.RunID, again.RunID, "%s delivered again finds its run", kind)
		require.NotNil(t, ans.Created)
		require.NotNil(t, again.Created)
		require.True(t, *ans.Created)
		require.False(t, *again.Created)
		require.Equal(t, ans.Fork.Copied, again.Fork.Copied)
		require.Equal(t, []string{"t1"}, again.Fork.Copied)
		require.Len(t, find(b.Events(t, ans.RunID), event.RunCreated, ""), 1)
	}
	retry, _, err := b.Runs.Do(ctx, runs.CmdRetry, []byte(bodies[runs.CmdRetry]), "req-fork", runs.PALCaller("pal.cmd"))
	require.NoError(t, err)
	require.True(t, *retry.Created)
	require.NotEqual(t, first[runs.CmdFork].RunID, retry.RunID, "a fork and a retry with one Nats-Msg-Id are two commands")

	other, _, err := b.Runs.Do(ctx, runs.CmdFork, []byte(bodies[runs.CmdFork]), "req-2", runs.PALCaller("pal.cmd"))
	require.NoError(t, err)
	require.NotEqual(t, first[runs.CmdFork].RunID, other.RunID, "another command is another run")

	// With new_run_id too, the redelivery answers the run, not a conflict.
	named := fmt.Sprintf(`{"run_id":%q,"from":"t2","new_run_id":"run_named_fork"}`, src)
	for i, created := range []bool{true, false} {
		ans, _, err := b.Runs.Do(ctx, runs.CmdFork, []byte(named), "req-3", runs.PALCaller("pal.cmd"))
		require.NoError(t, err, "delivery %d", i+1)
		require.Equal(t, "run_named_fork", ans.RunID)
		require.Equal(t, created, *ans.Created)
	}
}

// durable publishes a durable command (with msgID as its Nats-Msg-Id,
// if given) and returns the answer published to its reply subject.
func durable(t *testing.T, b *bundle, subject, body, msgID string) runs.Answer {
	t.Helper()
	inbox := nats.NewInbox()
	replies, err := b.NC.SubscribeSync(inbox)
	require.NoError(t, err)
	defer func() { _ = replies.Unsubscribe() }()
	msg := nats.NewMsg(subject)
	msg.Data = []byte(body)
	msg.Header.Set(runs.ReplyToHeader, inbox)
	if msgID != "" {
		msg.Header.Set(jetstream.MsgIDHeader, msgID)
	}
	_, err = b.JS.PublishMsg(context.Background(), msg)
	require.NoError(t, err)
	r, err := replies.NextMsg(20 * time.Second)
	require.NoError(t, err)
	var ans runs.Answer
	require.NoError(t, json.Unmarshal(r.Data, &ans))
	return ans
}
