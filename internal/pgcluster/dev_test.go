package pgcluster_test

import (
	"context"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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

// connectErr connects to dsn and returns the error, closing a connection
// that was made.
func connectErr(t *testing.T, dsn string) error {
	t.Helper()
	ctx := testCtx(t)
	conn, err := pgx.Connect(ctx, dsn)
	if err == nil {
		require.NoError(t, conn.Close(ctx))
	}
	return err
}

// requireRefused checks that the server turned a connection down for its
// password (SQLSTATE 28P01), not for something else.
func requireRefused(t *testing.T, err error) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	require.Equal(t, "28P01", pgErr.Code, "want invalid_password: %v", err)
}

// withPassword returns dsn with the password replaced (removed when pw is
// empty).
func withPassword(t *testing.T, dsn, pw string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	u.User = url.User(u.User.Username())
	if pw != "" {
		u.User = url.UserPassword(u.User.Username(), pw)
	}
	return u.String()
}

func passwordOf(t *testing.T, dsn string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	pw, ok := u.User.Password()
	require.True(t, ok, "no password in %s", dsn)
	return pw
}

func TestDevNeedsThePassword(t *testing.T) {
	t.Parallel()
	dataDir := filepath.Join(reachableTempDir(t), ".pal", "pg")
	c, log := dev(t, dataDir)
	dsn := c.DSN(pgcluster.DevDatabase)
	pw := passwordOf(t, dsn)
	require.Len(t, pw, 48)

	// The password is kept in the data directory, for this user only.
	file := filepath.Join(dataDir, pgcluster.PasswordFile)
	fi, err := os.Stat(file)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	b, err := os.ReadFile(file)
	require.NoError(t, err)
	require.Equal(t, pw, strings.TrimSpace(string(b)))
	require.NotContains(t, log.String(), pw, "the password went to the log")

	require.NoError(t, connectErr(t, dsn))
	requireRefused(t, connectErr(t, withPassword(t, dsn, "")))
	requireRefused(t, connectErr(t, withPassword(t, dsn, "not-"+pw)))
	require.Equal(t, "127.0.0.1", query(t, c, pgcluster.DevDatabase, `SHOW listen_addresses`))
	require.Equal(t, "scram-sha-256", query(t, c, pgcluster.DevDatabase, `SHOW password_encryption`))
	require.Equal(t, "local all scram-sha-256,host 127.0.0.1 scram-sha-256,host ::1 scram-sha-256",
		query(t, c, pgcluster.DevDatabase, `SELECT string_agg(concat_ws(' ', type, coalesce(address, 'all'), auth_method), ',' ORDER BY line_number)
			FROM pg_hba_file_rules WHERE database = '{all}'`))
	require.Equal(t, "SCRAM-SHA-256", query(t, c, pgcluster.DevDatabase,
		`SELECT split_part(rolpassword, '$', 1) FROM pg_authid WHERE rolname = 'postgres'`))
	stopFast(t, c)

	// The next pal dev over the same data has the same password.
	again, _ := dev(t, dataDir)
	require.Equal(t, pw, passwordOf(t, again.DSN(pgcluster.DevDatabase)))
	require.NoError(t, connectErr(t, again.DSN(pgcluster.DevDatabase)))
	requireRefused(t, connectErr(t, withPassword(t, again.DSN(pgcluster.DevDatabase), "")))
}

// TestDevSecuresATrustCluster runs pal dev over data made before PAL set
// passwords: trust authentication, no password file.
func TestDevSecuresATrustCluster(t *testing.T) {
	t.Parallel()
	dataDir := filepath.Join(reachableTempDir(t), ".pal", "pg")
	require.NoError(t, pgcluster.Init(testCtx(t), dataDir, pgcluster.NoSync()))
	old := start(t, pgcluster.Options{DataDir: dataDir})
	execSQL(t, old, "postgres", `CREATE DATABASE pal`)
	execSQL(t, old, "pal", `CREATE TABLE runs (id text PRIMARY KEY); INSERT INTO runs VALUES ('run_1')`)
	execSQL(t, old, "postgres", `ALTER ROLE postgres PASSWORD NULL`)
	stopFast(t, old)
	require.NoError(t, os.Remove(filepath.Join(dataDir, pgcluster.PasswordFile)))
	require.NoError(t, os.WriteFile(filepath.Join(dataDir, "pg_hba.conf"),
		[]byte("local all all trust\nhost all all 127.0.0.1/32 trust\n"), 0o600))
	trusted := start(t, pgcluster.Options{DataDir: dataDir})
	require.NoError(t, connectErr(t, trusted.DSN("postgres")), "the old cluster lets anyone in")
	stopFast(t, trusted)

	c, log := dev(t, dataDir)
	require.Contains(t, log.String(), "setting a password")
	dsn := c.DSN(pgcluster.DevDatabase)
	pw := passwordOf(t, dsn)
	b, err := os.ReadFile(filepath.Join(dataDir, pgcluster.PasswordFile))
	require.NoError(t, err)
	require.Equal(t, pw, strings.TrimSpace(string(b)))
	requireRefused(t, connectErr(t, withPassword(t, dsn, "")))
	require.Equal(t, "run_1", query(t, c, pgcluster.DevDatabase, `SELECT id FROM runs`))
}
