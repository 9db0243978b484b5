package runs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/runs"
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

	do := func(subject, body string) runs.Answer {
		t.Helper()
		inbox := nats.NewInbox()
		replies, err := b.NC.SubscribeSync(inbox)
		require.NoError(t, err)
		defer func() { _ = replies.Unsubscribe() }()
		msg := nats.NewMsg(subject)
		msg.Data = []byte(body)
		msg.Header.Set(runs.ReplyToHeader, inbox)
		_, err = b.JS.PublishMsg(ctx, msg)
		require.NoError(t, err)
		r, err := replies.NextMsg(20 * time.Second)
		require.NoError(t, err)
		var ans runs.Answer
		require.NoError(t, json.Unmarshal(r.Data, &ans))
		return ans
	}

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
