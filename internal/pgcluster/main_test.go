package pgcluster_test

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/palrun/pal/internal/pgcluster"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// testCtx bounds a test's waits: it fails rather than hangs.
func testCtx(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

// reachableTempDir returns a temporary directory that the server's user can
// reach when the tests run as root (t.TempDir makes it 0700).
func reachableTempDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for d := dir; d != os.TempDir() && d != filepath.Dir(d); d = filepath.Dir(d) {
		require.NoError(t, os.Chmod(d, 0o755))
	}
	return dir
}

// initDir makes a cluster in a fresh directory; fsync off is fine for tests
// that do not crash the machine.
func initDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(reachableTempDir(t), "pg")
	require.NoError(t, pgcluster.Init(testCtx(t), dir, pgcluster.NoSync()))
	return dir
}

// start starts a cluster and stops it (immediately) in the test's cleanup.
func start(t *testing.T, opts pgcluster.Options) *pgcluster.Cluster {
	t.Helper()
	c, err := pgcluster.Start(testCtx(t), opts)
	require.NoError(t, err)
	stopInCleanup(t, c)
	return c
}

func stopInCleanup(t *testing.T, c *pgcluster.Cluster) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, c.Stop(ctx, pgcluster.StopImmediate))
	})
}

// execSQL runs sql on database db of c.
func execSQL(t *testing.T, c *pgcluster.Cluster, db, sql string, args ...any) {
	t.Helper()
	ctx := testCtx(t)
	conn, err := pgx.Connect(ctx, c.DSN(db))
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql, args...)
	require.NoError(t, err)
}

// query returns the single text value sql yields on database db of c.
func query(t *testing.T, c *pgcluster.Cluster, db, sql string) string {
	t.Helper()
	ctx := testCtx(t)
	conn, err := pgx.Connect(ctx, c.DSN(db))
	require.NoError(t, err)
	defer conn.Close(ctx)
	var s string
	require.NoError(t, conn.QueryRow(ctx, sql).Scan(&s))
	return s
}

// logBuffer collects what a slog.Logger writes.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func newLogger(t *testing.T) (*slog.Logger, *logBuffer) {
	t.Helper()
	var b logBuffer
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log:\n%s", b.String())
		}
	})
	return slog.New(slog.NewTextHandler(&b, nil)), &b
}
