package projections

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/readmodel"
)

func TestCleanJSON(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in, want string
		same           bool // returned unchanged, without decoding
	}{
		{"plain", `{"a":[1,2.50,"x"],"b":null}`, `{"a":[1,2.50,"x"],"b":null}`, true},
		{"escapes jsonb takes", `{"a":"\u003c\u00e9\n\\u0000"}`, `{"a":"\u003c\u00e9\n\\u0000"}`, true},
		{"valid surrogate pair", `"\ud83d\ude00"`, `"😀"`, false},
		{"NUL", `{"a":"x\u0000y"}`, `{"a":"x\ufffdy"}`, false},
		{"NUL in a key", `{"k\u0000":1}`, `{"k\ufffd":1}`, false},
		{"lone surrogate", `["\udc00"]`, `["\ufffd"]`, false},
		{"invalid UTF-8", "\"a\xffb\"", `"a\ufffdb"`, false},
		{"big number kept", `{"n":123456789012345678901234567890,"s":"\u0000"}`, `{"n":123456789012345678901234567890,"s":"\ufffd"}`, false},
	} {
		got := cleanJSON(json.RawMessage(tc.in))
		require.JSONEq(t, tc.want, string(got), tc.name)
		if tc.same {
			require.Equal(t, tc.in, string(got), tc.name)
		}
	}
	require.Nil(t, cleanJSON(nil))
	require.Equal(t, "a\uFFFDb\uFFFD", cleanText("a\x00b\xff"))
	require.Equal(t, "plain", cleanText("plain"))
}

func TestStateCache(t *testing.T) {
	t.Parallel()
	c := newStateCache(2)
	a, b, d := &cacheEntry{st: &engine.RunState{}}, &cacheEntry{st: &engine.RunState{}}, &cacheEntry{st: &engine.RunState{}}
	c.Add("a", a)
	c.Add("b", b)
	got, _ := c.Get("a") // a is now the most recent
	require.Same(t, a, got)
	c.Add("d", d) // evicts b
	_, ok := c.Get("b")
	require.False(t, ok)
	got, _ = c.Get("a")
	require.Same(t, a, got)
	got, _ = c.Get("d")
	require.Same(t, d, got)
	c.Remove("a")
	_, ok = c.Get("a")
	require.False(t, ok)
	require.Equal(t, 1, c.Len())
	one := newStateCache(0)
	one.Add("a", a)
	one.Add("b", b)
	require.Equal(t, 1, one.Len(), "a size below 1 holds one state")
}

// journal builds a run's events with seq and timestamps filled in.
func journal(runID string, evs ...event.Event) []event.Event {
	ts := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	for i := range evs {
		evs[i].V, evs[i].RunID, evs[i].Seq, evs[i].WorkerID = event.Version, runID, uint64(i+1), "w"
		evs[i].TS = ts.Add(time.Duration(i) * time.Millisecond)
	}
	return evs
}

// deliveryJournal is a run that retries a webhook, delivers it, and
// succeeds: it touches runs, steps and receipts rows.
func deliveryJournal(runID string) []event.Event {
	key := func(a int) string { return event.IdempotencyKey(runID, "notify", a) }
	m := event.MustNew
	return journal(runID,
		m(event.RunCreated, "", 0, event.RunCreatedData{WorkflowName: "w", Input: json.RawMessage(`{"x":1}`)}),
		m(event.RunResumed, "", 0, event.RunResumedData{Worker: "w", ResumeCount: 1}),
		m(event.StepStarted, "notify", 1, event.StepStartedData{NodeID: "notify", NodeType: "connector", IdempotencyKey: key(1)}),
		m(event.SideEffectClaimed, "notify", 1, event.SideEffectClaimedData{IdempotencyKey: key(1), Connector: "webhook", Target: "h"}),
		m(event.StepRetrying, "notify", 1, event.StepRetryingData{Attempt: 2, Of: 3, Error: "503", Class: "connector"}),
		m(event.StepStarted, "notify", 2, event.StepStartedData{NodeID: "notify", NodeType: "connector", IdempotencyKey: key(2)}),
		m(event.SideEffectClaimed, "notify", 2, event.SideEffectClaimedData{IdempotencyKey: key(2), Connector: "webhook", Target: "h"}),
		m(event.SideEffectDelivered, "notify", 2, event.SideEffectDeliveredData{IdempotencyKey: key(2), Status: 200}),
		m(event.StepCompleted, "notify", 2, event.StepCompletedData{Output: json.RawMessage(`{"status":200}`), Delivery: event.DeliveryDelivered,
			Usage: &event.Usage{InputTokens: 1, OutputTokens: 2, TotalTokens: 3, CostUSD: 0.5}}),
		m(event.RunSucceeded, "", 0, event.RunSucceededData{Output: json.RawMessage(`{"status":200}`)}),
	)
}

// rowsOf is the batch of every row of the state evs fold to.
func rowsOf(t *testing.T, evs []event.Event) *batch {
	t.Helper()
	st, err := engine.Fold(evs)
	require.NoError(t, err)
	f := &folder{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	b := &batch{lastStreamSeq: 1}
	f.addRows(b, st, 0, true, map[string]bool{})
	return b
}

// tableRows returns the runs, steps and receipts rows of a run, as JSON.
func tableRows(t *testing.T, db interface {
	Query(context.Context, string, ...any) (pgx.Rows, error)
}, runID string) []string {
	t.Helper()
	var out []string
	for _, sql := range []string{
		"SELECT to_jsonb(x)::text FROM runs x WHERE run_id = $1",
		"SELECT to_jsonb(x)::text FROM steps x WHERE run_id = $1 ORDER BY step_id, attempt",
		"SELECT to_jsonb(x)::text FROM side_effect_receipts x WHERE run_id = $1 ORDER BY step_id, attempt",
	} {
		rows, err := db.Query(context.Background(), sql, runID)
		require.NoError(t, err)
		vals, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		out = append(out, vals...)
	}
	return out
}

// TestOlderStateNeverOverwritesNewer writes the rows of every prefix of a
// journal: in order each write moves the rows forward, and once the whole
// journal is written no older state changes them, whatever the order.
func TestOlderStateNeverOverwritesNewer(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t).Pool(t)
	ctx := context.Background()
	_, err := Migrate(ctx, pool)
	require.NoError(t, err)
	w := newWriter("")
	opts := writeOpts{projector: "test", lock: true}
	evs := deliveryJournal("run_forward")

	// In order: after each prefix the run's status is that prefix's.
	for k := 1; k <= len(evs); k++ {
		require.NoError(t, w.write(ctx, pool, rowsOf(t, evs[:k]), opts))
		st, err := engine.Fold(evs[:k])
		require.NoError(t, err)
		var status string
		var last int64
		require.NoError(t, pool.QueryRow(ctx, "SELECT status, last_seq FROM runs WHERE run_id = 'run_forward'").Scan(&status, &last))
		require.Equal(t, string(st.Status), status, "after seq %d", k)
		require.Equal(t, int64(k), last)
	}
	final := tableRows(t, pool, "run_forward")
	require.Len(t, final, 1+2+2, "a run, two attempts, two receipts")

	// Then every older state, shuffled: nothing changes.
	order := rand.Perm(len(evs) - 1)
	for _, i := range order {
		require.NoError(t, w.write(ctx, pool, rowsOf(t, evs[:i+1]), opts))
		require.Equal(t, final, tableRows(t, pool, "run_forward"), "after writing the state at seq %d", i+1)
	}

	// Written newest first into an empty table, the same rows result.
	evs2 := deliveryJournal("run_backward")
	for k := len(evs2); k >= 1; k-- {
		require.NoError(t, w.write(ctx, pool, rowsOf(t, evs2[:k]), opts))
	}
	require.Len(t, tableRows(t, pool, "run_backward"), len(final))
	var status string
	require.NoError(t, pool.QueryRow(ctx, "SELECT status FROM runs WHERE run_id = 'run_backward'").Scan(&status))
	require.Equal(t, "succeeded", status)
}

// TestReceiptKeyClaimedTwiceDoesNotStopWrites gives two attempts of two
// runs the same idempotency key (only a broken journal can): the second
// receipt is left out instead of failing the batch on the unique key.
func TestReceiptKeyClaimedTwiceDoesNotStopWrites(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t).Pool(t)
	ctx := context.Background()
	_, err := Migrate(ctx, pool)
	require.NoError(t, err)
	w := newWriter("")
	r := readmodel.ReceiptRow{RunID: "run_a", StepID: "s", Attempt: 1, IdempotencyKey: "same", Status: readmodel.ReceiptClaimed, LastSeq: 3}
	require.NoError(t, w.write(ctx, pool, &batch{receipts: []readmodel.ReceiptRow{r}, lastStreamSeq: 1}, writeOpts{projector: "t"}))
	r2 := r
	r2.RunID = "run_b"
	require.NoError(t, w.write(ctx, pool, &batch{receipts: []readmodel.ReceiptRow{r2}, lastStreamSeq: 2}, writeOpts{projector: "t"}))
	var runs []string
	rows, err := pool.Query(ctx, "SELECT run_id FROM side_effect_receipts")
	require.NoError(t, err)
	runs, err = pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"run_a"}, runs)
}
