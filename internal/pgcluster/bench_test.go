package pgcluster_test

import (
	"context"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/internal/pgcluster"
)

func BenchmarkInit(b *testing.B) {
	for _, sync := range []bool{false, true} {
		b.Run("sync="+strconv.FormatBool(sync), func(b *testing.B) {
			var opts []pgcluster.InitOption
			if !sync {
				opts = append(opts, pgcluster.NoSync())
			}
			parent := reachableTempDir(b)
			for i := range b.N {
				require.NoError(b, pgcluster.Init(context.Background(), filepath.Join(parent, strconv.Itoa(i)), opts...))
			}
		})
	}
}

// BenchmarkStartStop measures a start and a fast stop of an initialised
// cluster: what pal dev pays on every run.
func BenchmarkStartStop(b *testing.B) {
	for _, fsync := range []bool{false, true} {
		b.Run("fsync="+strconv.FormatBool(fsync), func(b *testing.B) {
			ctx := context.Background()
			dir := filepath.Join(reachableTempDir(b), "pg")
			require.NoError(b, pgcluster.Init(ctx, dir, pgcluster.NoSync()))
			c, err := pgcluster.Start(ctx, pgcluster.Options{DataDir: dir, Fsync: fsync})
			require.NoError(b, err)
			require.NoError(b, c.Stop(ctx, pgcluster.StopFast))
			b.ResetTimer()
			for range b.N {
				require.NoError(b, c.Start(ctx))
				require.NoError(b, c.Stop(ctx, pgcluster.StopFast))
			}
		})
	}
}

// BenchmarkDev measures a pal dev start on an existing data directory and
// the stop at its exit.
func BenchmarkDev(b *testing.B) {
	ctx := context.Background()
	dataDir := filepath.Join(reachableTempDir(b), ".pal", "pg")
	c, err := pgcluster.Dev(ctx, dataDir, nil)
	require.NoError(b, err)
	require.NoError(b, c.Stop(ctx, pgcluster.StopFast))
	b.ResetTimer()
	for range b.N {
		c, err := pgcluster.Dev(ctx, dataDir, nil)
		require.NoError(b, err)
		require.NoError(b, c.Stop(ctx, pgcluster.StopFast))
	}
}
