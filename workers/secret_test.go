package workers_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/workers"
	"github.com/palrun/pal/workflow"
)

// receiver is a local HTTP receiver that remembers what reached it.
type receiver struct {
	*httptest.Server
	mu  sync.Mutex
	got []string // each request's path, query and X-Key header
}

func newReceiver(t *testing.T, h http.HandlerFunc) *receiver {
	r := &receiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.got = append(r.got, req.URL.RequestURI()+" "+req.Header.Get("X-Key")+" "+req.Header.Get("Referer"))
		r.mu.Unlock()
		if h != nil {
			h(w, req)
		}
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) seen() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.got...)
}

// host is the receiver's host:port.
func (r *receiver) host() string { return strings.TrimPrefix(r.URL, "http://") }

// secretFlow sends {{secrets.name}} to url: in the query and a header of
// the http tool (step get), or of a webhook (step hook).
func secretFlow(kind, name, url string) string {
	target := url + "?k={{secrets." + name + "}}"
	node := fmt.Sprintf(`{"id":"get","type":"tool","data":{"tool":"http","input":{"url":%q,"headers":{"X-Key":"{{secrets.%s}}"}},"retry":{"maxAttempts":3}}}`, target, name)
	if kind == "webhook" {
		node = fmt.Sprintf(`{"id":"get","type":"connector","data":{"kind":"webhook","url":%q,"headers":{"X-Key":"{{secrets.%s}}"},"body":{"x":1},"retry":{"maxAttempts":3}}}`, target, name)
	}
	return fmt.Sprintf(`{"name":"send-%s","nodes":[{"id":"start","type":"trigger"},%s],"edges":[{"from":"start","to":"get"}]}`, kind, node)
}

// TestSecretGoesOnlyToItsHosts: a secret bound to one receiver (host and
// port) is sent there; a workflow naming it towards another receiver, by
// the http tool, a webhook or a redirect, fails its step without a retry
// and without sending: the other receiver sees nothing. A secret bound to
// no host, and one in a run of no deployed workflow, are sent nowhere.
// No error, event or log holds the value.
func TestSecretGoesOnlyToItsHosts(t *testing.T) {
	t.Parallel()
	const secret = "s3cr3t-value-42"
	b := setup(t)
	logs := paltest.NewLogCapture()
	other := newReceiver(t, nil)
	bound := newReceiver(t, func(w http.ResponseWriter, req *http.Request) {
		if req.URL.Path == "/away" { // a redirect to the other receiver
			http.Redirect(w, req, other.URL+"/landed", http.StatusFound)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ok":true}`))
	})
	b.Worker(t, "w1", paltest.Secrets(map[string]string{"DEMO": secret, "LOOSE": secret}),
		paltest.SecretHosts(map[string]string{"DEMO": "api.example.com, " + bound.host()}),
		paltest.WorkerLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))

	for _, kind := range []string{"http", "webhook"} {
		ok := b.Start(t, secretFlow(kind, "DEMO", bound.URL+"/in"), `{}`)
		require.Equal(t, event.RunSucceeded, b.WaitEnd(t, ok).Kind, kind)
	}
	got := bound.seen()
	require.Len(t, got, 2)
	for _, g := range got {
		require.Equal(t, "/in?k="+secret+" "+secret+" ", g, "the bound receiver got the secret")
	}

	failed := func(runID string) event.StepFailedData {
		t.Helper()
		require.Equal(t, event.RunFailed, b.WaitEnd(t, runID).Kind)
		evs := b.Events(t, runID)
		require.Empty(t, find(evs, event.StepRetrying, "get"), "a refusal is not retried")
		require.Empty(t, find(evs, event.SideEffectClaimed, "get"), "nothing was claimed for sending")
		return data[event.StepFailedData](t, find(evs, event.StepFailed, "get")[0])
	}
	elsewhere := fmt.Sprintf("secret DEMO may not be sent to %s: PAL_SECRET_DEMO_HOSTS binds it to api.example.com, %s only; nothing was sent",
		other.host(), bound.host())
	for _, kind := range []string{"http", "webhook"} {
		f := failed(b.Start(t, secretFlow(kind, "DEMO", other.URL+"/in"), `{}`))
		require.Contains(t, f.Error, elsewhere, kind)
	}
	f := failed(b.Start(t, secretFlow("http", "DEMO", bound.URL+"/away"), `{}`))
	require.Contains(t, f.Error, "redirect: "+elsewhere, "a redirect to another host is not followed")
	require.Len(t, bound.seen(), 3, "the bound receiver got the request that redirected")
	f = failed(b.Start(t, secretFlow("http", "LOOSE", bound.URL+"/in"), `{}`))
	require.Contains(t, f.Error, "secret LOOSE may not be sent to "+bound.host()+": no hosts are bound to it (set PAL_SECRET_LOOSE_HOSTS")
	require.Empty(t, other.seen(), "the other receiver saw nothing")

	// A run of no deployed workflow (one created before workflows were
	// deployed) resolves no secret, even towards a bound host.
	wf, err := workflow.Parse([]byte(secretFlow("http", "DEMO", bound.URL+"/in")))
	require.NoError(t, err)
	ev, err := engine.RunCreated(engine.Creation{Workflow: wf, Input: json.RawMessage(`{}`), By: "test"})
	require.NoError(t, err)
	old := event.NewRunID()
	_, queued, err := b.Store.AppendStart(context.Background(), "", old, ev, "start")
	require.NoError(t, err)
	require.NoError(t, queued(context.Background()))
	f = failed(old)
	require.Contains(t, f.Error, "resolves only in a run of a deployed workflow, and run "+old+" names none")
	require.Len(t, bound.seen(), 3, "nothing more reached the bound receiver")

	for _, id := range []string{old} {
		for _, ev := range b.Events(t, id) {
			require.NotContains(t, string(ev.Data), secret)
		}
	}
	require.NotContains(t, logs.String(), secret, "logs")
}

func TestParseSecretHosts(t *testing.T) {
	t.Parallel()
	hosts, err := workers.ParseSecretHosts(" API.example.com. , hooks.example.com:8443,[::1]:8080, 10.0.0.1 ,[fe80::1], ")
	require.NoError(t, err)
	require.Equal(t, []workers.SecretHost{{Host: "api.example.com"}, {Host: "hooks.example.com", Port: "8443"},
		{Host: "::1", Port: "8080"}, {Host: "10.0.0.1"}, {Host: "fe80::1"}}, hosts)
	none, err := workers.ParseSecretHosts("")
	require.NoError(t, err)
	require.Empty(t, none, "no host: sent nowhere")
	for in, want := range map[string]string{
		"https://api.example.com":  "want a host name",
		"api.example.com/path":     "want a host name",
		"*.example.com":            "want a host name",
		"api.example.com:0":        `port "0"`,
		"api.example.com:70000":    `port "70000"`,
		"api.example.com:08":       `port "08"`,
		"a..b":                     "want a host name",
		"ok.com,bad host":          `host 2 "bad host"`,
		strings.Repeat("a,", 65):   "more than 64 hosts",
		"api.example.com:https":    `port "https"`,
		"[::1]:8080:9":             "want a host name",
		"user@api.example.com":     "want a host name",
		"api.example.com:8080:80a": "want a host name",
	} {
		_, err := workers.ParseSecretHosts(in)
		require.ErrorContains(t, err, want, in)
	}
	require.NoError(t, workers.CheckSecretHosts([]string{"PAL_SECRET_A_HOSTS=a.example", "PAL_SECRET_A=x y", "HOME=/"}))
	require.ErrorContains(t, workers.CheckSecretHosts([]string{"PAL_SECRET_A_HOSTS=https://a"}), "PAL_SECRET_A_HOSTS: host 1")
}
