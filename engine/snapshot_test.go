package engine_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
)

// TestDecodeStateRefusesGarbage: bytes that are not an encoded state, a
// truncated one, or one of no run decode to an error, never a state.
func TestDecodeStateRefusesGarbage(t *testing.T) {
	t.Parallel()
	paths := historyFiles(t)
	st, err := engine.Fold(readHistory(t, paths[0]))
	require.NoError(t, err)
	b, err := engine.EncodeState(st)
	require.NoError(t, err)
	got, err := engine.DecodeState(b)
	require.NoError(t, err)
	require.Equal(t, engine.Comparable(st), engine.Comparable(got))

	for name, bad := range map[string][]byte{
		"empty":     nil,
		"garbage":   []byte("not a gob stream at all"),
		"truncated": b[:len(b)/2],
	} {
		_, err := engine.DecodeState(bad)
		require.Error(t, err, name)
	}
	empty, err := engine.EncodeState(&engine.RunState{})
	require.NoError(t, err)
	_, err = engine.DecodeState(empty)
	require.ErrorContains(t, err, "not a folded run")
}
