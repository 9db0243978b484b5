package event_test

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
)

func TestIdempotencyKey(t *testing.T) {
	t.Parallel()
	const run = "run_01HZX3K7Q9V2M8N4P6R5T1W0YB"

	// Known vectors: printf 'run_…|draft|1' | sha256sum
	require.Equal(t, "856f0d2c0037da99c377d0e6841cd247b7ed7bcc1580a97e771fa3dce7db10b3",
		event.IdempotencyKey(run, "draft", 1))
	require.Equal(t, "3a5f144ee4dc093d9f1844f882d1bf36778bfdf4a6c5851ef1f302746bb09735",
		event.IdempotencyKey(run, "draft", 2))

	// The definition, for other inputs.
	sum := sha256.Sum256([]byte("run_b|loop[3].fetch|12"))
	require.Equal(t, hex.EncodeToString(sum[:]), event.IdempotencyKey("run_b", "loop[3].fetch", 12))

	// Stable, and different per attempt, step and run.
	require.Equal(t, event.IdempotencyKey(run, "draft", 1), event.IdempotencyKey(run, "draft", 1))
	keys := map[string]bool{}
	for _, k := range []string{
		event.IdempotencyKey(run, "draft", 1),
		event.IdempotencyKey(run, "draft", 2),
		event.IdempotencyKey(run, "draft", 3),
		event.IdempotencyKey(run, "review", 1),
		event.IdempotencyKey("run_other", "draft", 1),
	} {
		require.Len(t, k, 64)
		require.False(t, keys[k], "duplicate key %s", k)
		keys[k] = true
	}
}
