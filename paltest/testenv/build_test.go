package testenv_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/paltest/testenv"
)

func TestBuildBinaryOnce(t *testing.T) {
	t.Parallel()
	first := testenv.BuildBinary(t, helperPkg)
	fi, err := os.Stat(first)
	require.NoError(t, err)
	require.NotZero(t, fi.Mode()&0o111, "not executable")
	require.Equal(t, "helper", filepath.Base(first))
	require.Equal(t, first, testenv.BuildBinary(t, helperPkg), "built twice")

	// Import paths work too, and get their own directory.
	byPath := testenv.BuildBinary(t, "github.com/palrun/pal/paltest/testenv/testdata/helper")
	require.NotEqual(t, first, byPath)
	require.Equal(t, "helper", filepath.Base(byPath))
}

func TestFreePort(t *testing.T) {
	t.Parallel()
	require.Positive(t, testenv.FreePort(t))
}
