package pgcluster_test

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/internal/pgcluster"
)

func TestInitIsIdempotent(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	dir := filepath.Join(reachableTempDir(t), "pg")
	require.NoError(t, pgcluster.Init(ctx, dir, pgcluster.NoSync()))
	require.FileExists(t, filepath.Join(dir, "PG_VERSION"))

	// A second Init leaves the cluster alone: a file it would not keep
	// survives.
	marker := filepath.Join(dir, "pal-marker")
	require.NoError(t, os.WriteFile(marker, []byte("x"), 0o600))
	require.NoError(t, pgcluster.Init(ctx, dir))
	require.FileExists(t, marker)

	// Nothing is left beside the data directory.
	entries, err := os.ReadDir(filepath.Dir(dir))
	require.NoError(t, err)
	require.Len(t, entries, 1, "Init left files next to the data directory")
}

func TestInitRefusesADirectoryThatIsNotACluster(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(reachableTempDir(t), "pg")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("mine"), 0o600))
	err := pgcluster.Init(testCtx(t), dir)
	require.ErrorContains(t, err, "holds no cluster")
	require.FileExists(t, filepath.Join(dir, "notes.txt"))
}

func TestInitIntoAnEmptyDirectory(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(reachableTempDir(t), "pg")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, pgcluster.Init(testCtx(t), dir, pgcluster.NoSync()))
	require.FileExists(t, filepath.Join(dir, "PG_VERSION"))
}

func TestStartStopStartKeepsData(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	dir := filepath.Join(reachableTempDir(t), "pg")
	require.NoError(t, pgcluster.Init(ctx, dir))
	c := start(t, pgcluster.Options{DataDir: dir, Fsync: true})
	port := c.Port()
	require.NotZero(t, port)
	require.True(t, c.Running())
	require.NotZero(t, c.PID())
	require.Equal(t, "127.0.0.1", query(t, c, "postgres", `SELECT host(inet_server_addr())`))
	require.Equal(t, "on", query(t, c, "postgres", `SHOW fsync`))
	require.Equal(t, "", query(t, c, "postgres", `SHOW unix_socket_directories`))
	execSQL(t, c, "postgres", `CREATE TABLE runs (id text PRIMARY KEY); INSERT INTO runs VALUES ('run_1')`)

	require.NoError(t, c.Stop(ctx, pgcluster.StopFast))
	require.False(t, c.Running())
	require.Zero(t, c.PID())
	require.NoFileExists(t, filepath.Join(dir, "postmaster.pid"))
	require.NoError(t, c.Stop(ctx, pgcluster.StopFast), "a second Stop")

	require.NoError(t, c.Start(ctx))
	require.Equal(t, port, c.Port(), "the cluster moved to another port")
	require.Equal(t, "run_1", query(t, c, "postgres", `SELECT id FROM runs`))
	require.NoError(t, c.Start(ctx), "starting a running cluster")
}

func TestStartWithSocketDirAndSettings(t *testing.T) {
	t.Parallel()
	dir := initDir(t)
	sock := filepath.Join(filepath.Dir(dir), "sock")
	c := start(t, pgcluster.Options{DataDir: dir, SocketDir: sock, MaxConnections: 42,
		LogFile: filepath.Join(filepath.Dir(dir), "log", "pg.log")})
	require.Equal(t, "off", query(t, c, "postgres", `SHOW fsync`))
	require.Equal(t, "off", query(t, c, "postgres", `SHOW full_page_writes`))
	require.Equal(t, "on", query(t, c, "postgres", `SHOW synchronous_commit`))
	require.Equal(t, "42", query(t, c, "postgres", `SHOW max_connections`))
	require.FileExists(t, filepath.Join(sock, ".s.PGSQL."+strconv.Itoa(c.Port())))
	require.FileExists(t, c.LogFile())

	// The Unix socket wants the password too.
	viaSocket := fmt.Sprintf("host=%s port=%d user=postgres dbname=postgres", sock, c.Port())
	requireRefused(t, connectErr(t, viaSocket))
	require.NoError(t, connectErr(t, viaSocket+" password="+passwordOf(t, c.DSN("postgres"))))
}

func TestStartOnATakenPort(t *testing.T) {
	t.Parallel()
	dir := initDir(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port

	_, err = pgcluster.Start(testCtx(t), pgcluster.Options{DataDir: dir, Port: port})
	require.ErrorIs(t, err, pgcluster.ErrPortInUse)
	var pe *pgcluster.PortInUseError
	require.ErrorAs(t, err, &pe)
	require.Equal(t, port, pe.Port)
	require.ErrorContains(t, err, "127.0.0.1:"+strconv.Itoa(port))
	require.NoFileExists(t, filepath.Join(dir, "postmaster.pid"))

	// Once the port is free the same directory starts.
	require.NoError(t, l.Close())
	start(t, pgcluster.Options{DataDir: dir, Port: port})
}

func TestStartTwiceInOneDirectory(t *testing.T) {
	t.Parallel()
	dir := initDir(t)
	c := start(t, pgcluster.Options{DataDir: dir})
	_, err := pgcluster.Start(testCtx(t), pgcluster.Options{DataDir: dir})
	require.ErrorIs(t, err, pgcluster.ErrRunning)
	var re *pgcluster.RunningError
	require.ErrorAs(t, err, &re)
	require.Equal(t, c.PID(), re.PID)
	require.Equal(t, c.Port(), re.Port)
}

func TestStopImmediateKeepsCommittedData(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	c := start(t, pgcluster.Options{DataDir: initDir(t)})
	execSQL(t, c, "postgres", `CREATE TABLE runs (id text PRIMARY KEY); INSERT INTO runs VALUES ('run_1')`)
	require.NoError(t, c.Stop(ctx, pgcluster.StopImmediate))
	require.NoError(t, c.Start(ctx))
	require.Equal(t, "run_1", query(t, c, "postgres", `SELECT id FROM runs`))
}

func TestStartNeedsInit(t *testing.T) {
	t.Parallel()
	_, err := pgcluster.Start(testCtx(t), pgcluster.Options{DataDir: filepath.Join(t.TempDir(), "pg")})
	require.ErrorContains(t, err, "Init")
	require.False(t, errors.Is(err, pgcluster.ErrPortInUse))
}

func TestStopRejectsAnUnknownMode(t *testing.T) {
	t.Parallel()
	c := start(t, pgcluster.Options{DataDir: initDir(t)})
	require.ErrorContains(t, c.Stop(testCtx(t), "gentle"), "unknown stop mode")
	require.True(t, c.Running())
}
