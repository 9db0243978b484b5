//go:build unix

package pgcluster_test

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/internal/pgcluster"
)

func TestStartAfterSIGKILL(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	dir := initDir(t)
	c := start(t, pgcluster.Options{DataDir: dir, SocketDir: filepath.Join(filepath.Dir(dir), "sock")})
	execSQL(t, c, "postgres", `CREATE TABLE runs (id text PRIMARY KEY); INSERT INTO runs VALUES ('run_1')`)

	pid := c.PID()
	require.NotZero(t, pid)
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	require.Eventually(t, func() bool { return c.PID() == 0 }, time.Minute, 5*time.Millisecond,
		"the postmaster outlived SIGKILL")
	require.FileExists(t, filepath.Join(dir, "postmaster.pid"), "a killed server leaves its pid file")

	// A new process (pal dev after a crash) starts on the same directory and
	// port; the committed row is there.
	again := start(t, pgcluster.Options{DataDir: dir, Port: c.Port(), SocketDir: filepath.Join(filepath.Dir(dir), "sock")})
	require.Equal(t, "run_1", query(t, again, "postgres", `SELECT id FROM runs`))
	require.NotEqual(t, pid, again.PID())

	// The same again through Cluster.Start, which notices the server died.
	pid = again.PID()
	require.NoError(t, syscall.Kill(pid, syscall.SIGKILL))
	require.Eventually(t, func() bool { return again.PID() == 0 }, time.Minute, 5*time.Millisecond)
	require.NoError(t, again.Start(ctx))
	require.Equal(t, "run_1", query(t, again, "postgres", `SELECT id FROM runs`))

	// The first cluster's server is long gone: stopping it does nothing.
	require.NoError(t, c.Stop(ctx, pgcluster.StopFast))
}
