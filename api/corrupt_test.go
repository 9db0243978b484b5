package api_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
)

// TestCorruptJournalReadsFailed: a run whose journal holds a message that
// is not a sound continuation answers 200 with the failed view on GET, not
// 503; an approval is refused as for any ended run, and seals the journal.
func TestCorruptJournalReadsFailed(t *testing.T) {
	t.Parallel()
	b := setup(t, withoutJournalCheck())
	runID := b.Start(t, `{"name":"gate","nodes":[{"id":"start","type":"trigger"},{"id":"ok","type":"approval","data":{}}],
		"edges":[{"from":"start","to":"ok"}]}`, `{}`)
	_, err := b.JS.Publish(context.Background(), eventstore.EventsSubject(runID), []byte(`{"v":1,"oops"`))
	require.NoError(t, err)

	r := b.get(t, "/v1/runs/"+runID)
	require.Equal(t, 200, r.status, "body: %s", r.body)
	v := r.json(t)
	require.Equal(t, "failed", v["status"])
	require.Equal(t, event.CodeJournalCorrupt, v["error_code"])
	require.Contains(t, v["error"], "the journal is corrupt at seq 2")

	r = b.post(t, "/v1/runs/"+runID+"/approve", `{"step_id":"ok","decision":"approve"}`)
	require.Equal(t, 409, r.status, "body: %s", r.body)
	evs, _, err := b.Store.Read(context.Background(), runID)
	require.NoError(t, err, "the journal is sealed")
	last := evs[len(evs)-1]
	require.Equal(t, event.RunFailed, last.Kind)
	require.Equal(t, uint64(2), last.Seq)

	r = b.get(t, "/v1/runs/"+runID)
	require.Equal(t, 200, r.status)
	require.Equal(t, event.CodeJournalCorrupt, r.json(t)["error_code"])
}
