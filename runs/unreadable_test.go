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
	"github.com/palrun/pal/runs"
)

// unreadableRuns makes two runs PAL can never read: one whose run_created
// names a blob PAL_BLOBS does not hold (a forged reference), one whose
// journal verifies but does not fold (a second run_created). It returns
// each run id with the error text its reads give.
func unreadableRuns(t *testing.T, b *bundle) map[string]string {
	t.Helper()
	ctx := context.Background()
	forged := event.NewRunID()
	ev := event.MustNew(event.RunCreated, "", 0, event.RunCreatedData{Workflow: json.RawMessage(echoChain(1)), Input: json.RawMessage(`{}`)})
	ev.Data = json.RawMessage(fmt.Sprintf(`{"workflow":%s,"input_blob":{"blob":%q,"size":5},"depth":0}`,
		echoChain(1), event.BlobSum([]byte("nope!"))))
	ev.WorkerID = "test"
	_, err := b.Store.Append(ctx, forged, eventstore.Head{}, ev)
	require.NoError(t, err)

	twice := createOrphan(t, b, echoChain(1))
	b.AppendRaw(t, twice, event.MustNew(event.RunCreated, "", 0, event.RunCreatedData{Workflow: json.RawMessage(echoChain(1)), Input: json.RawMessage(`{}`)}))
	return map[string]string{forged: "bad blob reference", twice: "the journal does not fold"}
}

// A run whose journal cannot be read or folded fails every read the same
// way: commands on it classify as internal (final), not unavailable (worth
// retrying), and a durable command on it goes to PAL_DEAD at its first
// delivery, answered and announced with code internal, instead of being
// handed back every second without end.
func TestUnreadableRunIsInternalAndItsCommandsDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	bad := unreadableRuns(t, b)
	for runID, want := range bad {
		_, err := b.Runs.Get(ctx, runID)
		require.ErrorContains(t, err, want)
		code, _, final := runs.Classify(err)
		require.Equal(t, runs.CodeInternal, code, "%s: %v", runID, err)
		require.True(t, final, "not worth retrying")
		err = b.Runs.Cancel(ctx, runs.CancelCommand{RunID: runID})
		code, _, final = runs.Classify(err)
		require.Equal(t, runs.CodeInternal, code, "%s: %v", runID, err)
		require.True(t, final)
	}

	rejected := make(chan *nats.Msg, 16)
	sub, err := b.NC.ChanSubscribe(eventstore.RejectedSubject, rejected)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	b.commands(t)
	for runID, want := range bad {
		inbox := nats.NewInbox()
		replies, err := b.NC.SubscribeSync(inbox)
		require.NoError(t, err)
		msg := nats.NewMsg("pal.cmd.runs.cancel")
		msg.Data = []byte(fmt.Sprintf(`{"run_id":%q}`, runID))
		msg.Header.Set(runs.ReplyToHeader, inbox)
		ack, err := b.JS.PublishMsg(ctx, msg)
		require.NoError(t, err)
		r, err := replies.NextMsg(20 * time.Second)
		require.NoError(t, err, "the command is answered, not retried without end")
		_ = replies.Unsubscribe()
		var ans runs.Answer
		require.NoError(t, json.Unmarshal(r.Data, &ans))
		require.Equal(t, runs.CodeInternal, ans.Code)
		require.Contains(t, ans.Error, "dead-lettered to PAL_DEAD: ")
		require.Contains(t, ans.Error, want)

		select {
		case m := <-rejected:
			var rej runs.Rejection
			require.NoError(t, json.Unmarshal(m.Data, &rej))
			require.Equal(t, runs.CodeInternal, rej.Code)
			require.Equal(t, ack.Sequence, rej.StreamSeq)
		case <-time.After(20 * time.Second):
			t.Fatal("the command was not announced on pal.cmd.rejected")
		}
		dead, err := b.JS.Stream(ctx, eventstore.DeadStream)
		require.NoError(t, err)
		dm, err := dead.GetLastMsgForSubject(ctx, eventstore.DeadSubject(eventstore.DeadCommands))
		require.NoError(t, err)
		require.Equal(t, msg.Data, dm.Data)
		require.Equal(t, "1", dm.Header.Get(eventstore.DeadDeliveredHeader), "no retry for what fails for good")
		require.Contains(t, dm.Header.Get(eventstore.DeadReasonHeader), want)
	}
	cmds, err := b.JS.Stream(ctx, eventstore.CommandsStream)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := cmds.Info(ctx)
		return err == nil && info.State.Msgs == 0
	}, 10*time.Second, 20*time.Millisecond, "both commands left PAL_CMDS")
}

// A corrupt journal is a run that is over (failed, journal_corrupt): an
// error carrying it is a conflict, final, like ErrRunFinished, never
// unavailable.
func TestCorruptJournalClassifiesAsConflict(t *testing.T) {
	t.Parallel()
	err := fmt.Errorf("reading run run_x: %w", &event.CorruptError{RunID: "run_x", Seq: 3, Reason: "prev does not match"})
	code, _, final := runs.Classify(err)
	require.Equal(t, runs.CodeConflict, code)
	require.True(t, final)
}
