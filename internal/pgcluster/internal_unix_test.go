//go:build unix

package pgcluster

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMakeDirsIgnoresUmask changes the process's umask, so it must not run
// in parallel with the other tests.
func TestMakeDirsIgnoresUmask(t *testing.T) {
	base := t.TempDir()
	require.NoError(t, os.Chmod(base, 0o700))
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)

	dir := filepath.Join(base, ".pal", "nested")
	require.NoError(t, makeDirs(dir))
	for _, d := range []string{filepath.Join(base, ".pal"), dir} {
		fi, err := os.Stat(d)
		require.NoError(t, err)
		require.Equal(t, os.FileMode(0o755), fi.Mode().Perm(), d)
	}
	fi, err := os.Stat(base)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o700), fi.Mode().Perm(), "makeDirs changed a directory it did not create")
}
