package workers_test

import (
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/internal/egress"
	"github.com/palrun/pal/paltest"
)

// httpFlow is one http tool step that calls url.
func httpFlow(url string) string {
	return fmt.Sprintf(`{"name":"fetch","nodes":[{"id":"start","type":"trigger"},
		{"id":"get","type":"tool","data":{"tool":"http","input":{"url":%q},"retry":{"maxAttempts":3}}}],
		"edges":[{"from":"start","to":"get"}]}`, url)
}

// requireRefused checks that run failed at its first try of step get with
// an egress refusal of class.
func requireRefused(t *testing.T, b *bundle, runID, class string) {
	t.Helper()
	require.Equal(t, event.RunFailed, b.WaitEnd(t, runID).Kind)
	evs := b.Events(t, runID)
	require.Empty(t, find(evs, event.StepRetrying, "get"), "a refusal is not retried")
	failed := data[event.StepFailedData](t, find(evs, event.StepFailed, "get")[0])
	require.Contains(t, failed.Error, "is a "+class+" address")
	require.Contains(t, failed.Error, egress.EnvAllow)
}

// With the worker's default policy the http tool reaches neither loopback
// nor the metadata service.
func TestHTTPToolEgressDefaults(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	t.Cleanup(srv.Close)
	b.Worker(t, "w1", paltest.Egress(nil))

	requireRefused(t, b, b.Start(t, httpFlow(srv.URL+"/x"), `{}`), egress.ClassLoopback)
	require.Zero(t, hits.Load(), "nothing reached the listener")
	// No listener: the refusal comes before any connect, or the error
	// would be a refused or timed-out connection, retried.
	requireRefused(t, b, b.Start(t, httpFlow("http://169.254.169.254/latest/meta-data/"), `{}`), egress.ClassMetadata)
	requireRefused(t, b, b.Start(t, httpFlow("http://[::ffff:127.0.0.1]:1/"), `{}`), egress.ClassLoopback)
}

// An allowed address that redirects to a refused one gets no further: the
// redirect's connection passes the same check.
func TestHTTPToolRedirectToRefusedAddress(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var hits atomic.Int32
	target := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	t.Cleanup(target.Close)
	l, err := net.Listen("tcp", "127.0.0.2:0")
	require.NoError(t, err)
	redirector := httptest.NewUnstartedServer(http.RedirectHandler(target.URL+"/internal", http.StatusFound))
	redirector.Listener = l
	redirector.Start()
	t.Cleanup(redirector.Close)
	p, err := egress.Parse("127.0.0.2/32")
	require.NoError(t, err)
	b.Worker(t, "w1", paltest.Egress(p))

	requireRefused(t, b, b.Start(t, httpFlow(redirector.URL+"/hook"), `{}`), egress.ClassLoopback)
	require.Zero(t, hits.Load())
}

// A secret reference that arrives in data, not in the node's definition,
// is not resolved: the run input cannot send the worker's secrets.
func TestSecretReferenceFromDataIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { hits.Add(1) }))
	t.Cleanup(srv.Close)
	b.Worker(t, "w1", paltest.Secrets(map[string]string{"API_KEY": "k"}))

	runID := b.Start(t, httpFlow(srv.URL+"/?k={{input.k}}"), `{"k":"{{secrets.API_KEY}}"}`)
	require.Equal(t, event.RunFailed, b.WaitEnd(t, runID).Kind)
	failed := data[event.StepFailedData](t, find(b.Events(t, runID), event.StepFailed, "get")[0])
	require.Contains(t, failed.Error, "does not come from the node's definition")
	require.Zero(t, hits.Load())
}
