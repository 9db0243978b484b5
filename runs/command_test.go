package runs_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/runs"
)

func TestCommandsPublishedBeforeAnyWorkerRunLater(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	wf := b.Deploy(t, echoChain(2)).Name // a durable start names a deployed workflow
	body, _ := json.Marshal(map[string]any{"workflow": wf, "input": map[string]int{"n": 1}, "idempotency_key": "order-7"})
	// Published three times while nothing consumes: by key, and twice with
	// the same Nats-Msg-Id but no key.
	for range 2 {
		_, err := b.JS.Publish(ctx, "pal.cmd.runs.start", body)
		require.NoError(t, err)
	}
	nokey, _ := json.Marshal(map[string]any{"workflow": wf})
	for range 2 {
		_, err := b.JS.Publish(ctx, "pal.cmd.runs.start", nokey, jetstream.WithMsgID("req-99"))
		require.NoError(t, err)
	}
	st, err := b.JS.Stream(ctx, eventstore.CommandsStream)
	require.NoError(t, err)
	require.Equal(t, uint64(3), st.CachedInfo().State.Msgs, "JetStream dropped the duplicate Nats-Msg-Id")

	b.commands(t)
	b.worker(t, "w1", nil)
	for _, key := range []string{"order-7", "req-99"} {
		runID := runs.RunIDForKey(key)
		require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
		require.Len(t, find(b.Events(t, runID), event.RunCreated, ""), 1)
	}
	require.Eventually(t, func() bool {
		info, err := st.Info(ctx)
		return err == nil && info.State.Msgs == 0
	}, 10*time.Second, 20*time.Millisecond, "every command is acked")
	j := b.journal(t)
	require.Len(t, j, 2, "two distinct starts, two runs")
}

func (b *bundle) journal(t *testing.T) map[string][]event.Event {
	t.Helper()
	evs := map[string][]event.Event{}
	for _, id := range []string{runs.RunIDForKey("order-7"), runs.RunIDForKey("req-99")} {
		if e, _, err := b.Store.Read(context.Background(), id); err == nil {
			evs[id] = e
		}
	}
	return evs
}

func TestBadCommandsAreAnsweredAndAnnounced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	rejected := make(chan *nats.Msg, 64)
	sub, err := b.NC.ChanSubscribe(eventstore.RejectedSubject, rejected)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	b.commands(t)
	runID := b.Start(t, echoChain(1), `{}`)
	b.worker(t, "w1", nil)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
	before := b.Events(t, runID)

	cases := []struct {
		subject, body, code, field, want string
	}{
		{"pal.cmd.runs.start", `{"workflow":`, "bad_input", "", "malformed JSON"},
		{"pal.cmd.runs.start", `[1,2]`, "bad_input", "", "want a JSON object"},
		{"pal.cmd.runs.start", `{"workflow":{"name":"x"},"extra":1}`, "bad_input", "extra", "unknown field"},
		{"pal.cmd.runs.start", `{"workflow":42}`, "bad_input", "workflow", "want a deployed workflow's name"},
		{"pal.cmd.runs.start", `{"workflow":"a.b"}`, "bad_input", "workflow", "invalid workflow name"},
		{"pal.cmd.runs.start", `{"workflow":"text@0"}`, "bad_input", "workflow", "want a whole number from 1"},
		{"pal.cmd.runs.start", `{"workflow":"text"}`, "not_found", "", "workflow text: workflow not deployed"},
		{"pal.cmd.runs.start", `{"workflow":{"name":"x","nodes":[],"edges":[]}}`, "bad_input", "workflow", "nodes: must not be empty"},
		{"pal.cmd.runs.start", `{"workflow":{"name":"x"},"run_id":"a.b"}`, "bad_input", "run_id", "invalid run id"},
		{"pal.cmd.runs.cancel", `{"run_id":42}`, "bad_input", "run_id", "wrong type"},
		{"pal.cmd.runs.cancel", `{"run_id":"run.*"}`, "bad_input", "run_id", "invalid run id"},
		{"pal.cmd.runs.cancel", `{"run_id":"run_unknown"}`, "not_found", "", "run not found"},
		{"pal.cmd.runs.cancel", fmt.Sprintf(`{"run_id":%q}`, runID), "conflict", "", "already finished"},
		{"pal.cmd.runs.approve", fmt.Sprintf(`{"run_id":%q,"step_id":"t1","decision":"approve","approver":"bo"}`, runID), "conflict", "", "already finished"},
		{"pal.cmd.runs.approve", fmt.Sprintf(`{"run_id":%q,"step_id":"t1","decision":"maybe","approver":"bo"}`, runID), "bad_input", "decision", "want"},
		{"pal.cmd.runs.signal", fmt.Sprintf(`{"run_id":%q}`, runID), "bad_input", "signal", "required"},
		{"pal.cmd.runs.signal", fmt.Sprintf(`{"run_id":%q,"signal":"go","payload":"%s"}`, runID, strings.Repeat("p", runs.MaxSignalPayloadBytes)), "bad_input", "payload", "the limit is 65536"},
		{"pal.cmd.runs.signal", fmt.Sprintf(`{"run_id":%q,"signal":"go"}`, runID), "conflict", "", "already finished"},
		{"pal.cmd.runs.restart", `{}`, "bad_input", "", "unknown command"},
		{"pal.cmd.runs.resume", fmt.Sprintf(`{"run_id":%q}`, runID), "conflict", "", "pal run retry " + runID},
		{"pal.cmd.runs.resume", `{"run_id":"run_unknown"}`, "not_found", "", "run not found"},
		{"pal.cmd.runs.fork", fmt.Sprintf(`{"run_id":%q}`, runID), "bad_input", "from", "required"},
		{"pal.cmd.runs.fork", fmt.Sprintf(`{"run_id":%q,"from":"t9"}`, runID), "bad_input", "from", "never started step"},
		{"pal.cmd.runs.retry", fmt.Sprintf(`{"run_id":%q}`, runID), "conflict", "", "it succeeded"},
		{"pal.cmd.runs.approve", fmt.Sprintf(`{"run_id":%q,"step_id":"t1","decision":"approve","approver":"bo","comment":%q}`, runID, strings.Repeat("c", runs.MaxTextBytes+1)), "bad_input", "comment", "the limit is 4096"},
		{"pal.cmd.runs.cancel", fmt.Sprintf(`{"run_id":%q,"reason":%q}`, runID, strings.Repeat("r", runs.MaxTextBytes+1)), "bad_input", "reason", "the limit is 4096"},
		{"pal.cmd.runs.cancel", fmt.Sprintf(`{"run_id":%q,"by":%q}`, runID, strings.Repeat("b", runs.MaxNameBytes+1)), "bad_input", "by", "the limit is 256"},
	}
	for _, tc := range cases {
		inbox := nats.NewInbox()
		replies, err := b.NC.SubscribeSync(inbox)
		require.NoError(t, err)
		msg := nats.NewMsg(tc.subject)
		msg.Data = []byte(tc.body)
		msg.Header.Set(runs.ReplyToHeader, inbox)
		_, err = b.JS.PublishMsg(ctx, msg)
		require.NoError(t, err, tc.body)
		r, err := replies.NextMsg(10 * time.Second)
		require.NoError(t, err, "no answer to %s %s", tc.subject, tc.body)
		var ans runs.Answer
		require.NoError(t, json.Unmarshal(r.Data, &ans))
		require.False(t, ans.OK, tc.body)
		require.Equal(t, tc.code, ans.Code, "%s: %s", tc.body, ans.Error)
		require.Equal(t, tc.field, ans.Field, "%s: %s", tc.body, ans.Error)
		require.Contains(t, ans.Error, tc.want, tc.body)
		select {
		case m := <-rejected:
			var rej runs.Rejection
			require.NoError(t, json.Unmarshal(m.Data, &rej))
			require.Equal(t, tc.subject, rej.Subject)
			if len(tc.body) > 4096 {
				require.Equal(t, tc.body[:4096]+"…", rej.Command, "long commands are cut in the announcement")
			} else {
				require.Equal(t, tc.body, rej.Command)
			}
			require.Equal(t, ans.Error, rej.Error)
		case <-time.After(10 * time.Second):
			t.Fatalf("no pal.cmd.rejected for %s", tc.body)
		}
		_ = replies.Unsubscribe()
	}
	require.Equal(t, before, b.Events(t, runID), "refused commands wrote nothing")
}

// TestReplySubjectsOnlyWherePALMayAnswer sends commands whose reply
// subject (header or body) names a journal, a lease, the JetStream API or
// the work queue: each is refused whole, announced on pal.cmd.rejected,
// and nothing is published there.
func TestReplySubjectsOnlyWherePALMayAnswer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.worker(t, "w1", nil)
	victim := b.Start(t, echoChain(1), `{}`)
	b.WaitEnd(t, victim)
	before := b.Events(t, victim)
	b.commands(t)
	rejected := make(chan *nats.Msg, 16)
	sub, err := b.NC.ChanSubscribe(eventstore.RejectedSubject, rejected)
	require.NoError(t, err)
	defer func() { _ = sub.Unsubscribe() }()
	// Whatever reaches these subjects (core or stream) is seen here.
	spy, err := b.NC.SubscribeSync(">")
	require.NoError(t, err)
	defer func() { _ = spy.Unsubscribe() }()
	require.NoError(t, b.NC.Flush())

	cancel := fmt.Sprintf(`{"run_id":%q,"reason":"x"}`, victim)
	for _, target := range []string{"pal.events." + victim, "$KV.PAL_LEASES." + victim, "$JS.API.STREAM.DELETE.PAL_EVENTS",
		"pal.work." + victim, "pal.cmd.runs.start", "_INBOX.*", "_INBOX."} {
		for _, inHeader := range []bool{true, false} {
			msg := nats.NewMsg("pal.cmd.runs.cancel")
			if inHeader {
				msg.Header.Set(runs.ReplyToHeader, target)
				msg.Data = []byte(cancel)
			} else {
				body, _ := json.Marshal(map[string]string{"run_id": victim, "reply_to": target})
				msg.Data = body
			}
			_, err := b.JS.PublishMsg(ctx, msg)
			require.NoError(t, err)
			select {
			case m := <-rejected:
				var rej runs.Rejection
				require.NoError(t, json.Unmarshal(m.Data, &rej))
				require.Equal(t, "reply_to", rej.Field, "%s: %s", target, rej.Error)
				require.Equal(t, runs.CodeBadInput, rej.Code)
			case <-time.After(10 * time.Second):
				t.Fatalf("no rejection for reply subject %q", target)
			}
		}
	}
	// The service refuses such requests too and does not answer.
	client := runs.New(b.Store)
	require.Error(t, client.CheckReply("pal.events."+victim))
	require.NoError(t, client.CheckReply("_INBOX.abc"))
	withPrefix := runs.New(b.Store, runs.WithReplyPrefixes("replies."))
	require.NoError(t, withPrefix.CheckReply("replies.app1"))
	for _, bad := range []string{"pal.", "$KV.", "replies", "a..b.", "x.*."} {
		_, err := runs.ParseReplyPrefixes(bad)
		require.Error(t, err, bad)
	}

	require.NoError(t, b.NC.Flush())
	for {
		m, err := spy.NextMsg(200 * time.Millisecond)
		if err != nil {
			break
		}
		// The worker's own lease and journal traffic is expected; an
		// answer of the command processor is not.
		var ans runs.Answer
		if m.Subject != eventstore.RejectedSubject && json.Unmarshal(m.Data, &ans) == nil && (ans.OK || ans.Code != "") {
			t.Errorf("PAL answered on %s: %s", m.Subject, m.Data)
		}
	}
	require.Equal(t, before, b.Events(t, victim), "the victim's journal is unchanged")
	_, err = b.JS.Stream(ctx, eventstore.EventsStream)
	require.NoError(t, err, "PAL_EVENTS still exists")
}

func FuzzDecodeCommand(f *testing.F) {
	for _, s := range []string{`{"workflow":{"name":"x"},"input":{}}`, `{"run_id":"r","step_id":"s","decision":"approve","approver":"a"}`,
		`{"run_id":"r"}`, `{"run_id":"r","name":"n","payload":[1]}`, `{`, `[]`, `null`, `{"run_id":1}`, `{"a":1}`, ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		var cmds = []any{&runs.StartCommand{Rights: runs.AllRights}, &runs.ApproveCommand{}, &runs.CancelCommand{}, &runs.SignalCommand{}}
		for _, c := range cmds {
			err := runs.DecodeStrict([]byte(body), c)
			if err == nil {
				continue
			}
			var ie *runs.InputError
			require.ErrorAs(t, err, &ie, "every refusal is an *InputError")
			require.NotEmpty(t, ie.Error())
		}
	})
}
