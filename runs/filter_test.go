package runs_test

import (
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/readmodel"
	"github.com/palrun/pal/runs"
)

func TestParseRunFilter(t *testing.T) {
	t.Parallel()
	cursor := readmodel.RunRow{RunID: "run_a", CreatedAt: time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)}.Cursor()
	f, err := runs.ParseRunFilter(url.Values{
		"status": {"failed"}, "workflow": {"triage"}, "schedule": {"nightly"}, "label": {"customer=acme", "note=a=b", "empty="},
		"since": {"2026-03-01T00:00:00Z"}, "until": {"2026-03-02T01:00:00+01:00"}, "error_code": {"step_failed"},
		"q": {"100% done"}, "limit": {"7"}, "before": {cursor}, "thread": {"support-42"},
	})
	require.NoError(t, err)
	require.Equal(t, readmodel.RunFilter{Status: engine.StatusFailed, Workflow: "triage", Schedule: "nightly",
		Labels: map[string]string{"customer": "acme", "note": "a=b", "empty": ""},
		Since:  time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC), Until: time.Date(2026, 3, 2, 1, 0, 0, 0, time.FixedZone("", 3600)),
		ErrorCode: "step_failed", Text: "100% done", Limit: 7, Before: cursor, Thread: "support-42"}, f)

	f, err = runs.ParseRunFilter(url.Values{})
	require.NoError(t, err)
	require.Equal(t, readmodel.RunFilter{Limit: readmodel.DefaultListLimit}, f, "no filter: every run, a default page")

	var seventeen []string
	for i := range 17 {
		seventeen = append(seventeen, "k"+strings.Repeat("x", i)+"=v")
	}
	for _, tc := range []struct {
		q     url.Values
		field string
		msg   string
	}{
		{url.Values{"sort": {"asc"}}, "sort", "unknown query parameter (want status, workflow, queue, schedule, label, thread, since, until, error_code, q, limit, before)"},
		{url.Values{"thread": {"a.b"}}, "thread", "invalid thread id"},
		{url.Values{"thread": {""}}, "thread", "empty"},
		{url.Values{"thread": {"a", "b"}}, "thread", "given more than once"},
		{url.Values{"status": {"done"}}, "status", "want one of"},
		{url.Values{"status": {"failed", "queued"}}, "status", "given more than once"},
		{url.Values{"workflow": {strings.Repeat("w", 257)}}, "workflow", "the limit is 256"},
		{url.Values{"queue": {"GPU"}}, "queue", "invalid queue name"},
		{url.Values{"queue": {strings.Repeat("q", 33)}}, "queue", "longer than 32"},
		{url.Values{"schedule": {"a.b"}}, "schedule", "invalid schedule name"},
		{url.Values{"schedule": {strings.Repeat("s", 129)}}, "schedule", "longer than 128"},
		{url.Values{"label": {"customer"}}, "label", "want KEY=VALUE"},
		{url.Values{"label": {"=acme"}}, "label", `label key ""`},
		{url.Values{"label": {"Customer=acme"}}, "label", `label key "Customer"`},
		{url.Values{"label": {"k=" + strings.Repeat("v", 257)}}, "label", "the limit is 256"},
		{url.Values{"label": {"k=a\tb"}}, "label", "control character"},
		{url.Values{"label": {"k=a", "k=b"}}, "label", "given twice"},
		{url.Values{"label": seventeen}, "label", "more than 16 labels"},
		{url.Values{"label": {"k=\xff"}}, "label", "not valid UTF-8"},
		{url.Values{"since": {"2026-03-01"}}, "since", "want an RFC 3339 time"},
		{url.Values{"until": {"tomorrow"}}, "until", "want an RFC 3339 time"},
		{url.Values{"since": {"2026-03-02T00:00:00Z"}, "until": {"2026-03-01T00:00:00Z"}}, "until", "not after since"},
		{url.Values{"since": {"2026-03-01T00:00:00Z"}, "until": {"2026-03-01T00:00:00Z"}}, "until", "not after since"},
		{url.Values{"error_code": {"Step Failed"}}, "error_code", "want an error code"},
		{url.Values{"q": {""}}, "q", "empty"},
		{url.Values{"q": {strings.Repeat("x", runs.MaxSearchBytes+1)}}, "q", "the limit is 200"},
		{url.Values{"q": {"a\x00"}}, "q", "NUL"},
		{url.Values{"limit": {"0"}}, "limit", "from 1 to 1000"},
		{url.Values{"before": {"nonsense"}}, "before", "not a cursor"},
	} {
		_, err := runs.ParseRunFilter(tc.q)
		var ie *runs.InputError
		require.ErrorAs(t, err, &ie, "%v", tc.q)
		require.Equal(t, tc.field, ie.Field, "%v", tc.q)
		require.Contains(t, ie.Msg, tc.msg, "%v", tc.q)
	}
}
