package eventstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest/testenv"
)

func TestScheduleWakeFires(t *testing.T) {
	t.Parallel()
	ns := testenv.NATS(t)
	nc := ns.Conn(t)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := context.Background()
	require.NoError(t, eventstore.Setup(ctx, js, eventstore.Config{}))
	store, err := eventstore.Open(ctx, js)
	require.NoError(t, err)
	at := time.Now().Add(2 * time.Second)
	require.NoError(t, store.ScheduleWake(ctx, "run_t1", 7, at))
	require.Error(t, store.ScheduleWake(ctx, "run.x", 7, at))
	// The timer survives a server restart.
	ns.Restart(t)
	cons, err := store.TimerConsumer(ctx)
	require.NoError(t, err)
	msgs, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
	require.NoError(t, err)
	var got []jetstream.Msg
	for m := range msgs.Messages() {
		got = append(got, m)
	}
	require.Len(t, got, 1)
	require.False(t, time.Now().Before(at.Truncate(time.Second)), "fired early")
	id, ok := eventstore.RunIDFromTimer(got[0].Subject())
	require.True(t, ok)
	require.Equal(t, "run_t1", id)
	require.NoError(t, got[0].Ack())
}
