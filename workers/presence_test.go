package workers_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/workers"
)

// TestProbeInFlightDoesNotDelayTheNext: a peer that holds its probes
// unanswered (frozen, or killed with a probe in its socket) is probed
// again at the next interval all the same, and the first probe after its
// connection closes takes its runs over. Probes are counted, not timed:
// before, a probe in flight kept the next from being sent until its 1 s
// timeout, and a kill in that window took a second to notice.
func TestProbeInFlightDoesNotDelayTheNext(t *testing.T) {
	t.Parallel()
	// A lease that outlives the test: only a takeover frees it.
	b := setup(t, paltest.LeaseTTL(time.Hour))
	ctx := ctxFor(t, 30*time.Second)

	// The peer: presence that never answers, and a run's lease.
	const owner = "frozen/0001"
	peerNC := b.NATS.Conn(t)
	probes := make(chan *nats.Msg, 64)
	_, err := peerNC.ChanSubscribe(eventstore.PresenceSubject(owner), probes)
	require.NoError(t, err)
	require.NoError(t, peerNC.Flush())
	_, err = b.Leases.Announce(ctx, eventstore.Capabilities{Owner: owner})
	require.NoError(t, err)
	runID := event.NewRunID()
	_, err = b.Leases.Acquire(ctx, runID, owner)
	require.NoError(t, err)

	w := workers.New(workers.Config{ID: "prober", Logger: paltest.Logger(t)}, b.Store, b.Leases, nil, nil)
	probe := workers.ProbeByHand(w)
	b.Serve(t, "prober", w)
	// delivered is how many probes reached the peer, once every probe
	// sent so far has.
	got := 0
	delivered := func() int {
		t.Helper()
		require.NoError(t, b.NC.Flush())   // the server has them
		require.NoError(t, peerNC.Flush()) // and the peer has read them
		got += len(probes)
		for len(probes) > 0 {
			<-probes
		}
		return got
	}

	// The worker learns of the peer from its presence entry.
	require.Eventually(t, func() bool { return probe() == 1 }, 10*time.Second, 5*time.Millisecond)
	require.Equal(t, 1, delivered())
	// The first probe is unanswered: the next is sent all the same.
	require.Equal(t, 1, probe(), "a probe in flight kept the next from being sent")
	require.Equal(t, 2, delivered())
	require.Equal(t, 1, probe())
	require.Equal(t, 3, delivered())
	held, err := b.Leases.HeldBy(ctx, owner)
	require.NoError(t, err)
	require.Len(t, held, 1, "a peer that does not answer is not taken over")

	// The peer's connection closes with three probes unanswered.
	peerNC.Close()
	subject := eventstore.PresenceSubject(owner)
	require.Eventually(t, func() bool { return !b.NATS.Server().GlobalAccount().SubscriptionInterest(subject) },
		10*time.Second, 5*time.Millisecond, "the server still has the closed connection's subscription")
	removed := make(chan struct{})
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	go func() {
		_ = b.Leases.WatchPresence(wctx, func(e eventstore.Presence) {
			if e.Token == eventstore.PresenceToken(owner) && e.Owner == "" {
				close(removed)
				stop()
			}
		})
	}()
	require.Equal(t, 1, probe(), "no probe sent to a peer whose connection closed")
	select {
	case <-removed:
	case <-ctx.Done():
		t.Fatal("the first probe after the peer's connection closed did not take it over")
	}
	held, err = b.Leases.HeldBy(ctx, owner)
	require.NoError(t, err)
	require.Empty(t, held, "the departed peer's lease was not revoked")
}
