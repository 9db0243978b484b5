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
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/internal/limit"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/runs"
)

// hour is a rate that does not refill within a test: n a burst, then one
// an hour.
func hour(n int) limit.Rate { return limit.Rate{N: 1, Per: time.Hour, Burst: n} }

// TestLimitsAtTheFrontDoor: a caller that spent its starts is refused
// (rate_limited) before anything is written, while another caller's
// starts go through; a fork and a retry spend starts too, every other
// command a command; the transport's caller (WithCaller) is whose limit
// is spent, else the identity the command journals.
func TestLimitsAtTheFrontDoor(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	c := runs.New(b.Store, runs.WithLimiter(limit.New(limit.Limits{Starts: hour(2), Commands: hour(2)}, nil)))
	wf := json.RawMessage(echoChain(1))

	for i := range 2 {
		_, err := c.Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: wf, By: "flood"})
		require.NoError(t, err, "start %d within the burst", i)
	}
	events, err := b.JS.Stream(ctx, eventstore.EventsStream)
	require.NoError(t, err)
	info, err := events.Info(ctx)
	require.NoError(t, err)
	_, err = c.Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: wf, By: "flood"})
	require.ErrorIs(t, err, limit.ErrLimited)
	code, _, final := runs.Classify(err)
	require.Equal(t, runs.CodeRateLimited, code)
	require.True(t, final, "not worth retrying at once: the error says when")
	require.Contains(t, err.Error(), "too many runs started (start, fork, retry) from flood")
	after, err := events.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, info.State.LastSeq, after.State.LastSeq, "a refused start writes nothing")

	other, err := c.Start(ctx, runs.StartCommand{Rights: runs.AllRights, Workflow: wf, By: "calm"})
	require.NoError(t, err, "another caller's starts go through")

	// The transport's caller is whose limit is spent, whatever the
	// command names.
	_, err = c.Start(runs.WithCaller(ctx, "flood"), runs.StartCommand{Rights: runs.AllRights, Workflow: wf, By: "someone-else"})
	require.ErrorIs(t, err, limit.ErrLimited)
	_, err = c.Start(runs.WithCaller(ctx, "tok"), runs.StartCommand{Rights: runs.AllRights, Workflow: wf, By: "flood"})
	require.NoError(t, err)

	// Fork and retry are starts.
	_, err = c.Fork(runs.WithCaller(ctx, "flood"), runs.ForkCommand{Rights: runs.AllRights, RunID: other.RunID, From: "t1"})
	require.ErrorIs(t, err, limit.ErrLimited)
	_, err = c.Retry(runs.WithCaller(ctx, "flood"), runs.RetryCommand{Rights: runs.AllRights, RunID: other.RunID})
	require.ErrorIs(t, err, limit.ErrLimited)

	// Commands have their own bucket.
	parent := b.Start(t, `{"name":"p","nodes":[{"id":"start","type":"trigger"},{"id":"g","type":"approval","data":{}}],"edges":[{"from":"start","to":"g"}]}`, `{}`)
	require.NoError(t, c.Cancel(runs.WithCaller(ctx, "flood"), runs.CancelCommand{RunID: parent}))
	err = c.Cancel(runs.WithCaller(ctx, "flood"), runs.CancelCommand{RunID: other.RunID, Reason: "x"})
	require.NotErrorIs(t, err, limit.ErrLimited, "the second command of two")
	err = c.Approve(runs.WithCaller(ctx, "flood"), runs.ApproveCommand{RunID: parent, StepID: "g", Decision: "approve", Approver: "flood"})
	require.ErrorIs(t, err, limit.ErrLimited, "the third")
	_, err = c.Resume(runs.WithCaller(ctx, "flood"), runs.ResumeCommand{RunID: parent})
	require.ErrorIs(t, err, limit.ErrLimited)
	require.ErrorIs(t, c.Signal(runs.WithCaller(ctx, "flood"), runs.SignalCommand{RunID: parent, Signal: "go"}), limit.ErrLimited)
	require.ErrorIs(t, c.RaiseBudget(runs.WithCaller(ctx, "flood"), runs.BudgetCommand{RunID: parent, AddUSD: 1}), limit.ErrLimited)
	require.Equal(t, event.RunCancelled, b.Events(t, parent)[len(b.Events(t, parent))-1].Kind)
}

// TestLimitsOnDurableCommands: the durable command processor holds its
// callers to the client's limits: a flood of durable starts from one
// caller is carried out up to the burst, and each one after is refused
// with code rate_limited, answered and announced on pal.cmd.rejected,
// and starts no run.
func TestLimitsOnDurableCommands(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	c := runs.New(b.Store, runs.WithLimiter(limit.New(limit.Limits{Starts: hour(3)}, nil)))
	p := runs.NewCommandProcessor(c, paltest.Logger(t))
	require.NoError(t, p.Start(ctx))
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, p.Stop(sctx))
	})
	rejected := make(chan *nats.Msg, 64)
	sub, err := b.NC.ChanSubscribe(eventstore.RejectedSubject, rejected)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	inbox := nats.NewInbox()
	replies, err := b.NC.SubscribeSync(inbox)
	require.NoError(t, err)

	const n = 10
	for i := range n {
		msg := nats.NewMsg("pal.cmd.runs.start")
		msg.Data = fmt.Appendf(nil, `{"workflow":%s,"run_id":"run_flood%d"}`, echoChain(1), i)
		msg.Header.Set(runs.ReplyToHeader, inbox)
		_, err := b.JS.PublishMsg(ctx, msg)
		require.NoError(t, err)
	}
	started, limited := 0, 0
	for range n {
		r, err := replies.NextMsg(10 * time.Second)
		require.NoError(t, err)
		var ans runs.Answer
		require.NoError(t, json.Unmarshal(r.Data, &ans))
		switch {
		case ans.OK:
			started++
		default:
			require.Equal(t, runs.CodeRateLimited, ans.Code, ans.Error)
			require.Contains(t, ans.Error, "try again in")
			limited++
			select {
			case m := <-rejected:
				var rej runs.Rejection
				require.NoError(t, json.Unmarshal(m.Data, &rej))
				require.Equal(t, runs.CodeRateLimited, rej.Code)
			case <-time.After(10 * time.Second):
				t.Fatal("a refused command was not announced")
			}
		}
	}
	require.Equal(t, 3, started, "the burst")
	require.Equal(t, n-3, limited)
	events, err := b.JS.Stream(ctx, eventstore.EventsStream)
	require.NoError(t, err)
	info, err := events.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(3), info.State.Msgs, "one journal per start carried out, none for the refused")
}
