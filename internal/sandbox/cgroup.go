package sandbox

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/palrun/pal/internal/retry"
)

// Each step gets a cgroup of its own under the worker's, in the memory
// and the pids hierarchy (cgroup v1), or one in the unified hierarchy
// (v2), named cgroupPrefix<worker pid>-<n>. The worker puts the host init
// in it before bwrap starts, so every process of the step is in it; after
// the step it kills what is left and removes it. A cgroup left by a
// worker killed with kill -9 is removed by the next worker that starts
// on the machine (its pid names a process that no longer exists).

const (
	cgroupPrefix = "pal-sbx-"
	// overheadTasks is added to Limits.Processes for the sandbox's own
	// processes and threads: bwrap's two and the init's.
	overheadTasks = 16
)

// cgroups is where a Runner creates the cgroups of its steps.
type cgroups struct {
	memory, pids  string // the worker's cgroup directory in each; "" when unusable
	memV2, pidsV2 bool
}

func (c *cgroups) String() string {
	var parts []string
	for _, h := range []struct {
		name, dir string
		v2        bool
	}{{"memory", c.memory, c.memV2}, {"pids", c.pids, c.pidsV2}} {
		if h.dir == "" {
			parts = append(parts, h.name+": rlimit")
			continue
		}
		v := "v1"
		if h.v2 {
			v = "v2"
		}
		parts = append(parts, fmt.Sprintf("%s: cgroup %s under %s", h.name, v, h.dir))
	}
	return strings.Join(parts, ", ")
}

// detectCgroups finds the worker's own cgroups and checks that it may
// create cgroups under them. It returns nil when it may create none.
func detectCgroups(log *slog.Logger) *cgroups {
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil
	}
	c := &cgroups{}
	c.memory, c.memV2 = cgroupDir(mounts, own, "memory")
	c.pids, c.pidsV2 = cgroupDir(mounts, own, "pids")
	for _, d := range []*string{&c.memory, &c.pids} {
		if *d == "" {
			continue
		}
		if err := usable(*d, d == &c.memory && c.memV2 || d == &c.pids && c.pidsV2); err != nil {
			log.Debug("sandbox: no cgroups of steps here", "dir", *d, "err", err)
			*d = ""
			continue
		}
		sweepStale(*d, log)
	}
	if c.memory == "" && c.pids == "" {
		return nil
	}
	return c
}

// cgroupDir returns the directory of the worker's cgroup in the hierarchy
// of controller: a v1 hierarchy that has it, else the unified one.
func cgroupDir(mountinfo, own []byte, controller string) (string, bool) {
	type mnt struct{ root, point string }
	var v1, v2 *mnt
	for _, line := range strings.Split(string(mountinfo), "\n") {
		pre, post, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 3 {
			continue
		}
		switch {
		case g[0] == "cgroup" && slices.Contains(strings.Split(g[2], ","), controller):
			v1 = &mnt{f[3], f[4]}
		case g[0] == "cgroup2":
			v2 = &mnt{f[3], f[4]}
		}
	}
	for _, line := range strings.Split(string(own), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		switch {
		case v1 != nil && slices.Contains(strings.Split(parts[1], ","), controller):
			return filepath.Join(v1.point, strings.TrimPrefix(parts[2], v1.root)), false
		case v1 == nil && v2 != nil && parts[0] == "0":
			dir := filepath.Join(v2.point, strings.TrimPrefix(parts[2], v2.root))
			if avail, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers")); err == nil &&
				slices.Contains(strings.Fields(string(avail)), controller) {
				return dir, true
			}
		}
	}
	return "", false
}

// usable checks that a cgroup can be made under dir. On v2 the
// controllers must be on for dir's children: when dir holds processes
// (the worker's), they move to a leaf of their own first, since a v2
// cgroup with processes cannot give controllers to its children.
func usable(dir string, v2 bool) error {
	if v2 {
		if err := enableControllers(dir); err != nil {
			return err
		}
	}
	probe := filepath.Join(dir, fmt.Sprintf("%sprobe-%d", cgroupPrefix, os.Getpid()))
	if err := os.Mkdir(probe, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	return os.Remove(probe)
}

func enableControllers(dir string) error {
	ctl := filepath.Join(dir, "cgroup.subtree_control")
	on, _ := os.ReadFile(ctl)
	var want []string
	for _, c := range []string{"memory", "pids"} {
		if !slices.Contains(strings.Fields(string(on)), c) {
			want = append(want, "+"+c)
		}
	}
	if len(want) == 0 {
		return nil
	}
	err := os.WriteFile(ctl, []byte(strings.Join(want, " ")), 0)
	if !errors.Is(err, syscall.EBUSY) {
		return err
	}
	leaf := filepath.Join(dir, cgroupPrefix+"worker")
	if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	procs, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return err
	}
	for _, pid := range strings.Fields(string(procs)) {
		_ = os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(pid), 0)
	}
	return os.WriteFile(ctl, []byte(strings.Join(want, " ")), 0)
}

// sweepStale removes the cgroups of steps whose worker is gone.
func sweepStale(dir string, log *slog.Logger) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), cgroupPrefix)
		pidStr, _, ok2 := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidStr)
		if !ok || !ok2 || err != nil || !e.IsDir() || syscall.Kill(pid, 0) != syscall.ESRCH {
			continue
		}
		sc := &stepCgroup{dirs: []string{filepath.Join(dir, e.Name())}}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if err := sc.remove(ctx); err != nil {
			log.Warn("sandbox: removing the cgroup of a step whose worker is gone", "dir", sc.dirs[0], "err", err)
		}
		cancel()
	}
}

// stepCgroup is the cgroup of one step: a directory per hierarchy.
type stepCgroup struct {
	dirs          []string
	memory, pids  string // the directory of each controller, "" without
	memV2, pidsV2 bool
}

// create makes the cgroup of a step named name with limits l.
func (c *cgroups) create(name string, l Limits) (*stepCgroup, error) {
	sc := &stepCgroup{memV2: c.memV2, pidsV2: c.pidsV2}
	mk := func(parent string) (string, error) {
		d := filepath.Join(parent, name)
		for _, have := range sc.dirs {
			if have == d {
				return d, nil
			}
		}
		if err := os.Mkdir(d, 0o755); err != nil {
			return "", fmt.Errorf("creating the cgroup %s: %w", d, err)
		}
		sc.dirs = append(sc.dirs, d)
		return d, nil
	}
	var err error
	fail := func(err error) (*stepCgroup, error) {
		_ = sc.remove(context.Background())
		return nil, err
	}
	if c.memory != "" {
		if sc.memory, err = mk(c.memory); err != nil {
			return fail(err)
		}
		if l.Memory > 0 {
			if err := sc.setMemory(l.Memory); err != nil {
				return fail(err)
			}
		}
	}
	if c.pids != "" {
		if sc.pids, err = mk(c.pids); err != nil {
			return fail(err)
		}
		if l.Processes > 0 {
			if err := write(sc.pids, "pids.max", strconv.Itoa(l.Processes+overheadTasks)); err != nil {
				return fail(err)
			}
		}
	}
	return sc, nil
}

func (sc *stepCgroup) setMemory(n int64) error {
	v := strconv.FormatInt(n, 10)
	if sc.memV2 {
		if err := write(sc.memory, "memory.max", v); err != nil {
			return err
		}
		_ = write(sc.memory, "memory.swap.max", "0") // absent without swap accounting
		return nil
	}
	if err := write(sc.memory, "memory.limit_in_bytes", v); err != nil {
		return err
	}
	_ = write(sc.memory, "memory.memsw.limit_in_bytes", v) // absent without swap accounting
	return nil
}

func write(dir, file, v string) error {
	if err := os.WriteFile(filepath.Join(dir, file), []byte(v), 0); err != nil {
		return fmt.Errorf("writing %s of the cgroup %s: %w", file, dir, err)
	}
	return nil
}

// join puts process pid in the step's cgroup.
func (sc *stepCgroup) join(pid int) error {
	for _, d := range sc.dirs {
		if err := write(d, "cgroup.procs", strconv.Itoa(pid)); err != nil {
			return err
		}
	}
	return nil
}

// counter reads the value of key in a flat keyed file ("oom_kill 1").
func counter(dir, file, key string) int {
	b, err := os.ReadFile(filepath.Join(dir, file))
	if err != nil {
		return 0
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), " "); ok && k == key {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return 0
}

// oomKills is how many processes the memory limit killed.
func (sc *stepCgroup) oomKills() int {
	switch {
	case sc.memory == "":
		return 0
	case sc.memV2:
		return counter(sc.memory, "memory.events", "oom_kill")
	default:
		return counter(sc.memory, "memory.oom_control", "oom_kill")
	}
}

// forksRefused is how many forks the process limit refused.
func (sc *stepCgroup) forksRefused() int {
	if sc.pids == "" {
		return 0
	}
	return counter(sc.pids, "pids.events", "max")
}

// killAll sends SIGKILL to every process in the step's cgroup.
func (sc *stepCgroup) killAll() {
	for _, d := range sc.dirs {
		if err := os.WriteFile(filepath.Join(d, "cgroup.kill"), []byte("1"), 0); err == nil {
			continue // v2: the kernel kills them all, forks included
		}
		b, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
}

// remove kills what is left of the step and removes its cgroup, waiting
// (until ctx ends) for its processes to be gone.
func (sc *stepCgroup) remove(ctx context.Context) error {
	var errs []error
	for _, d := range sc.dirs {
		err := retry.Do(ctx, retry.Policy{Initial: 5 * time.Millisecond, Max: 100 * time.Millisecond}, func() error {
			(&stepCgroup{dirs: []string{d}}).killAll()
			err := os.Remove(d)
			if errors.Is(err, os.ErrNotExist) {
				return nil
			}
			if err != nil && !errors.Is(err, syscall.EBUSY) {
				return retry.Permanent(err)
			}
			return err
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("removing the cgroup %s: %w", d, err))
		}
	}
	return errors.Join(errs...)
}
