package workers_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/projections"
	"github.com/palrun/pal/provider"
)

// TestCostLandsInJournalAndTables: `pal run start`, with a price file in
// PAL_PRICES, starts three ai-steps: one on a model of the embedded table,
// one on a model only the file prices, one on a model nobody prices. Its
// run_created journals those prices, and a pal worker whose own PAL_PRICES
// prices the same models otherwise charges each step_completed at the
// journal's prices; the steps and runs tables hold the same numbers; the
// unpriced step and its run are marked cost_unknown.
func TestCostLandsInJournalAndTables(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	ctx := ctxFor(t, 2*time.Minute)
	pg := testenv.Postgres(t)
	pool := pg.Pool(t)
	_, err := projections.Migrate(ctx, pool)
	require.NoError(t, err)
	proj := projections.New(pool, p.Store, projections.Config{})
	require.NoError(t, proj.Start(ctx))
	t.Cleanup(func() { _ = proj.Stop(context.Background()) })

	dir := t.TempDir()
	write := func(name, body string) string {
		path := filepath.Join(dir, name)
		require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
		return path
	}
	creatorPrices := write("creator.json", `{"models":{"house-model":{"input_per_mtok":100,"output_per_mtok":1000}}}`)
	workerPrices := write("worker.json", `{"models":{"house-model":{"input_per_mtok":1,"output_per_mtok":1},
		"gpt-4o":{"input_per_mtok":0,"output_per_mtok":0},"mystery-model":{"input_per_mtok":1,"output_per_mtok":1}}}`)
	p.palWorker(t, "w1", "PAL_PRICES="+workerPrices)

	wf := write("priced.json", `{"name":"priced","nodes":[{"id":"start","type":"trigger"},
		{"id":"a","type":"ai-step","data":{"provider":"openai","model":"gpt-4o","prompt":"one two three"}},
		{"id":"b","type":"ai-step","data":{"provider":"openai","model":"house-model","prompt":"four five"}},
		{"id":"c","type":"ai-step","data":{"provider":"openai","model":"mystery-model","prompt":"six"}}],
		"edges":[{"from":"start","to":"a"},{"from":"a","to":"b"},{"from":"b","to":"c"}]}`)
	start := testenv.StartProcess(t, p.bin, []string{"run", "start", "--workflow", wf},
		[]string{"PAL_NATS_URL=" + p.natsURL, "PAL_PRICES=" + creatorPrices})
	require.NoError(t, start.Wait(ctx), start.Output())
	runID := regexp.MustCompile(`run_[0-9A-Za-z]+`).FindString(start.Output())
	require.NotEmpty(t, runID, start.Output())
	require.Equal(t, event.RunSucceeded, p.WaitEnd(t, runID).Kind)

	evs := p.Events(t, runID)
	require.Equal(t, event.Prices{"gpt-4o": {InputPerMTok: 2.50, OutputPerMTok: 10, CacheReadPerMTok: 1.25}, "house-model": {InputPerMTok: 100, OutputPerMTok: 1000}},
		data[event.RunCreatedData](t, evs[0]).Prices, "the creator's prices of the workflow's models")
	// The fake counts words: "one two three" in, "echo: one two three" out.
	want := map[string]struct {
		cost    float64
		unknown bool
	}{
		"a": {(3*2.50 + 4*10.0) / 1e6, false},
		"b": {(2*100.0 + 3*1000.0) / 1e6, false},
		"c": {0, true},
	}
	total := 0.0
	for step, w := range want {
		u := data[event.StepCompletedData](t, find(evs, event.StepCompleted, step)[0]).Usage
		require.NotNil(t, u, step)
		require.InDelta(t, w.cost, u.CostUSD, 1e-12, step)
		require.Equal(t, w.unknown, u.CostUnknown, step)
		total += w.cost
	}
	require.Positive(t, want["a"].cost)
	// The price files are their processes': this one keeps the embedded table.
	_, _, ok := provider.PriceOf("house-model")
	require.False(t, ok)

	require.Eventually(t, func() bool {
		var status string
		err := pool.QueryRow(ctx, `SELECT status FROM runs WHERE run_id = $1`, runID).Scan(&status)
		return err == nil && status == "succeeded"
	}, 30*time.Second, 50*time.Millisecond)
	var runCost float64
	var runUnknown bool
	require.NoError(t, pool.QueryRow(ctx, `SELECT cost_usd, cost_unknown FROM runs WHERE run_id = $1`, runID).Scan(&runCost, &runUnknown))
	require.InDelta(t, total, runCost, 1e-12)
	require.True(t, runUnknown)
	rows, err := pool.Query(ctx, `SELECT step_id, cost_usd, cost_unknown FROM steps WHERE run_id = $1`, runID)
	require.NoError(t, err)
	defer rows.Close()
	seen := 0
	for rows.Next() {
		var step string
		var cost float64
		var unknown bool
		require.NoError(t, rows.Scan(&step, &cost, &unknown))
		require.InDelta(t, want[step].cost, cost, 1e-12, step)
		require.Equal(t, want[step].unknown, unknown, step)
		seen++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, 3, seen)
}

// TestBadPriceFileStopsTheWorker: a PAL_PRICES file that does not parse
// stops `pal worker` at start with an error naming it.
func TestBadPriceFileStopsTheWorker(t *testing.T) {
	t.Parallel()
	p := setupProc(t, time.Second)
	prices := filepath.Join(t.TempDir(), "prices.json")
	require.NoError(t, os.WriteFile(prices, []byte(`{"models":{"m":{"input_per_mtok":1}}}`), 0o600))
	proc := testenv.StartProcess(t, p.bin, []string{"worker"}, []string{"PAL_NATS_URL=" + p.natsURL, "PAL_PRICES=" + prices})
	require.Error(t, proc.Wait(ctxFor(t, 30*time.Second)))
	require.Contains(t, proc.Output(), "PAL_PRICES="+prices)
	require.Contains(t, proc.Output(), "output_per_mtok is missing")
}
