package eventstore_test

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
)

func turnsRec(run, step string, contents ...string) event.ThreadRecord {
	r := event.ThreadRecord{Kind: event.ThreadTurns, RunID: run, StepID: step, TS: time.Unix(0, 0).UTC()}
	for i, c := range contents {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		r.Turns = append(r.Turns, event.ThreadTurn{Role: role, Content: c})
	}
	return r
}

// A thread is appended record by record, each fenced on the thread as its
// writer read it: a writer with a stale thread appends nothing
// (ErrThreadMoved), a record re-sent is stored once, and the thread read
// back is what was written, holds and turns folded.
func TestAppendThread(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx := t.Context()
	empty, err := b.store.ReadThread(ctx, "t1")
	require.NoError(t, err)
	require.Zero(t, empty.Seq)

	open := event.ThreadRecord{Kind: event.ThreadOpen, RunID: "run_a", StepID: "ask", TS: time.Unix(0, 0).UTC()}
	t1, err := b.store.AppendThread(ctx, empty, open, eventstore.ThreadLimits{})
	require.NoError(t, err)
	require.Equal(t, uint64(1), t1.Seq)
	h, busy := t1.HeldBy("run_b")
	require.True(t, busy)
	require.Equal(t, "run_a", h.RunID)
	_, busy = t1.HeldBy("run_a")
	require.False(t, busy, "a run's own hold does not make it wait")

	// Another writer that read the empty thread is refused.
	_, err = b.store.AppendThread(ctx, empty, event.ThreadRecord{Kind: event.ThreadOpen, RunID: "run_b", StepID: "ask"}, eventstore.ThreadLimits{})
	require.ErrorIs(t, err, eventstore.ErrThreadMoved)
	// The same record sent again from the same view: stored once.
	_, err = b.store.AppendThread(ctx, empty, open, eventstore.ThreadLimits{})
	require.ErrorIs(t, err, eventstore.ErrThreadMoved)

	t2, err := b.store.AppendThread(ctx, t1, turnsRec("run_a", "ask", "hi", "hello"), eventstore.ThreadLimits{})
	require.NoError(t, err)
	read, err := b.store.ReadThread(ctx, "t1")
	require.NoError(t, err)
	require.Equal(t, t2.Seq, read.Seq)
	require.Equal(t, t2.Hash, read.Hash)
	require.Equal(t, t2.Bytes, read.Bytes)
	require.Empty(t, read.Holds, "the turns released the hold")
	require.Equal(t, []event.Turn{{Seq: 2, RunID: "run_a", StepID: "ask", Role: "user", Content: "hi"},
		{Seq: 2, RunID: "run_a", StepID: "ask", Role: "assistant", Content: "hello"}}, read.Turns)
	require.True(t, read.Has(event.ThreadTurns, "run_a", "ask"))
	tail, err := b.store.ThreadTail(ctx, "t1")
	require.NoError(t, err)
	require.Equal(t, read.StreamSeq, tail)
	tail, err = b.store.ThreadTail(ctx, "never")
	require.NoError(t, err)
	require.Zero(t, tail)
	require.False(t, read.Has(event.ThreadTurns, "run_b", "ask"))
	n, err := b.stream(t, eventstore.ThreadsStream).Info(ctx)
	require.NoError(t, err)
	require.Equal(t, uint64(2), n.State.Msgs, "two records, none twice")

	// Bad ids are refused before JetStream is touched.
	for _, id := range []string{"", "a.b", "a*", "a>", "a b", strings.Repeat("x", event.MaxThreadIDLen+1)} {
		_, err := b.store.ReadThread(ctx, id)
		require.ErrorIs(t, err, event.ErrInvalidThreadID, id)
	}
}

// A thread's bound: a record that would take it past its turns or bytes
// is refused with nothing written, and Full says a thread at its bound
// takes no new step.
func TestThreadLimits(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx := t.Context()
	th, err := b.store.ReadThread(ctx, "small")
	require.NoError(t, err)
	limits := eventstore.ThreadLimits{MaxTurns: 3, MaxBytes: 2000}
	th, err = b.store.AppendThread(ctx, th, turnsRec("run_a", "s1", "a", "b"), limits)
	require.NoError(t, err)
	require.NoError(t, limits.Full(th))
	_, err = b.store.AppendThread(ctx, th, turnsRec("run_b", "s1", "c", "d"), limits)
	require.ErrorIs(t, err, eventstore.ErrThreadFull)
	require.ErrorContains(t, err, "thread small would hold 4 turns; the limit is 3")
	_, err = b.store.AppendThread(ctx, th, turnsRec("run_b", "s1", strings.Repeat("x", 2000)), limits)
	require.ErrorIs(t, err, eventstore.ErrThreadFull)
	require.ErrorContains(t, err, "the limit is 2000")
	th, err = b.store.AppendThread(ctx, th, turnsRec("run_b", "s1", "c"), limits)
	require.NoError(t, err)
	require.ErrorIs(t, limits.Full(th), eventstore.ErrThreadFull)
	require.ErrorContains(t, limits.Full(th), "thread small holds 3 turns, its limit (PAL_THREAD_MAX_TURNS 3)")
	read, err := b.store.ReadThread(ctx, "small")
	require.NoError(t, err)
	require.Len(t, read.Turns, 3, "refused records were not written")
	require.NoError(t, eventstore.ThreadLimits{}.Full(read), "the defaults are far above")
}

// A message on a thread's subject that PAL did not write, or that does
// not follow the record before it, makes the thread read as corrupt.
func TestReadThreadRefusesForgedRecords(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	for name, forge := range map[string]func(th event.Thread) (*nats.Msg, []jetstream.PublishOpt){
		"no msg id": func(th event.Thread) (*nats.Msg, []jetstream.PublishOpt) {
			r := turnsRec("run_x", "s", "forged")
			r.V, r.Thread, r.Seq, r.Prev = 1, th.ID, th.Seq+1, th.Hash
			body, _ := json.Marshal(r)
			return &nats.Msg{Subject: eventstore.ThreadSubject(th.ID), Data: body}, nil
		},
		"bad prev": func(th event.Thread) (*nats.Msg, []jetstream.PublishOpt) {
			r := turnsRec("run_x", "s", "forged")
			r.V, r.Thread, r.Seq, r.Prev = 1, th.ID, th.Seq+1, strings.Repeat("0", 64)
			body, _ := json.Marshal(r)
			return &nats.Msg{Subject: eventstore.ThreadSubject(th.ID), Data: body}, []jetstream.PublishOpt{jetstream.WithMsgID(event.ThreadMsgID(r))}
		},
		"not json": func(th event.Thread) (*nats.Msg, []jetstream.PublishOpt) {
			return &nats.Msg{Subject: eventstore.ThreadSubject(th.ID), Data: []byte("{")}, nil
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, eventstore.Config{})
			th, err := b.store.ReadThread(ctx, "t")
			require.NoError(t, err)
			th, err = b.store.AppendThread(ctx, th, turnsRec("run_a", "s", "real"), eventstore.ThreadLimits{})
			require.NoError(t, err)
			msg, opts := forge(th)
			_, err = b.js.PublishMsg(ctx, msg, opts...)
			require.NoError(t, err)
			_, err = b.store.ReadThread(ctx, "t")
			require.ErrorIs(t, err, event.ErrThreadCorrupt)
			require.ErrorContains(t, err, "at seq 2")
		})
	}
}

// BenchmarkReadThread reads and verifies a thread of 1,000 turns (500
// records of two turns of 80 bytes): what a thread step reads before its
// call, and a waiting step at each look.
func BenchmarkReadThread(b *testing.B) {
	tb := setup(b, eventstore.Config{})
	ctx := b.Context()
	th, err := tb.store.ReadThread(ctx, "bench")
	require.NoError(b, err)
	for i := range 500 {
		th, err = tb.store.AppendThread(ctx, th, turnsRec("run_a", "s"+strconv.Itoa(i),
			strings.Repeat("q", 80), strings.Repeat("a", 80)), eventstore.ThreadLimits{})
		require.NoError(b, err)
	}
	for b.Loop() {
		got, err := tb.store.ReadThread(ctx, "bench")
		if err != nil || len(got.Turns) != 1000 {
			b.Fatalf("read %d turns: %v", len(got.Turns), err)
		}
	}
}
