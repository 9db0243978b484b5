package runs_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/runs"
)

// TestPanickingCommandIsDeadLettered makes the command handler panic on
// one body (a test hook: no command body is known to make PAL's handler
// panic). The command is tried MaxDeliveries times, then goes to PAL_DEAD
// with the panic as its reason and is announced on pal.cmd.rejected;
// the commands published with it and after it are carried out.
func TestPanickingCommandIsDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	logs := paltest.NewLogCapture()
	var tries atomic.Int32
	p := runs.NewCommandProcessor(b.Runs, slog.New(slog.NewTextHandler(logs, nil)))
	runs.SetCommandHook(p, func(_ string, body []byte) {
		if strings.Contains(string(body), "poison-key") {
			tries.Add(1)
			panic("handler bug on this body")
		}
	})
	require.NoError(t, p.Start(ctx))
	t.Cleanup(func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		require.NoError(t, p.Stop(sctx))
	})
	b.worker(t, "w1", nil)
	rejected := make(chan *nats.Msg, 16)
	sub, err := b.NC.ChanSubscribe(eventstore.RejectedSubject, rejected)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })

	wf := b.Deploy(t, echoChain(1)).Ref()
	start := func(key string) []byte {
		body, _ := json.Marshal(map[string]any{"workflow": wf, "idempotency_key": key})
		return body
	}
	poison, err := b.JS.Publish(ctx, "pal.cmd.runs.start", start("poison-key"))
	require.NoError(t, err)
	_, err = b.JS.Publish(ctx, "pal.cmd.runs.start", start("good-1"))
	require.NoError(t, err)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runs.RunIDForKey("good-1")).Kind,
		"a command published after the poison one is served while it is retried")

	select {
	case m := <-rejected:
		var rej runs.Rejection
		require.NoError(t, json.Unmarshal(m.Data, &rej))
		require.Equal(t, runs.CodeInternal, rej.Code)
		require.Equal(t, poison.Sequence, rej.StreamSeq)
		require.Contains(t, rej.Error, "dead-lettered to PAL_DEAD after 5 deliveries: panic: handler bug on this body")
	case <-time.After(30 * time.Second):
		t.Fatal("the poison command was not announced on pal.cmd.rejected")
	}
	require.Equal(t, int32(eventstore.MaxDeliveries), tries.Load(), "tried exactly MaxDeliveries times")
	dead, err := b.JS.Stream(ctx, eventstore.DeadStream)
	require.NoError(t, err)
	dm, err := dead.GetLastMsgForSubject(ctx, eventstore.DeadSubject(eventstore.DeadCommands))
	require.NoError(t, err)
	require.Equal(t, start("poison-key"), dm.Data)
	require.Equal(t, eventstore.CommandsStream, dm.Header.Get(eventstore.DeadStreamHeader))
	require.Equal(t, "pal.cmd.runs.start", dm.Header.Get(eventstore.DeadSubjectHeader))
	require.Equal(t, strconv.FormatUint(poison.Sequence, 10), dm.Header.Get(eventstore.DeadSeqHeader))
	require.Equal(t, "5", dm.Header.Get(eventstore.DeadDeliveredHeader))
	require.Equal(t, "panic: handler bug on this body", dm.Header.Get(eventstore.DeadReasonHeader))
	logs.Wait(t, "command dead-lettered to PAL_DEAD")
	require.Contains(t, logs.String(), "stream_seq="+strconv.FormatUint(poison.Sequence, 10))

	// The processor goes on: the next command is carried out, and the
	// poison one left PAL_CMDS.
	_, err = b.JS.Publish(ctx, "pal.cmd.runs.start", start("good-2"))
	require.NoError(t, err)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runs.RunIDForKey("good-2")).Kind)
	cmds, err := b.JS.Stream(ctx, eventstore.CommandsStream)
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		info, err := cmds.Info(ctx)
		return err == nil && info.State.Msgs == 0
	}, 10*time.Second, 20*time.Millisecond, "every command is settled")
	_, _, err = b.Store.Read(ctx, runs.RunIDForKey("poison-key"))
	require.ErrorIs(t, err, eventstore.ErrRunNotFound, "the poison command started nothing")
}
