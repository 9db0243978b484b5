package palcli

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestDevTokenIsKept: pal dev's token is made once and read back on every
// later start, owner-only; a file that holds no token of pal dev's is
// refused, not trusted.
func TestDevTokenIsKept(t *testing.T) {
	path := filepath.Join(t.TempDir(), "home", devTokenName)
	first, err := devToken(path)
	require.NoError(t, err)
	require.Regexp(t, `^pal_[A-Za-z0-9_-]{40,}$`, first)
	fi, err := os.Stat(path)
	require.NoError(t, err)
	require.Equal(t, os.FileMode(0o600), fi.Mode().Perm())
	again, err := devToken(path)
	require.NoError(t, err)
	require.Equal(t, first, again, "a restart keeps the token")

	require.NoError(t, os.WriteFile(path, []byte("hunter2\n"), 0o600))
	_, err = devToken(path)
	require.ErrorContains(t, err, "remove it")
}

// TestDevEnvFoundFromBelow: without PAL_HOME a pal command finds the
// nearest .pal/dev.env above it; PAL_HOME (or its earlier name
// PAL_DATA_DIR) names the directory wherever the command runs.
func TestDevEnvFoundFromBelow(t *testing.T) {
	root := t.TempDir()
	home := filepath.Join(root, defaultDataDir)
	require.NoError(t, os.MkdirAll(home, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(home, devEnvName), []byte("PAL_NATS_URL=nats://127.0.0.1:1\n"), 0o600))
	deep := filepath.Join(root, "a", "b")
	require.NoError(t, os.MkdirAll(deep, 0o755))
	t.Chdir(deep)
	none := func(string) string { return "" }
	got, err := filepath.EvalSymlinks(devEnvPath(none))
	require.NoError(t, err)
	want, err := filepath.EvalSymlinks(filepath.Join(home, devEnvName))
	require.NoError(t, err)
	require.Equal(t, want, got)

	other := filepath.Join(t.TempDir(), "elsewhere")
	for _, name := range []string{"PAL_HOME", "PAL_DATA_DIR"} {
		env := func(k string) string {
			if k == name {
				return other
			}
			return ""
		}
		require.Equal(t, filepath.Join(other, devEnvName), devEnvPath(env), name)
	}

	t.Chdir(t.TempDir())
	require.Equal(t, filepath.Join(defaultDataDir, devEnvName), devEnvPath(none), "none found: ./.pal")
}
