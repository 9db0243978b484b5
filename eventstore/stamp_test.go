package eventstore_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
)

// next is the message PAL would append after head: its body, chained and
// numbered as Append would write it.
func next(t *testing.T, runID string, head eventstore.Head, k event.Kind, n int) []byte {
	t.Helper()
	e := ev(k, n)
	e.V, e.RunID, e.Seq, e.Prev, e.TS = event.Version, runID, head.Seq+1, head.Hash, time.Now().UTC()
	body, err := event.Encode(e)
	require.NoError(t, err)
	return body
}

// TestReadRefusesWhatPALDidNotWrite: a message whose bytes are the very
// next event PAL would write, chained and numbered, is not folded when
// it lacks PAL's stamp (Nats-Msg-Id "<run_id>:<seq>", Pal-Kind) or is a
// stored answer (a Direct Get's, with its own Nats-Stream): Read reports
// the journal corrupt at that seq, naming why, a watch skips it, and the
// seal after it holds.
func TestReadRefusesWhatPALDidNotWrite(t *testing.T) {
	t.Parallel()
	stamp := func(id, kinds string) nats.Header {
		return nats.Header{jetstream.MsgIDHeader: []string{id}, "Pal-Kind": []string{kinds}}
	}
	for _, tc := range []struct {
		name   string
		forge  func(t *testing.T, b *testBundle, run string, body []byte, h eventstore.Head)
		reason string
	}{
		{"no headers", func(t *testing.T, b *testBundle, run string, body []byte, h eventstore.Head) {
			_, err := b.js.Publish(t.Context(), eventstore.EventsSubject(run), body)
			require.NoError(t, err)
		}, `Nats-Msg-Id ""`},
		{"another seq's id", func(t *testing.T, b *testBundle, run string, body []byte, h eventstore.Head) {
			_, err := b.js.PublishMsg(t.Context(), &nats.Msg{Subject: eventstore.EventsSubject(run), Data: body, Header: stamp(run+":9", "step_started")})
			require.NoError(t, err)
		}, `Nats-Msg-Id "` + "run_stamp:9"},
		{"wrong kind", func(t *testing.T, b *testBundle, run string, body []byte, h eventstore.Head) {
			_, err := b.js.PublishMsg(t.Context(), &nats.Msg{Subject: eventstore.EventsSubject(run), Data: body, Header: stamp(run+":3", "run_succeeded")})
			require.NoError(t, err)
		}, `Pal-Kind "run_succeeded"`},
		{"a stored Direct Get answer", func(t *testing.T, b *testBundle, run string, body []byte, h eventstore.Head) {
			// PAL's very message, headers and all, kept in another
			// stream; a Direct Get there answered into the journal.
			_, err := b.js.CreateStream(t.Context(), jetstream.StreamConfig{Name: "ELSEWHERE", Subjects: []string{"elsewhere"}, AllowDirect: true})
			require.NoError(t, err)
			ack, err := b.js.PublishMsg(t.Context(), &nats.Msg{Subject: "elsewhere", Data: body, Header: stamp(run+":3", "step_started")})
			require.NoError(t, err)
			req, _ := json.Marshal(map[string]uint64{"seq": ack.Sequence})
			require.NoError(t, b.nc.PublishRequest("$JS.API.DIRECT.GET.ELSEWHERE", eventstore.EventsSubject(run), req))
			eventually(t, 10*time.Second, 10*time.Millisecond, func() bool { return b.msgCount(t, eventstore.EventsStream) == 3 },
				"the answer never landed in the journal")
			m := b.lastMsg(t, run)
			require.Equal(t, body, m.Data, "the answer carries PAL's bytes")
			require.Equal(t, run+":3", m.Header.Get(jetstream.MsgIDHeader), "and PAL's stamp")
		}, "its own Nats-"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, eventstore.Config{})
			ctx := t.Context()
			const run = "run_stamp"
			h, err := b.store.Append(ctx, run, eventstore.Head{}, ev(event.RunCreated, 1), ev(event.RunResumed, 2))
			require.NoError(t, err)
			tc.forge(t, b, run, next(t, run, h, event.StepStarted, 3), h)

			evs, head, err := b.store.Read(ctx, run)
			var cerr *event.CorruptError
			require.ErrorAs(t, err, &cerr)
			require.Equal(t, uint64(3), cerr.Seq)
			require.Contains(t, cerr.Reason, tc.reason)
			require.Len(t, evs, 2, "nothing from the forged message on is folded")

			// A watch from the start skips it too.
			got := make(chan event.Event, 10)
			wctx := timeout(t, 200*time.Millisecond)
			_ = b.store.Watch(wctx, run, eventstore.Head{}, func(e event.Event) error { got <- e; return nil })
			close(got)
			var kinds []event.Kind
			for e := range got {
				kinds = append(kinds, e.Kind)
			}
			require.Equal(t, []event.Kind{event.RunCreated, event.RunResumed}, kinds)

			// The seal after it is read, and ends the run.
			_, _, err = b.store.Seal(ctx, run, head, cerr, "w1")
			require.NoError(t, err)
			evs, _, err = b.store.Read(ctx, run)
			require.NoError(t, err)
			require.Len(t, evs, 3)
			require.Equal(t, event.RunFailed, evs[2].Kind)
			require.Equal(t, uint64(3), evs[2].Seq)
			var d event.RunFailedData
			require.NoError(t, evs[2].DecodeData(&d))
			require.Equal(t, event.CodeJournalCorrupt, d.Code)
			require.Contains(t, d.Reason, tc.reason, fmt.Sprintf("the seal names why: %s", d.Reason))
		})
	}
}
