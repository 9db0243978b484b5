package eventstore_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/eventstore"
)

func TestEnqueueOnePending(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx := t.Context()
	const run = "run_w"

	pending, err := b.store.WorkPending(ctx, "", run)
	require.NoError(t, err)
	require.False(t, pending)

	require.NoError(t, b.store.Enqueue(ctx, "", run, "start"))
	require.NoError(t, b.store.Enqueue(ctx, "", run, "sweep"), "a second enqueue is a no-op, not an error")
	require.NoError(t, b.store.Enqueue(ctx, "", run, "approve"))
	require.Equal(t, uint64(1), b.msgCount(t, eventstore.WorkStream), "one pending message per run")
	pending, err = b.store.WorkPending(ctx, "", run)
	require.NoError(t, err)
	require.True(t, pending)

	// Other runs queue independently.
	require.NoError(t, b.store.Enqueue(ctx, "", "run_w2", "start"))
	require.Equal(t, uint64(2), b.msgCount(t, eventstore.WorkStream))
	pending, err = b.store.WorkPending(ctx, "", "run_w3")
	require.NoError(t, err)
	require.False(t, pending)
}

func TestEnqueueAfterAck(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{LeaseTTL: 5 * time.Second})
	ctx := t.Context()
	const run = "run_w"
	require.NoError(t, b.store.Enqueue(ctx, "", run, "start"))

	cons, err := b.store.WorkConsumer(ctx, "")
	require.NoError(t, err)
	require.Equal(t, eventstore.WorkConsumer, cons.CachedInfo().Name)
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	require.NoError(t, err)
	var msgs []jetstream.Msg
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	require.NoError(t, batch.Error())
	require.Len(t, msgs, 1)
	m := msgs[0]
	require.Equal(t, eventstore.WorkSubject("", run), m.Subject())
	got, q, ok := eventstore.RunIDFromWork(m.Subject())
	require.True(t, ok)
	require.Equal(t, run, got)
	require.Equal(t, "default", q)
	require.Equal(t, "start", m.Headers().Get("Pal-Reason"))

	// Being worked on: still pending, and a new enqueue is still a no-op.
	pending, err := b.store.WorkPending(ctx, "", run)
	require.NoError(t, err)
	require.True(t, pending)
	require.NoError(t, b.store.Enqueue(ctx, "", run, "approve"))
	require.Equal(t, uint64(1), b.msgCount(t, eventstore.WorkStream))

	require.NoError(t, m.DoubleAck(ctx))
	pending, err = b.store.WorkPending(ctx, "", run)
	require.NoError(t, err)
	require.False(t, pending, "an acked work message leaves the queue")
	require.Zero(t, b.msgCount(t, eventstore.WorkStream))

	require.NoError(t, b.store.Enqueue(ctx, "", run, "approve"))
	pending, err = b.store.WorkPending(ctx, "", run)
	require.NoError(t, err)
	require.True(t, pending, "after the ack the run can be queued again")
	require.Equal(t, uint64(1), b.msgCount(t, eventstore.WorkStream))
}

func TestRunIDFromWork(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		subject string
		id      string
		queue   string
		ok      bool
	}{
		{"pal.work.run_01J5ZQ", "run_01J5ZQ", "default", true},
		{eventstore.WorkSubject("", "run_c0a1"), "run_c0a1", "default", true},
		{eventstore.WorkSubject("gpu", "run_c0a1"), "run_c0a1", "gpu", true},
		{"pal.work.a-b_C", "a-b_C", "default", true},
		{"pal.work.gpu.a-b_C", "a-b_C", "gpu", true},
		{"pal.work.", "", "", false},
		{"pal.work", "", "", false},
		{"pal.work.a.b", "b", "a", true},
		{"pal.work.A.b", "", "", false},
		{"pal.work.a.b.c", "", "", false},
		{"pal.work.gpu.", "", "", false},
		{"pal.events.run_1", "", "", false},
		{"pal.cmd.runs.start", "", "", false},
		{"", "", "", false},
		{"xpal.work.run_1", "", "", false},
	} {
		t.Run(tc.subject, func(t *testing.T) {
			id, q, ok := eventstore.RunIDFromWork(tc.subject)
			require.Equal(t, tc.ok, ok)
			if tc.ok {
				require.Equal(t, tc.id, id)
				require.Equal(t, tc.queue, q)
			}
		})
	}
}

func TestSubjects(t *testing.T) {
	t.Parallel()
	require.Equal(t, "pal.events.run_1", eventstore.EventsSubject("run_1"))
	require.Equal(t, "pal.work.run_1", eventstore.WorkSubject("", "run_1"))
	require.Equal(t, "pal.work.run_1", eventstore.WorkSubject("default", "run_1"))
	require.Equal(t, "pal.work.gpu.run_1", eventstore.WorkSubject("gpu", "run_1"))
	require.Equal(t, "pal-workers", eventstore.WorkConsumerName("default"))
	require.Equal(t, "pal-workers-gpu", eventstore.WorkConsumerName("gpu"))
}

func TestRequeueReplacesWorkHeldElsewhere(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{LeaseTTL: 30 * time.Second})
	ctx := t.Context()
	const run = "run_rq"
	require.NoError(t, b.store.Requeue(ctx, "", run, "resume"), "requeueing a run with no pending work enqueues it")
	cons, err := b.store.WorkConsumer(ctx, "")
	require.NoError(t, err)
	fetch := func() jetstream.Msg {
		t.Helper()
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(2*time.Second))
		require.NoError(t, err)
		var msgs []jetstream.Msg
		for m := range batch.Messages() {
			msgs = append(msgs, m)
		}
		require.Len(t, msgs, 1, "no work message: %v", batch.Error())
		return msgs[0]
	}
	held := fetch() // taken by a worker that then freezes: no ack, no nak
	require.NoError(t, held.InProgress())

	// Another worker waits on the queue already.
	got := make(chan jetstream.Msg, 1)
	go func() {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		if err != nil {
			close(got)
			return
		}
		for m := range batch.Messages() {
			got <- m
		}
		close(got)
	}()
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	require.NoError(t, b.store.Requeue(ctx, "", run, "resume"))
	m, ok := <-got
	require.True(t, ok, "no work message")
	require.Less(t, time.Since(start), time.Second, "the fresh message is delivered at once, not after AckWait")
	require.Equal(t, "resume", m.Headers().Get("Pal-Reason"))
	require.Equal(t, uint64(1), b.msgCount(t, eventstore.WorkStream), "still one message per run")
	require.NoError(t, m.DoubleAck(ctx))
	_ = held.Ack() // the frozen worker's late ack of a deleted message is harmless
	pending, err := b.store.WorkPending(ctx, "", run)
	require.NoError(t, err)
	require.False(t, pending)
}

// TestPinWork: the pin is one message no worker is given; it stays while
// the stream is near it and is written again, still one, once the stream
// has moved far past it.
func TestPinWork(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{LeaseTTL: time.Second})
	ctx := timeout(t, time.Minute)
	seq, err := b.store.PinWork(ctx)
	require.NoError(t, err)
	require.NotZero(t, seq)
	again, err := b.store.PinWork(ctx)
	require.NoError(t, err)
	require.Equal(t, seq, again, "a pin near the end stays")

	cons, err := b.store.WorkConsumer(ctx, "")
	require.NoError(t, err)
	for i := range 1100 {
		run := fmt.Sprintf("run_p%d", i)
		require.NoError(t, b.store.Enqueue(ctx, "", run, "start"))
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		require.NoError(t, err)
		for m := range batch.Messages() {
			require.Equal(t, eventstore.WorkSubject("", run), m.Subject(), "the pin was delivered")
			require.NoError(t, m.DoubleAck(ctx))
		}
	}
	moved, err := b.store.PinWork(ctx)
	require.NoError(t, err)
	require.Greater(t, moved, seq, "the pin was not written again")
	require.Equal(t, uint64(1), b.msgCount(t, eventstore.WorkStream), "one pin, no work left")
}
