package palcli_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/paltest/testenv"
)

// A blob threshold below the minimum, or not a number, stops the worker at
// start, naming the variable.
func TestBadBlobThreshold(t *testing.T) {
	t.Parallel()
	bin := testenv.PalBinary(t)
	for _, v := range []string{"100", "big"} {
		env := []string{"PAL_NATS_URL=nats://127.0.0.1:1", "PAL_DATA_DIR=" + t.TempDir(), "PAL_BLOB_THRESHOLD=" + v}
		r := runPal(t, bin, env, "worker")
		require.Equal(t, 2, r.code, "%s: %s", v, r)
		require.Contains(t, r.stderr, `PAL_BLOB_THRESHOLD="`+v+`": want a whole number ≥ 1024`)
	}
}
