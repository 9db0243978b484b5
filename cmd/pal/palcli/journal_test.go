package palcli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/paltest/testenv"
)

// stackBundle is a bundle over a stack made with opts, with a quiet worker.
func stackBundle(t *testing.T, opts ...paltest.Option) *bundle {
	t.Helper()
	b := &bundle{Stack: paltest.New(t, opts...), bin: testenv.PalBinary(t), dir: t.TempDir()}
	b.Worker(t, "w1", paltest.WorkerLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	return b
}

// stored is every message on a run's subject, as stored.
func stored(t *testing.T, b *bundle, runID string) [][]byte {
	t.Helper()
	var out [][]byte
	require.NoError(t, b.Store.Scan(context.Background(), runID, 0, 0, func(_ uint64, body []byte) {
		out = append(out, append([]byte(nil), body...))
	}))
	return out
}

// TestRunExportVerify exports a run written in strict mode (packed
// messages) and verifies it offline; a one-byte change is found and named.
func TestRunExportVerify(t *testing.T) {
	t.Parallel()
	b := stackBundle(t, paltest.Strict())
	id := b.Start(t, paltest.EchoChain(3), `{}`)
	require.Equal(t, event.RunSucceeded, b.WaitEnd(t, id).Kind)

	r := b.pal(t, nil, "run", "export", id)
	require.Equal(t, 0, r.code, "%s", r)
	msgs := stored(t, b, id)
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	require.Len(t, lines, len(msgs), "one line per message")
	packed := 0
	for i, l := range lines {
		require.Equal(t, string(msgs[i]), l, "line %d is the stored bytes", i+1)
		if strings.HasPrefix(l, "[") {
			packed++
		}
	}
	require.NotZero(t, packed, "packed messages stay one line each")

	path := b.file(t, "run.jsonl", r.stdout)
	r = b.pal(t, nil, "run", "verify", path)
	require.Equal(t, 0, r.code, "%s", r)
	require.Contains(t, r.stdout, fmt.Sprintf("run %s: ", id))
	require.Contains(t, r.stdout, "head sha256 "+event.Hash(msgs[len(msgs)-1]))

	// One byte of line 2 changed: the message after it no longer chains.
	changed := append([]string(nil), lines...)
	i := strings.Index(changed[1], `"ts":"20`)
	require.Positive(t, i)
	changed[1] = changed[1][:i+6] + "3" + changed[1][i+7:]
	evs, err := event.Decode(msgs[2])
	require.NoError(t, err)
	r = b.pal(t, nil, "run", "verify", b.file(t, "changed.jsonl", strings.Join(changed, "\n")+"\n"))
	require.Equal(t, 1, r.code, "%s", r)
	require.Contains(t, r.stderr, fmt.Sprintf("line 3: run %s: journal corrupt at seq %d: prev", id, evs[0].Seq))
	require.Contains(t, r.stderr, "is not the sha256 of the message before it")
}

// TestCorruptRunInTheCLI: a run whose journal took a forged message reads
// failed (journal_corrupt) in pal run get, ends pal run watch with exit 1,
// and its export does not verify, naming the seq.
func TestCorruptRunInTheCLI(t *testing.T) {
	t.Parallel()
	b := stackBundle(t, paltest.NoJournalCheck())
	id := b.Start(t, `{"name":"gate","nodes":[{"id":"start","type":"trigger"},{"id":"ok","type":"approval","data":{}}],
		"edges":[{"from":"start","to":"ok"}]}`, `{}`)
	waiting := b.WaitFor(t, id, "the approval wait", func(ev event.Event) bool { return ev.Kind == event.StepWaiting })
	msgs := stored(t, b, id)
	forged := event.MustNew(event.StepCompleted, "ok", 1, event.StepCompletedData{Output: json.RawMessage(`{"approved":true}`)})
	forged.RunID, forged.Seq, forged.Prev, forged.WorkerID, forged.TS = id, waiting.Seq+1, event.Hash(msgs[len(msgs)-1]), "mallory", waiting.TS
	body, err := event.Encode(forged)
	require.NoError(t, err)
	_, err = b.JS.Publish(context.Background(), eventstore.EventsSubject(id), body)
	require.NoError(t, err)

	r := b.pal(t, nil, "run", "get", id, "--json")
	require.Equal(t, 0, r.code, "%s", r)
	v := decodeJSON[map[string]any](t, r.stdout)
	require.Equal(t, "failed", v["status"])
	require.Equal(t, event.CodeJournalCorrupt, v["error_code"])
	r = b.pal(t, nil, "run", "get", id)
	require.Equal(t, 0, r.code, "%s", r)
	require.Regexp(t, `(?m)^Status\s+failed$`, r.stdout)
	require.Contains(t, r.stdout, fmt.Sprintf("the journal is corrupt at seq %d", forged.Seq))

	r = b.pal(t, nil, "run", "watch", id)
	require.Equal(t, 1, r.code, "%s", r)
	require.Contains(t, r.stderr, "journal corrupt")

	r = b.pal(t, nil, "run", "export", id)
	require.Equal(t, 0, r.code, "%s", r)
	r = b.pal(t, nil, "run", "verify", b.file(t, "run.jsonl", r.stdout))
	require.Equal(t, 1, r.code, "%s", r)
	require.Contains(t, r.stderr, fmt.Sprintf(`journal corrupt at seq %d: step_completed by "mallory", but the run is driven by "w1"`, forged.Seq))
}
