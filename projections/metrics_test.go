package projections_test

import (
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/internal/telemetry"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/projections"
)

// TestProjectorLagMetrics: once a projector has caught up, /metrics
// reports its lag (the age of its last batch, and no message after it)
// and its consumer's pending count read from JetStream.
func TestProjectorLagMetrics(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const name = "pal-projector-lag-test"
	p := b.projector(t, projections.Config{Name: name})
	b.worker(t, "w1")
	runID := b.Start(t, echoChain(5), `{"v":"lag"}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, runID).Kind)
	caughtUp(t, p)

	srv := httptest.NewServer(telemetry.Handler())
	t.Cleanup(srv.Close)
	m := testenv.Scrape(t, srv.URL, nil)
	behind, ok := m.Value("pal_projector_lag_events", "projector="+name)
	require.True(t, ok)
	require.Equal(t, 0.0, behind)
	lag, ok := m.Value("pal_projector_lag_seconds", "projector="+name)
	require.True(t, ok)
	require.GreaterOrEqual(t, lag, 0.0)
	require.Less(t, lag, 60.0)
	pending, ok := m.Value("pal_consumer_pending_messages", "stream="+eventstore.EventsStream, "consumer="+name)
	require.True(t, ok)
	require.Equal(t, 0.0, pending)
	errs, _ := m.Value("pal_consumer_info_errors", "stream="+eventstore.EventsStream, "consumer="+name)
	require.Equal(t, 0.0, errs)
}
