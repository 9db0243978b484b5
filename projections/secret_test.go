package projections_test

import (
	"bytes"
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

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/projections"
)

// syncBuffer is a log sink shared by the worker's and projector's loggers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// TestSecretsInURLsAreNeverStored runs the http tool and a webhook with a
// secret in the URL's userinfo and query and in a header: the receivers
// get the secret, and it appears in no event of the journal, no log line
// and no row of any projection table, whether the step succeeds or fails
// (an error that quotes the URL, a receiver that echoes it).
func TestSecretsInURLsAreNeverStored(t *testing.T) {
	t.Parallel()
	const secret = "SECRET123"
	b := setup(t)
	var mu sync.Mutex
	var got []string // what the receivers saw: query and Authorization
	handler := func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.URL.RawQuery, r.Header.Get("Authorization"))
		mu.Unlock()
		switch {
		case strings.HasSuffix(r.URL.Path, "/deny"):
			http.Error(w, "denied "+r.URL.String(), http.StatusForbidden)
		case strings.HasSuffix(r.URL.Path, "/bad"):
			http.Error(w, "bad request for "+r.URL.String(), http.StatusBadRequest)
		default:
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"ok":true}`))
		}
	}
	srv := httptest.NewServer(http.HandlerFunc(handler))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")

	logs := &syncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	p := b.projector(t, projections.Config{Logger: logger})
	b.Worker(t, "w1", paltest.WorkerLogger(logger), paltest.Secrets(map[string]string{"API_KEY": secret, "PW": "pw-" + secret}),
		paltest.SecretHosts(map[string]string{"API_KEY": host, "PW": host}))

	flow := func(name, toolPath, hookPath string) string {
		url := func(path string) string {
			return fmt.Sprintf("http://user:{{secrets.PW}}@%s%s?api_key={{secrets.API_KEY}}&b=2", host, path)
		}
		return fmt.Sprintf(`{"name":%q,"nodes":[{"id":"start","type":"trigger"},
			{"id":"get","type":"tool","data":{"tool":"http","input":{"url":%q,"headers":{"X-Api-Key":"{{ secrets.API_KEY }}"}}}},
			{"id":"hook","type":"connector","data":{"kind":"webhook","url":%q,"headers":{"Authorization":"Bearer {{secrets.API_KEY}}"},"body":{"x":1}}}],
			"edges":[{"from":"start","to":"get"},{"from":"get","to":"hook"}]}`, name, url(toolPath), url(hookPath))
	}
	ok := b.Start(t, flow("ok", "/tool", "/hook"), `{}`)
	toolFails := b.Start(t, flow("tool-fails", "/deny", "/hook"), `{}`)
	hookFails := b.Start(t, flow("hook-fails", "/tool", "/bad"), `{}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, ok).Kind)
	require.Equal(t, event.RunFailed, b.WaitEnd(t, toolFails).Kind)
	require.Equal(t, event.RunFailed, b.WaitEnd(t, hookFails).Kind)
	caughtUp(t, p)

	// The receivers got the real values.
	mu.Lock()
	seen := strings.Join(got, "\n")
	mu.Unlock()
	require.Contains(t, seen, "api_key="+secret+"&b=2")
	require.Contains(t, seen, "Bearer "+secret)
	require.Contains(t, seen, "Basic ") // user:pw-SECRET123

	var journal bytes.Buffer
	for _, id := range []string{ok, toolFails, hookFails} {
		for _, ev := range readJournalOf(t, b, id) {
			raw, err := json.Marshal(ev)
			require.NoError(t, err)
			journal.Write(raw)
			journal.WriteByte('\n')
		}
	}
	require.NotContains(t, journal.String(), secret, "journal")
	require.Contains(t, journal.String(), "{{secrets.API_KEY}}", "the journal keeps the reference")
	require.Contains(t, journal.String(), `"target":"http://REDACTED@`+host+`/hook?api_key=REDACTED\u0026b=REDACTED"`)
	require.NotContains(t, logs.String(), secret, "logs")
	require.Contains(t, logs.String(), "step failed", "the failures were logged")

	ctx := context.Background()
	rows, err := b.pool.Query(ctx, `SELECT table_name FROM information_schema.tables WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'`)
	require.NoError(t, err)
	var tables []string
	for rows.Next() {
		var name string
		require.NoError(t, rows.Scan(&name))
		tables = append(tables, name)
	}
	require.NoError(t, rows.Err())
	require.Subset(t, tables, []string{"runs", "steps", "journal_events", "side_effect_receipts"})
	var errs []string
	for _, table := range tables {
		var dump string
		require.NoError(t, b.pool.QueryRow(ctx, fmt.Sprintf(`SELECT coalesce(string_agg(row_to_json(t)::text, E'\n'), '') FROM %q t`, table)).Scan(&dump))
		require.NotContains(t, dump, secret, "table %s", table)
		if table == "steps" || table == "runs" {
			errs = append(errs, dump)
		}
	}
	all := strings.Join(errs, "\n")
	require.Contains(t, all, "/deny?api_key=REDACTED\u0026b=REDACTED: HTTP 403", "steps.error names the URL, masked")
	require.Contains(t, all, "bad request for /bad?api_key=REDACTED", "an echoed secret is masked")
}
