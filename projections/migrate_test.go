package projections_test

import (
	"context"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/projections"
)

func TestMigrateEmptyDatabaseThenNoOp(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t).Pool(t)
	ctx := context.Background()
	ms, err := projections.Migrations()
	require.NoError(t, err)
	require.NotEmpty(t, ms)

	res, err := projections.Migrate(ctx, pool)
	require.NoError(t, err)
	require.Len(t, res.Applied, len(ms))
	for i, m := range ms {
		require.Equal(t, m.Version, res.Applied[i].Version)
		require.Equal(t, m.Name, res.Applied[i].Name)
	}
	require.Equal(t, ms[len(ms)-1].Version, res.Version)

	rows, err := pool.Query(ctx, `SELECT table_name FROM information_schema.tables
		WHERE table_schema = current_schema() ORDER BY table_name`)
	require.NoError(t, err)
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"journal_events", "pal_schema_migrations", "projection_checkpoints", "run_receipts", "runs",
		"side_effect_receipts", "steps"}, tables)

	// The primary keys docs/architecture.md §13 names.
	for table, want := range map[string][]string{
		"journal_events":         {"run_id", "seq"},
		"runs":                   {"run_id"},
		"steps":                  {"run_id", "step_id", "attempt"},
		"side_effect_receipts":   {"run_id", "step_id", "attempt"},
		"projection_checkpoints": {"projector"},
		"run_receipts":           {"run_id"},
	} {
		rows, err := pool.Query(ctx, `SELECT a.attname FROM pg_index i
			JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
			WHERE i.indrelid = $1::regclass AND i.indisprimary ORDER BY array_position(i.indkey, a.attnum)`, table)
		require.NoError(t, err)
		cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		require.Equal(t, want, cols, table)
	}

	// Identifier columns use the "C" collation (§13): every text column
	// named run_id, step_id, key_id or idempotency_key, or ending _run_id
	// or _step_id.
	rows, err = pool.Query(ctx, `SELECT table_name || '.' || column_name, coalesce(collation_name, '')
		FROM information_schema.columns WHERE table_schema = current_schema() AND data_type = 'text'
		AND (column_name IN ('run_id', 'step_id', 'key_id', 'idempotency_key')
			OR column_name LIKE '%\_run\_id' OR column_name LIKE '%\_step\_id')`)
	require.NoError(t, err)
	type column struct{ Name, Collation string }
	cols, err := pgx.CollectRows(rows, pgx.RowToStructByPos[column])
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(cols), 10)
	for _, c := range cols {
		require.Equal(t, "C", c.Collation, c.Name)
	}

	// Again: nothing applied, nothing written.
	var xmin string
	require.NoError(t, pool.QueryRow(ctx, "SELECT max(xmin::text) FROM pal_schema_migrations").Scan(&xmin))
	res, err = projections.Migrate(ctx, pool)
	require.NoError(t, err)
	require.Empty(t, res.Applied)
	require.Equal(t, ms[len(ms)-1].Version, res.Version)
	var xmin2 string
	var n int
	require.NoError(t, pool.QueryRow(ctx, "SELECT max(xmin::text), count(*) FROM pal_schema_migrations").Scan(&xmin2, &n))
	require.Equal(t, xmin, xmin2)
	require.Equal(t, len(ms), n)
}

func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	pool := testenv.Postgres(t).Pool(t)
	ctx := context.Background()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		applied int
	)
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := projections.Migrate(ctx, pool)
			if err != nil {
				t.Errorf("migrate: %v", err)
				return
			}
			mu.Lock()
			applied += len(res.Applied)
			mu.Unlock()
		}()
	}
	wg.Wait()
	ms, err := projections.Migrations()
	require.NoError(t, err)
	require.Equal(t, len(ms), applied, "each migration applied exactly once")
}
