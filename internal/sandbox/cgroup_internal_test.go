package sandbox

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCgroupDir finds the worker's cgroup of a controller in a v1
// hierarchy, in the unified one (v2) when no v1 hierarchy has it, and
// under a mount whose root is not the hierarchy's.
func TestCgroupDir(t *testing.T) {
	t.Parallel()
	v1 := []byte(`30 22 0:27 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
34 30 0:31 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
38 30 0:35 /docker/abc /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 30 0:37 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`)
	own := []byte("8:pids:/docker/abc/sub\n4:memory:/process_api/x\n0::/\n")
	dir, v2 := cgroupDir(v1, own, "memory")
	require.Equal(t, "/sys/fs/cgroup/memory/process_api/x", dir)
	require.False(t, v2)
	dir, _ = cgroupDir(v1, own, "pids")
	require.Equal(t, "/sys/fs/cgroup/pids/sub", dir)

	root := t.TempDir()
	require.NoError(t, os.MkdirAll(filepath.Join(root, "user.slice", "w"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(root, "user.slice", "w", "cgroup.controllers"), []byte("cpu memory pids\n"), 0o644))
	unified := []byte("25 1 0:23 / " + root + " rw,nosuid - cgroup2 cgroup2 rw\n")
	dir, v2 = cgroupDir(unified, []byte("0::/user.slice/w\n"), "memory")
	require.Equal(t, filepath.Join(root, "user.slice", "w"), dir)
	require.True(t, v2)
	dir, _ = cgroupDir(unified, []byte("0::/user.slice/w\n"), "hugetlb")
	require.Empty(t, dir, "a controller the cgroup does not have")
}
