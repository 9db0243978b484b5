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
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/eventstore/natsauth"
	"github.com/palrun/pal/paltest/testenv"
)

// TestThreadsUnderRoles: the worker role sets up PAL_THREADS and appends
// a thread's records; the api role and a client user with scope read read
// the thread back (ReadThread's batched Direct Get; the client's through
// the links); no client may write to a thread. PAL's roles hit no
// violation.
func TestThreadsUnderRoles(t *testing.T) {
	srv := testenv.NATS(t, testenv.Roles())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	palViol, cviol := newViolations(), newViolations()
	open := func(role natsauth.Role) *eventstore.Store {
		t.Helper()
		js, err := jetstream.New(srv.ConnAs(t, role, palViol.option()))
		require.NoError(t, err)
		if role == natsauth.Worker {
			require.NoError(t, eventstore.Setup(ctx, js, eventstore.Config{}))
		}
		st, err := eventstore.Open(ctx, js)
		require.NoError(t, err)
		return st
	}
	worker := open(natsauth.Worker)
	th, err := worker.ReadThread(ctx, "t1")
	require.NoError(t, err)
	th, err = worker.AppendThread(ctx, th, event.ThreadRecord{Kind: event.ThreadOpen, RunID: "run_a", StepID: "ask"}, eventstore.ThreadLimits{})
	require.NoError(t, err)
	_, err = worker.AppendThread(ctx, th, event.ThreadRecord{Kind: event.ThreadTurns, RunID: "run_a", StepID: "ask",
		Turns: []event.ThreadTurn{{Role: "user", Content: "hi"}, {Role: "assistant", Content: "hello"}}}, eventstore.ThreadLimits{})
	require.NoError(t, err)

	got, err := open(natsauth.API).ReadThread(ctx, "t1")
	require.NoError(t, err)
	require.Len(t, got.Turns, 2)
	require.Equal(t, "hello", got.Turns[1].Content)

	// A client user reads the records as ReadThread does: batched Direct
	// Get, through the links.
	client := srv.ConnAs(t, natsauth.Client, cviol.option())
	subj := eventstore.ThreadSubject("t1")
	inbox := client.NewRespInbox()
	stored, err := client.SubscribeSync(inbox)
	require.NoError(t, err)
	body := fmt.Appendf(nil, `{"seq":1,"next_by_subj":%q,"batch":10}`, subj)
	require.NoError(t, client.PublishMsg(&nats.Msg{Subject: "$JS.API.DIRECT.GET." + eventstore.ThreadsStream, Reply: inbox, Data: body}))
	var kinds []string
	for {
		m, err := stored.NextMsg(10 * time.Second)
		require.NoError(t, err)
		if m.Header.Get("Status") == "204" { // the end of the batch
			break
		}
		var r event.ThreadRecord
		require.NoError(t, json.Unmarshal(m.Data, &r))
		kinds = append(kinds, r.Kind)
	}
	require.Equal(t, []string{event.ThreadOpen, event.ThreadTurns}, kinds)

	require.NoError(t, client.Publish(subj, []byte(`{"v":1,"thread":"t1","seq":3,"kind":"close","run_id":"run_a","step_id":"ask"}`)))
	require.NoError(t, client.Flush())
	cviol.wait(t, subj)
	got, err = worker.ReadThread(ctx, "t1")
	require.NoError(t, err)
	require.Equal(t, uint64(2), got.Seq, "the client's record was not stored")
	require.Empty(t, palViol.all(), "PAL's roles hit a permissions violation")
}
