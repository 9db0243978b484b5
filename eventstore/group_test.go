package eventstore_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/eventstore/natsauth"
	"github.com/palrun/pal/paltest/testenv"
)

// strictStore is a packing store on a server that fsyncs every write, as
// PAL_DURABILITY=strict runs it, connected as the worker role.
func strictStore(t *testing.T) *eventstore.Store {
	t.Helper()
	srv := testenv.NATS(t, testenv.Strict(), testenv.Roles())
	admin, err := jetstream.New(srv.Conn(t))
	require.NoError(t, err)
	require.NoError(t, eventstore.Setup(t.Context(), admin, eventstore.Config{}))
	js, err := jetstream.New(srv.ConnAs(t, natsauth.Worker))
	require.NoError(t, err)
	s, err := eventstore.Open(t.Context(), js, eventstore.WithPacking(true))
	require.NoError(t, err)
	_, _, ok := s.GroupStats()
	require.True(t, ok, "a packing store on PAL_EVENTS commits in groups")
	return s
}

// TestGroupCommitBatchesConcurrentAppends has 64 runs append at once on a
// strict server: appends are committed in atomic batches of several, and
// every run's journal reads back whole, in order, chained, with the head
// each append returned.
func TestGroupCommitBatchesConcurrentAppends(t *testing.T) {
	t.Parallel()
	s := strictStore(t)
	ctx := timeout(t, time.Minute)
	const runs, appends = 64, 20
	appendAtOnce(t, ctx, s, "run_group_", runs, appends, 2)
	batches, batched, _ := s.GroupStats()
	t.Logf("%d appends: %d atomic batches holding %d of them", runs*appends, batches, batched)
	require.Positive(t, batches, "no append was group-committed")
	require.GreaterOrEqual(t, batched, batches*eventstore.GroupMinBatch)
}

// appendAtOnce has runs runs (prefix0, prefix1, …) each make appends
// appends of per events at once, then checks that every journal reads back
// whole, in order, chained, with the head its last append returned.
func appendAtOnce(t *testing.T, ctx context.Context, s *eventstore.Store, prefix string, runs, appends, per int) {
	t.Helper()
	heads := make([]eventstore.Head, runs)
	errs := make(chan error, runs)
	var wg sync.WaitGroup
	for r := range runs {
		wg.Go(func() {
			run := prefix + strconv.Itoa(r)
			var h eventstore.Head
			for n := 0; n < appends; n++ {
				evs := make([]event.Event, per)
				for i := range evs {
					evs[i] = ev(event.ApprovalReceived, n*per+i+1)
				}
				var err error
				if h, err = s.Append(ctx, run, h, evs...); err != nil {
					errs <- fmt.Errorf("run %s append %d: %w", run, n+1, err)
					return
				}
			}
			heads[r] = h
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for r := range runs {
		run := prefix + strconv.Itoa(r)
		evs, h, err := s.Read(ctx, run)
		require.NoError(t, err)
		requireJournal(t, run, evs, per*appends)
		require.Equal(t, heads[r], h, "run %s: the head its last append returned", run)
	}
}

// TestGroupCommitIsAllOrNothing: a batch with one append whose fence no
// longer holds stores nothing and fails every append in it; published
// alone, the others land and the stale one gets its conflict.
func TestGroupCommitIsAllOrNothing(t *testing.T) {
	t.Parallel()
	s := strictStore(t)
	ctx := timeout(t, time.Minute)
	// run_stale already has a message: an append fenced on an empty
	// subject is stale.
	_, err := s.Append(ctx, "run_stale", eventstore.Head{}, ev(event.ApprovalReceived, 1))
	require.NoError(t, err)
	events, err := s.JetStream().Stream(ctx, eventstore.EventsStream)
	require.NoError(t, err)
	before, err := events.Info(ctx)
	require.NoError(t, err)

	apps, err := s.FirstAppends("run_a", "run_b", "run_stale", "run_c", "run_d")
	require.NoError(t, err)
	s.CommitAsBatch(ctx, apps)
	for _, a := range apps {
		_, err := a.Result()
		require.ErrorIs(t, err, eventstore.ErrGroupFailed, "%s", a.Run)
	}
	after, err := events.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, before.State.Msgs, after.State.Msgs, "a failed batch stored nothing")

	for _, a := range apps {
		h, err := s.PublishAlone(ctx, a)
		if a.Run == "run_stale" {
			require.ErrorIs(t, err, eventstore.ErrConflict)
			continue
		}
		require.NoError(t, err, "%s", a.Run)
		require.Equal(t, uint64(1), h.Seq)
	}
}

// TestGroupCommitLostAck: a batch that landed and whose ack the writers
// never saw is recognised when each append is tried again: the retry gets
// the head of the message the batch stored, and nothing is written twice.
func TestGroupCommitLostAck(t *testing.T) {
	t.Parallel()
	s := strictStore(t)
	ctx := timeout(t, time.Minute)
	apps, err := s.FirstAppends("run_a", "run_b", "run_c", "run_d")
	require.NoError(t, err)
	s.CommitAsBatch(ctx, apps)
	seqs := make([]uint64, len(apps))
	for i, a := range apps {
		seqs[i], err = a.Result()
		require.NoError(t, err)
		if i > 0 {
			require.Equal(t, seqs[i-1]+1, seqs[i], "a batch's messages are stored one after another")
		}
	}
	events, err := s.JetStream().Stream(ctx, eventstore.EventsStream)
	require.NoError(t, err)
	before, err := events.Info(ctx)
	require.NoError(t, err)
	for i, a := range apps {
		h, err := s.PublishAlone(ctx, a)
		require.NoError(t, err)
		require.Equal(t, seqs[i], h.StreamSeq, "%s", a.Run)
		require.Equal(t, event.Hash(a.Body), h.Hash)
	}
	after, err := events.Info(ctx)
	require.NoError(t, err)
	require.Equal(t, before.State.Msgs, after.State.Msgs, "the retries wrote nothing")
	// Stored: the body as sent, under its own message id.
	m, err := events.GetMsg(ctx, seqs[1])
	require.NoError(t, err)
	require.Equal(t, apps[1].Body, m.Data)
	require.Equal(t, "run_b:1", m.Header.Get(jetstream.MsgIDHeader))
}

// TestGroupCommitGivesUpWithItsCaller: an append whose caller gives up
// while it is queued leaves the queue, and the group goes on without it.
func TestGroupCommitGivesUpWithItsCaller(t *testing.T) {
	t.Parallel()
	s := strictStore(t)
	apps, err := s.FirstAppends("run_gone", "run_kept")
	require.NoError(t, err)
	s.HoldGroup()
	ctx, cancel := context.WithCancel(t.Context())
	gone := make(chan error, 1)
	go func() { gone <- s.PublishQueued(ctx, apps[0]) }()
	require.Eventually(t, func() bool { n, _ := s.GroupQueue(); return n == 1 }, 5*time.Second, time.Millisecond)
	kept := make(chan error, 1)
	go func() { kept <- s.PublishQueued(t.Context(), apps[1]) }()
	require.Eventually(t, func() bool { n, _ := s.GroupQueue(); return n == 2 }, 5*time.Second, time.Millisecond)
	cancel()
	require.ErrorIs(t, <-gone, context.Canceled)
	n, _ := s.GroupQueue()
	require.Equal(t, 1, n)
	s.ReleaseGroup() // the write "in progress" ends and hands the group on
	require.NoError(t, <-kept)
	_, _, err = s.Read(t.Context(), "run_gone")
	require.ErrorIs(t, err, eventstore.ErrRunNotFound, "the abandoned append was never written")
	_, _, err = s.Read(t.Context(), "run_kept")
	require.NoError(t, err)
	n, writing := s.GroupQueue()
	require.Zero(t, n)
	require.False(t, writing)
}

// TestGroupCommitOnACluster: on a 3-node cluster (R3, where a stream's
// writes go through raft rather than an fsync per message), strict mode's
// atomic batches commit as on one server, and every journal reads back
// whole with the heads its appends returned.
func TestGroupCommitOnACluster(t *testing.T) {
	t.Parallel()
	ctx := timeout(t, 2*time.Minute)
	s, _ := clusterStore(t, ctx, eventstore.WithPacking(true))
	const runs, appends = 32, 10
	appendAtOnce(t, ctx, s, "run_cluster_", runs, appends, 1)
	batches, batched, _ := s.GroupStats()
	t.Logf("%d appends on R3: %d atomic batches holding %d of them", runs*appends, batches, batched)
	require.Positive(t, batches, "no append was group-committed")
}

// clusterStore sets PAL up on three nats-server processes (R3) and opens a
// store there, once every stream has a current leader.
func clusterStore(t *testing.T, ctx context.Context, opts ...eventstore.Option) (*eventstore.Store, jetstream.JetStream) {
	t.Helper()
	c := testenv.NATSClusterProcesses(t, 3, testenv.FastRaft())
	js, err := jetstream.New(c.Conn(t))
	require.NoError(t, err)
	require.NoError(t, eventstore.Setup(ctx, js, eventstore.Config{Replicas: 3}))
	for _, st := range []string{eventstore.EventsStream, eventstore.BlobRefsStream, eventstore.BlobStream} {
		require.NoError(t, c.WaitCurrent(ctx, js, st))
	}
	s, err := eventstore.Open(ctx, js, opts...)
	require.NoError(t, err)
	return s, js
}
