package pgcluster_test

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/internal/pgcluster"
)

// dev runs Dev and stops its server in the test's cleanup.
func dev(t *testing.T, dataDir string) (*pgcluster.Cluster, *logBuffer) {
	t.Helper()
	log, buf := newLogger(t)
	c, err := pgcluster.Dev(testCtx(t), dataDir, log)
	require.NoError(t, err)
	stopInCleanup(t, c)
	return c, buf
}

func stopFast(t *testing.T, c *pgcluster.Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, c.Stop(ctx, pgcluster.StopFast))
}

func TestDevKeepsDataAcrossRuns(t *testing.T) {
	t.Parallel()
	dataDir := filepath.Join(reachableTempDir(t), ".pal", "pg")

	c, log := dev(t, dataDir)
	require.Equal(t, dataDir, c.DataDir(), "the data went elsewhere although the directory is reachable")
	require.Contains(t, log.String(), "initialised a PostgreSQL data directory")
	require.Contains(t, log.String(), "PostgreSQL ready")
	require.Contains(t, c.DSN(pgcluster.DevDatabase), "/pal?")
	require.Equal(t, "pal", query(t, c, pgcluster.DevDatabase, `SELECT current_database()`))
	require.Equal(t, "on", query(t, c, pgcluster.DevDatabase, `SHOW fsync`))
	require.Equal(t, "127.0.0.1", query(t, c, pgcluster.DevDatabase, `SELECT host(inet_server_addr())`))
	execSQL(t, c, pgcluster.DevDatabase, `CREATE TABLE runs (id text PRIMARY KEY); INSERT INTO runs VALUES ('run_1')`)
	stopFast(t, c) // pal dev exits

	again, log := dev(t, dataDir)
	require.NotContains(t, log.String(), "initialised")
	require.Equal(t, "run_1", query(t, again, pgcluster.DevDatabase, `SELECT id FROM runs`))
	stopFast(t, again)
	require.NoFileExists(t, filepath.Join(dataDir, "postmaster.pid"))
}

func TestDevUsesAServerLeftRunning(t *testing.T) {
	t.Parallel()
	dataDir := filepath.Join(reachableTempDir(t), ".pal", "pg")
	first, _ := dev(t, dataDir)
	execSQL(t, first, pgcluster.DevDatabase, `CREATE TABLE runs (id text PRIMARY KEY); INSERT INTO runs VALUES ('run_1')`)

	// pal dev was killed with SIGKILL: its server still runs.
	second, log := dev(t, dataDir)
	require.Contains(t, log.String(), "still runs; using it")
	require.Equal(t, first.Port(), second.Port())
	require.Equal(t, first.PID(), second.PID())
	require.Equal(t, "run_1", query(t, second, pgcluster.DevDatabase, `SELECT id FROM runs`))
	stopFast(t, second)
	require.Zero(t, first.PID())
}

// TestDevFallsBackToAFreePort does not run in parallel with the other Dev
// tests, which take the dev port when it is free.
func TestDevFallsBackToAFreePort(t *testing.T) {
	// Hold the dev port, unless another program already does.
	if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(pgcluster.DevPort)); err == nil {
		t.Cleanup(func() { l.Close() })
	}
	c, log := dev(t, filepath.Join(reachableTempDir(t), ".pal", "pg"))
	require.NotEqual(t, pgcluster.DevPort, c.Port())
	require.Contains(t, log.String(), "port="+strconv.Itoa(c.Port()))
	require.Equal(t, "pal", query(t, c, pgcluster.DevDatabase, `SELECT current_database()`))
}

// TestDevCheckoutClosedToPostgres runs pal dev as root from a checkout that
// user postgres cannot enter: the data goes where it can, and the next run
// finds it there.
func TestDevCheckoutClosedToPostgres(t *testing.T) {
	t.Parallel()
	if os.Geteuid() != 0 {
		t.Skip("only root runs PostgreSQL as another user")
	}
	checkout := t.TempDir() // 0700, owned by root
	dataDir := filepath.Join(checkout, ".pal", "pg")

	c, log := dev(t, dataDir)
	fallback := filepath.Dir(c.DataDir())
	t.Cleanup(func() {
		require.NoError(t, os.RemoveAll(fallback))
		_ = os.Remove(filepath.Dir(fallback)) // pal-dev, unless other data is there
	})
	require.NotEqual(t, dataDir, c.DataDir())
	require.Contains(t, log.String(), "outside the checkout")
	require.Contains(t, log.String(), c.DataDir())
	source, err := os.ReadFile(filepath.Join(fallback, "source"))
	require.NoError(t, err)
	require.Equal(t, dataDir, strings.TrimSpace(string(source)))
	require.NoDirExists(t, dataDir, "Dev made the unreachable data directory anyway")
	execSQL(t, c, pgcluster.DevDatabase, `CREATE TABLE runs (id text PRIMARY KEY); INSERT INTO runs VALUES ('run_1')`)
	stopFast(t, c)

	again, _ := dev(t, dataDir)
	require.Equal(t, c.DataDir(), again.DataDir())
	require.Equal(t, "run_1", query(t, again, pgcluster.DevDatabase, `SELECT id FROM runs`))
	stopFast(t, again)
}
