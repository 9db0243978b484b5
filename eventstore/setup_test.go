package eventstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest/testenv"
)

// layout is what Setup built: the config of every stream, the lease bucket
// and the work consumer.
type layout struct {
	streams  map[string]jetstream.StreamConfig
	created  map[string]time.Time
	consumer jetstream.ConsumerConfig
	leases   jetstream.KeyValueConfig
}

func readLayout(t *testing.T, js jetstream.JetStream) layout {
	t.Helper()
	ctx := t.Context()
	l := layout{streams: map[string]jetstream.StreamConfig{}, created: map[string]time.Time{}}
	for _, name := range []string{eventstore.EventsStream, eventstore.WorkStream, eventstore.CommandsStream, eventstore.DeadStream, "KV_" + eventstore.LeaseBucket} {
		s, err := js.Stream(ctx, name)
		require.NoError(t, err, "stream %s", name)
		info, err := s.Info(ctx)
		require.NoError(t, err)
		l.streams[name] = info.Config
		l.created[name] = info.Created
	}
	c, err := js.Consumer(ctx, eventstore.WorkStream, eventstore.WorkConsumer)
	require.NoError(t, err)
	ci, err := c.Info(ctx)
	require.NoError(t, err)
	l.consumer = ci.Config
	l.created["consumer"] = ci.Created
	kv, err := js.KeyValue(ctx, eventstore.LeaseBucket)
	require.NoError(t, err)
	st, err := kv.Status(ctx)
	require.NoError(t, err)
	l.leases = st.(*jetstream.KeyValueBucketStatus).Config()
	return l
}

func TestSetupLayout(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{LeaseTTL: 2 * time.Second})
	l := readLayout(t, b.js)

	events := l.streams[eventstore.EventsStream]
	require.Equal(t, []string{"pal.events.*"}, events.Subjects)
	require.Equal(t, jetstream.LimitsPolicy, events.Retention)
	require.Equal(t, jetstream.FileStorage, events.Storage)
	require.Equal(t, 1, events.Replicas)
	require.True(t, events.AllowDirect, "PAL_EVENTS must allow Direct Get (batched reads)")
	require.True(t, events.DenyDelete, "PAL_EVENTS must deny delete")
	require.False(t, events.DenyPurge, "retention purges finished journals by subject")
	require.Equal(t, int32(eventstore.DefaultMaxEventBytes), events.MaxMsgSize)
	require.Positive(t, events.Duplicates)
	require.NotNil(t, events.RePublish, "watches take the republished copies")
	require.Equal(t, "pal.events.*", events.RePublish.Source)
	require.Equal(t, eventstore.WatchPrefix+"{{wildcard(1)}}", events.RePublish.Destination)

	work := l.streams[eventstore.WorkStream]
	require.Equal(t, []string{"pal.work.*", "pal.work.*.*", eventstore.WorkPinSubject}, work.Subjects)
	require.Equal(t, jetstream.WorkQueuePolicy, work.Retention)
	require.Equal(t, jetstream.FileStorage, work.Storage)
	require.Equal(t, int64(1), work.MaxMsgsPerSubject, "at most one pending work message per run")
	require.Equal(t, jetstream.DiscardNew, work.Discard)
	require.True(t, work.DiscardNewPerSubject, "a second work message must be refused, not replace the first")

	cmds := l.streams[eventstore.CommandsStream]
	require.Equal(t, []string{"pal.cmd.runs.>"}, cmds.Subjects)
	require.Equal(t, jetstream.WorkQueuePolicy, cmds.Retention)
	require.Equal(t, jetstream.FileStorage, cmds.Storage)

	dead := l.streams[eventstore.DeadStream]
	require.Equal(t, []string{"pal.dead.*"}, dead.Subjects)
	require.Equal(t, jetstream.LimitsPolicy, dead.Retention)
	require.Equal(t, jetstream.FileStorage, dead.Storage)
	require.Equal(t, jetstream.DiscardOld, dead.Discard, "a flood of dead letters drops the oldest")
	require.Equal(t, int64(eventstore.DeadMaxMsgs), dead.MaxMsgs)
	require.Positive(t, dead.Duplicates, "a copy made again after a lost term is stored once")

	leases := l.streams["KV_"+eventstore.LeaseBucket]
	require.True(t, leases.AllowMsgTTL, "leases need per-message TTLs")
	require.Equal(t, jetstream.FileStorage, leases.Storage)
	require.Equal(t, eventstore.LeaseBucket, l.leases.Bucket)
	require.Equal(t, int64(1), leases.MaxMsgsPerSubject, "one revision per lease")
	require.Positive(t, l.leases.LimitMarkerTTL, "expiry must leave a marker that watchers see")
	require.Equal(t, l.leases.LimitMarkerTTL, leases.SubjectDeleteMarkerTTL)

	c := l.consumer
	require.Equal(t, eventstore.WorkConsumer, c.Durable)
	require.Equal(t, jetstream.AckExplicitPolicy, c.AckPolicy)
	require.Equal(t, 2*time.Second, c.AckWait, "AckWait follows the lease TTL")
	require.Equal(t, -1, c.MaxDeliver, "an uncapped MaxDeliver keeps crashed runs from sticking in the queue")
	require.Equal(t, "pal.work.*", c.FilterSubject)
}

func TestSetupIsIdempotent(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	before := readLayout(t, b.js)
	require.NoError(t, eventstore.Setup(t.Context(), b.js, eventstore.Config{}))
	require.NoError(t, eventstore.Setup(t.Context(), b.js, eventstore.Config{}))
	after := readLayout(t, b.js)
	require.Equal(t, before, after)
	require.Equal(t, eventstore.DefaultLeaseTTL, after.consumer.AckWait)
}

func TestSetupKeepsJournal(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{})
	h, err := b.store.Append(t.Context(), "run_keep", eventstore.Head{}, ev(event.RunCreated, 1))
	require.NoError(t, err)
	require.NoError(t, eventstore.Setup(t.Context(), b.js, eventstore.Config{}))
	evs, h2, err := b.store.Read(t.Context(), "run_keep")
	require.NoError(t, err)
	requireJournal(t, "run_keep", evs, 1)
	require.Equal(t, h, h2)
}

func TestSetupUpdatesLeaseTTL(t *testing.T) {
	t.Parallel()
	b := setup(t, eventstore.Config{LeaseTTL: 2 * time.Second})
	// Rounded to whole seconds, as KV TTLs are.
	require.NoError(t, eventstore.Setup(t.Context(), b.js, eventstore.Config{LeaseTTL: 4400 * time.Millisecond}))
	require.Equal(t, 4*time.Second, readLayout(t, b.js).consumer.AckWait)
	// Below a second becomes a second.
	require.NoError(t, eventstore.Setup(t.Context(), b.js, eventstore.Config{LeaseTTL: 100 * time.Millisecond}))
	require.Equal(t, time.Second, readLayout(t, b.js).consumer.AckWait)
}

func TestOpenBeforeSetupIsMissing(t *testing.T) {
	t.Parallel()
	srv := testenv.NATS(t)
	js, err := jetstream.New(srv.Conn(t))
	require.NoError(t, err)
	_, err = eventstore.Open(t.Context(), js)
	require.Error(t, err)
	require.True(t, eventstore.IsMissing(err), "got %v", err)
	_, err = eventstore.OpenLeases(t.Context(), js, time.Second)
	require.Error(t, err)
	require.True(t, eventstore.IsMissing(err), "got %v", err)
	require.False(t, eventstore.IsMissing(eventstore.ErrConflict))
}

func TestSetupWithoutTTLLeavesTheWorkersAckWait(t *testing.T) {
	t.Parallel()
	ns := testenv.NATS(t)
	js, err := jetstream.New(ns.Conn(t))
	require.NoError(t, err)
	ctx := context.Background()
	// A CLI or projector on a fresh server: the consumer gets the default.
	require.NoError(t, eventstore.Setup(ctx, js, eventstore.Config{}))
	c, err := js.Consumer(ctx, eventstore.WorkStream, eventstore.WorkConsumer)
	require.NoError(t, err)
	require.Equal(t, eventstore.DefaultLeaseTTL, c.CachedInfo().Config.AckWait)
	// A worker with a 1 s lease sets it; a later Setup without a TTL keeps it.
	require.NoError(t, eventstore.Setup(ctx, js, eventstore.Config{LeaseTTL: time.Second}))
	require.NoError(t, eventstore.Setup(ctx, js, eventstore.Config{}))
	c, err = js.Consumer(ctx, eventstore.WorkStream, eventstore.WorkConsumer)
	require.NoError(t, err)
	require.Equal(t, time.Second, c.CachedInfo().Config.AckWait)
}
