package pgcluster

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestDirVersionOrder(t *testing.T) {
	t.Parallel()
	require.Greater(t, dirVersion("/usr/lib/postgresql/15/bin"), dirVersion("/usr/lib/postgresql/9.6/bin"))
	require.Greater(t, dirVersion("/usr/lib/postgresql/16/bin"), dirVersion("/usr/lib/postgresql/15/bin"))
	require.Equal(t, -1, dirVersion("/usr/lib/postgresql/x/bin"))
}

func TestMajorOf(t *testing.T) {
	t.Parallel()
	for version, want := range map[string]string{
		"15.14":    "15",
		"17devel":  "17",
		"16beta1":  "16",
		"9.6.24":   "9.6",
		"10.23":    "10",
		"18":       "18",
		"14.1-pal": "14",
	} {
		require.Equal(t, want, majorOf(version), version)
	}
}

func TestReadPIDFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "postmaster.pid"), []byte(
		"4242\n"+dir+"\n1700000000\n5433\n/tmp/sock\n127.0.0.1\n  5433001    131072\nready   \n"), 0o600))
	pf, err := readPIDFile(dir)
	require.NoError(t, err)
	require.Equal(t, 4242, pf.pid)
	require.Equal(t, 5433, pf.port)
	require.Equal(t, "/tmp/sock", pf.socketDir)
	require.Equal(t, "127.0.0.1", pf.listenAddr)
	require.Equal(t, "ready", pf.status)
}

func TestInspectServer(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	state, _, err := inspectServer(dir)
	require.NoError(t, err)
	require.Equal(t, stateStopped, state)

	write := func(content string) {
		require.NoError(t, os.WriteFile(filepath.Join(dir, "postmaster.pid"), []byte(content), 0o600))
	}
	// Empty: the server died writing it.
	write("")
	state, _, err = inspectServer(dir)
	require.NoError(t, err)
	require.Equal(t, stateStale, state)

	if runtime.GOOS != "linux" {
		return // only /proc tells a reused pid from a postmaster
	}
	// A live process working elsewhere (this test) holds a reused pid.
	write(strconv.Itoa(os.Getpid()) + "\n" + dir + "\n")
	state, pf, err := inspectServer(dir)
	require.NoError(t, err)
	require.Equal(t, stateStale, state)

	// removeStale leaves a file that changed since it was read.
	write(strconv.Itoa(os.Getpid()) + "\n" + dir + "\n\n")
	require.NoError(t, removeStale(dir, pf))
	require.FileExists(t, filepath.Join(dir, "postmaster.pid"))
	_, pf, err = inspectServer(dir)
	require.NoError(t, err)
	require.NoError(t, removeStale(dir, pf))
	require.NoFileExists(t, filepath.Join(dir, "postmaster.pid"))
}
