package testenv_test

import (
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/paltest/testenv"
)

func tableExists(t *testing.T, pool *pgxpool.Pool, table string) bool {
	t.Helper()
	var exists bool
	require.NoError(t, pool.QueryRow(waitCtx(t), `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&exists))
	return exists
}

func TestPostgresFreshDatabasePerCall(t *testing.T) {
	t.Parallel()
	a, b := testenv.Postgres(t), testenv.Postgres(t)
	require.NotEqual(t, a.Name(), b.Name())
	require.NotEqual(t, a.DSN(), b.DSN())
	poolA, poolB := a.Pool(t), b.Pool(t)
	ctx := waitCtx(t)

	var name string
	require.NoError(t, poolA.QueryRow(ctx, `SELECT current_database()`).Scan(&name))
	require.Equal(t, a.Name(), name)

	_, err := poolA.Exec(ctx, `CREATE TABLE journal_events (run_id text, seq bigint, PRIMARY KEY (run_id, seq));
		INSERT INTO journal_events VALUES ('run_1', 1)`)
	require.NoError(t, err)
	require.True(t, tableExists(t, poolA, "journal_events"))
	require.False(t, tableExists(t, poolB, "journal_events"), "a table of one test database shows up in another")
}

// stopStart stops the server under pg, checks that it is down, starts it
// again and checks that committed rows survived and the pool recovers.
func stopStart(t *testing.T, pg *testenv.PG) {
	t.Helper()
	pool := pg.Pool(t)
	ctx := waitCtx(t)
	_, err := pool.Exec(ctx, `CREATE TABLE runs (id text PRIMARY KEY); INSERT INTO runs VALUES ('run_1')`)
	require.NoError(t, err)

	pg.StopServer()
	require.Error(t, pool.Ping(ctx), "Ping while the server is stopped")
	pg.StartServer()

	// The pool discards the connections the stop broke and dials anew.
	var id string
	require.NoError(t, pool.QueryRow(ctx, `SELECT id FROM runs`).Scan(&id))
	require.Equal(t, "run_1", id)
}

func TestPostgresOwnServerStopStart(t *testing.T) {
	t.Parallel()
	stopStart(t, testenv.Postgres(t, testenv.OwnServer()))
}

// TestPostgresSharedStopStart stops the cluster all tests share, so it does
// not call t.Parallel: parallel tests wait until the sequential ones are
// done.
func TestPostgresSharedStopStart(t *testing.T) {
	if os.Getenv("DATABASE_URL") != "" {
		t.Skip("DATABASE_URL is set: the shared server is not a throwaway cluster and cannot be stopped")
	}
	pg := testenv.Postgres(t)
	stopStart(t, pg)

	// A test that leaves the server stopped gets it restarted by its
	// cleanup, for the tests that come after.
	t.Run("left stopped", func(t *testing.T) {
		testenv.Postgres(t).StopServer()
	})
	var one int
	require.NoError(t, pg.Pool(t).QueryRow(waitCtx(t), `SELECT 1`).Scan(&one),
		"the shared server is still down after the subtest's cleanup")
}
