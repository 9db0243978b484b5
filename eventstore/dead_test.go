package eventstore_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/eventstore"
)

// TestRetryDeadLettersOnTheLastDelivery hands a command back on each
// failed delivery until the MaxDeliveries-th, which goes to PAL_DEAD with
// its origin and reason and leaves PAL_CMDS.
func TestRetryDeadLettersOnTheLastDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx := t.Context()
	m := nats.NewMsg(eventstore.CommandPrefix + "start")
	m.Data = []byte(`{"workflow":"x"}`)
	m.Header.Set("Pal-Reply-To", "_INBOX.x")
	m.Header.Set(jetstream.MsgIDHeader, "req-1")
	ack, err := b.js.PublishMsg(ctx, m)
	require.NoError(t, err)
	cons, err := b.js.Consumer(ctx, eventstore.CommandsStream, eventstore.CommandConsumer)
	require.NoError(t, err)

	reason := "panic: boom\n\tgoroutine 7 [running]:\n" + strings.Repeat("x", 4000)
	for n := 1; n <= eventstore.MaxDeliveries; n++ {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
		require.NoError(t, err)
		msg := <-batch.Messages()
		require.NotNil(t, msg, "delivery %d", n)
		dead, err := b.store.Retry(ctx, eventstore.DeadCommands, msg, reason, 10*time.Millisecond)
		require.NoError(t, err)
		require.Equal(t, n == eventstore.MaxDeliveries, dead, "delivery %d", n)
	}
	require.Eventually(t, func() bool { return b.msgCount(t, eventstore.CommandsStream) == 0 },
		5*time.Second, 10*time.Millisecond, "the dead letter left PAL_CMDS")
	require.Equal(t, uint64(1), b.msgCount(t, eventstore.DeadStream))

	got, err := b.stream(t, eventstore.DeadStream).GetLastMsgForSubject(ctx, eventstore.DeadSubject(eventstore.DeadCommands))
	require.NoError(t, err)
	require.Equal(t, "pal.dead.cmds", got.Subject)
	require.Equal(t, m.Data, got.Data)
	h := got.Header
	require.Equal(t, eventstore.CommandsStream, h.Get(eventstore.DeadStreamHeader))
	require.Equal(t, "pal.cmd.runs.start", h.Get(eventstore.DeadSubjectHeader))
	require.Equal(t, strconv.FormatUint(ack.Sequence, 10), h.Get(eventstore.DeadSeqHeader))
	require.Equal(t, strconv.Itoa(eventstore.MaxDeliveries), h.Get(eventstore.DeadDeliveredHeader))
	require.Equal(t, "req-1", h.Get(eventstore.DeadMsgIDHeader))
	require.Equal(t, "_INBOX.x", h.Get("Pal-Reply-To"), "the original's own headers are kept")
	r := h.Get(eventstore.DeadReasonHeader)
	require.True(t, strings.HasPrefix(r, "panic: boom goroutine 7 [running]: xxx"), "one line: %q", r[:60])
	require.LessOrEqual(t, len(r), 1024+len("…"), "the reason is bounded")
}

// TestDeadLetterTwiceIsStoredOnce copies one message twice (its term was
// lost and it came again): PAL_DEAD holds it once.
func TestDeadLetterTwiceIsStoredOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	ctx := t.Context()
	_, err := b.js.Publish(ctx, eventstore.CommandPrefix+"cancel", []byte(`{}`))
	require.NoError(t, err)
	cons, err := b.js.Consumer(ctx, eventstore.CommandsStream, eventstore.CommandConsumer)
	require.NoError(t, err)
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	require.NoError(t, err)
	msg := <-batch.Messages()
	require.NotNil(t, msg)
	require.NoError(t, b.store.DeadLetter(ctx, eventstore.DeadCommands, msg, "first"))
	require.NoError(t, b.store.Dead(ctx, eventstore.DeadCommands, msg, "again"))
	require.Equal(t, uint64(1), b.msgCount(t, eventstore.DeadStream))
}
