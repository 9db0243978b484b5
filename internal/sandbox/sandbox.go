package sandbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Paths and addresses in the sandbox.
const (
	// WorkDir is the program's work directory and HOME: a tmpfs.
	WorkDir = "/home/pal"
	// IPCDir holds the Unix sockets of Process.Listen.
	IPCDir = "/run/pal/ipc"
	// InitPath is where the worker's binary is bound, read-only.
	InitPath = "/run/pal/" + innerInitName
	// PATH is the program's PATH, in the sandbox and without one.
	PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	// ProxyAddr is where a sandbox with NetworkEgress reaches the
	// worker's proxy.
	ProxyAddr = "127.0.0.1:3128"
	// UID is the host uid (and gid) a root worker's sandboxes run as: one
	// that owns nothing on the host, the same for every sandbox so that
	// the files a program leaves in a writable mount are its own again
	// when a later process (after a crash, on another worker) resumes.
	UID = 2_000_000_000
	// sandboxUID is the program's uid and gid in its user namespace.
	sandboxUID = 1000
)

// Network is what a sandbox may connect to.
type Network string

// Networks.
const (
	NetworkNone   Network = "none"
	NetworkEgress Network = "egress"
)

// DialFunc makes a connection for a sandbox with NetworkEgress.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// Mount is a host path every sandbox sees.
type Mount struct {
	// Host is the path on the host (absolute).
	Host string
	// Path is where the sandbox sees it (default Host).
	Path string
	// Writable makes the mount writable; by default it is read-only.
	Writable bool
}

// Config configures a Runner.
type Config struct {
	// Off runs programs without a sandbox (unsafe): in their own process
	// group, as the worker's user, seeing everything it sees.
	Off bool
	// Bwrap is the bubblewrap binary (default: bwrap on the worker's PATH).
	Bwrap string
	// Mounts are host paths every sandbox sees.
	Mounts []Mount
	// Private are host paths no sandbox may see: one under a mount is
	// hidden by an empty file or directory; a mount inside one is refused.
	Private []string
	// Programs, when not empty, are the only programs a Runner starts:
	// absolute paths, or names looked up on PATH.
	Programs []string
	// Logger receives the Runner's logs (default slog.Default()).
	Logger *slog.Logger
}

// Runner starts programs in sandboxes. It is safe for concurrent use.
type Runner struct {
	cfg      Config
	bwrap    string
	programs map[string]bool // resolved Config.Programs
	log      *slog.Logger
	root     bool

	probeOnce sync.Once
	probeErr  error
	cg        *cgroups // nil: rlimits only
	initBin   string   // the worker's binary, where the sandbox's uid reaches it
}

// seq numbers the cgroups of a worker process's steps.
var seq atomic.Int64

// Programs are the only programs the Runner starts, as configured
// (PAL_PROCESS_PROGRAMS); empty: any the sandbox can see.
func (r *Runner) Programs() []string { return slices.Clone(r.cfg.Programs) }

// ErrUnavailable is wrapped by the error of a Runner that has no
// sandbox: bubblewrap is missing or cannot run here.
var ErrUnavailable = errors.New("no sandbox is available")

// ErrNotAllowed is wrapped by the error of a program that Config.Programs
// does not list.
var ErrNotAllowed = errors.New("program not allowed")

// New returns a Runner. It checks the configuration (mounts and programs
// exist) but not bubblewrap: Available probes it, once.
func New(cfg Config) (*Runner, error) {
	r := &Runner{cfg: cfg, log: cfg.Logger, root: os.Geteuid() == 0}
	if r.log == nil {
		r.log = slog.Default()
	}
	r.cfg.Mounts = slices.Clone(cfg.Mounts)
	r.cfg.Private = make([]string, 0, len(cfg.Private))
	for _, p := range cfg.Private {
		if p != "" {
			r.cfg.Private = append(r.cfg.Private, realPath(p))
		}
	}
	for i, m := range cfg.Mounts {
		if err := r.checkMount(&r.cfg.Mounts[i]); err != nil {
			return nil, fmt.Errorf("mount %s: %w", m.Host, err)
		}
	}
	if len(cfg.Programs) > 0 {
		r.programs = map[string]bool{}
		for _, p := range cfg.Programs {
			real, err := r.lookup(p)
			if err != nil {
				return nil, err
			}
			r.programs[real] = true
		}
	}
	return r, nil
}

// ParseMounts reads a list of mounts: comma-separated HOST[=PATH][:rw].
func ParseMounts(spec string) ([]Mount, error) {
	var out []Mount
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		m := Mount{}
		if s, ok := strings.CutSuffix(item, ":rw"); ok {
			item, m.Writable = s, true
		} else {
			item = strings.TrimSuffix(item, ":ro")
		}
		m.Host, m.Path, _ = strings.Cut(item, "=")
		if !filepath.IsAbs(m.Host) || (m.Path != "" && !filepath.IsAbs(m.Path)) {
			return nil, fmt.Errorf("%q: want an absolute HOST path, optionally =PATH (absolute) and :rw", item)
		}
		out = append(out, m)
	}
	return out, nil
}

// ParsePrograms reads a list of programs: comma- or colon-separated
// absolute paths or names.
func ParsePrograms(spec string) []string {
	return strings.FieldsFunc(spec, func(r rune) bool { return r == ',' || r == ':' || r == ' ' })
}

// reservedPaths are where a mount may not go in the sandbox (nor under
// them; /tmp itself only).
var reservedPaths = append([]string{"/", "/proc", "/dev", "/run/pal", WorkDir, "/tmp", "/etc"}, systemDirs...)

func (r *Runner) checkMount(m *Mount) error {
	m.Host = filepath.Clean(m.Host)
	if m.Path == "" {
		m.Path = m.Host
	}
	m.Path = filepath.Clean(m.Path)
	for _, p := range reservedPaths {
		if m.Path == p || (p != "/" && p != "/tmp" && within(m.Path, p)) {
			return fmt.Errorf("the sandbox path %s is the sandbox's own (%s)", m.Path, p)
		}
	}
	if _, err := os.Stat(m.Host); err != nil {
		return err
	}
	real := realPath(m.Host)
	for _, p := range r.cfg.Private {
		if within(real, p) {
			return fmt.Errorf("it is inside %s, which no sandbox may see", p)
		}
	}
	if r.root && !searchable(real) {
		return errors.New("the sandbox's uid cannot reach it: make its parent directories searchable by others (chmod o+x)")
	}
	return nil
}

// within reports whether p is dir or under it.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// realPath is p made absolute with its symlinks resolved (as far as they
// exist).
func realPath(p string) string {
	p, _ = filepath.Abs(p)
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	return filepath.Clean(p)
}

// Available returns nil when the Runner can start programs: bubblewrap
// works here (or Config.Off). Otherwise its error wraps ErrUnavailable
// and says why. The first call probes, by starting a program in a
// sandbox; later calls return the same answer.
func (r *Runner) Available() error {
	r.probeOnce.Do(func() {
		sweepTempDirs()
		r.cg = detectCgroups(r.log)
		if r.cfg.Off {
			return
		}
		r.probeErr = r.probe()
	})
	return r.probeErr
}

// Off reports whether the Runner runs programs without a sandbox.
func (r *Runner) Off() bool { return r.cfg.Off }

// Describe says how programs run, for a worker's start banner.
func (r *Runner) Describe() string {
	limits := "rlimits"
	if r.cg != nil {
		limits = r.cg.String()
	}
	if r.cfg.Off {
		return "off: programs run unconfined as the worker's user (unsafe); limits: " + limits
	}
	if r.probeErr != nil {
		return "unavailable: " + r.probeErr.Error()
	}
	return fmt.Sprintf("bubblewrap (%s); limits: %s", r.bwrap, limits)
}

func (r *Runner) probe() error {
	bw := r.cfg.Bwrap
	if bw == "" {
		bw = "bwrap"
	}
	path, err := exec.LookPath(bw)
	if err != nil {
		return fmt.Errorf("%w: bubblewrap (%s) is not installed: %v", ErrUnavailable, bw, err)
	}
	r.bwrap = path
	if r.initBin, err = r.initBinary(); err != nil {
		return fmt.Errorf("%w: %v", ErrUnavailable, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var out strings.Builder
	p, err := r.Prepare(Spec{Argv: []string{"/bin/true"}, Stdout: &out, Stderr: &out})
	if err == nil {
		defer p.Close()
		err = p.Start()
	}
	if err != nil {
		return fmt.Errorf("%w: starting bubblewrap (%s): %v", ErrUnavailable, path, err)
	}
	select {
	case <-p.Done():
	case <-ctx.Done():
		p.Kill()
		<-p.Done()
	}
	if res := p.Result(); res.ExitCode != 0 || res.Err != nil {
		msg := strings.TrimSpace(out.String())
		if res.Err != nil {
			msg = res.Err.Error() + ": " + msg
		}
		return fmt.Errorf("%w: bubblewrap (%s) could not run a program (%s); it needs unprivileged user namespaces "+
			"(sysctl user.max_user_namespaces > 0, kernel.unprivileged_userns_clone=1 where it exists)", ErrUnavailable, path, lastLine(msg))
	}
	return nil
}

// The worker's temporary directories: a sandbox's run directory, and the
// directory of the worker's binary (initBinary); each is named after the
// worker's pid, and those of workers that are gone (kill -9) are removed
// when a Runner first probes.
var (
	runDirPrefix = cgroupPrefix + "run-"
	binDirPrefix = cgroupPrefix + "bin-"
)

// sweepTempDirs removes the temporary directories of workers that are
// gone.
func sweepTempDirs() {
	for _, prefix := range []string{runDirPrefix, binDirPrefix} {
		old, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*"))
		for _, d := range old {
			pid, _, _ := strings.Cut(strings.TrimPrefix(filepath.Base(d), prefix), "-")
			if n, err := strconv.Atoi(pid); err == nil && syscall.Kill(n, 0) == syscall.ESRCH {
				_ = os.RemoveAll(d)
			}
		}
	}
}

// initBin is the worker's binary where the sandboxes' uid reaches it,
// found once per process.
var initBin struct {
	once sync.Once
	path string
	err  error
}

// initBinary returns a path of the worker's binary that the sandboxes'
// uid can reach, for bwrap to bind: the binary itself, or else a link (or
// copy) in a directory of the worker's that it may search, made once per
// worker process. Such directories left by workers that are gone are
// removed.
func (r *Runner) initBinary() (string, error) {
	initBin.once.Do(func() { initBin.path, initBin.err = linkInitBinary(r.root) })
	return initBin.path, initBin.err
}

func linkInitBinary(root bool) (string, error) {
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("finding the worker's binary: %w", err)
	}
	exe = realPath(exe)
	if !root || searchable(exe) {
		return exe, nil
	}
	dir, err := os.MkdirTemp("", fmt.Sprintf("%s%d-", binDirPrefix, os.Getpid()))
	if err == nil {
		err = os.Chmod(dir, 0o711)
	}
	if err != nil {
		return "", fmt.Errorf("making a directory for the worker's binary: %w", err)
	}
	bin := filepath.Join(dir, innerInitName)
	if err := linkOrCopy(exe, bin); err != nil {
		return "", fmt.Errorf("linking the worker's binary %s where the sandbox reaches it: %w", exe, err)
	}
	return bin, nil
}

// Resolve returns the path of the program argv0 names (a name is looked
// up on PATH) as the sandbox sees it, and checks Config.Programs. An
// error wraps ErrNotAllowed when the program is not listed.
func (r *Runner) Resolve(argv0 string) (string, error) {
	p := argv0
	if !strings.Contains(p, "/") {
		var err error
		if p, err = r.findOnPath(p); err != nil {
			return "", err
		}
	}
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("the program %q is neither a name on PATH nor an absolute path", argv0)
	}
	host := r.hostPath(filepath.Clean(p))
	st, err := os.Stat(host)
	if err != nil {
		return "", fmt.Errorf("the program %s: %w", p, err)
	}
	if !st.Mode().IsRegular() || st.Mode().Perm()&0o111 == 0 {
		return "", fmt.Errorf("the program %s is not an executable file", p)
	}
	if r.programs != nil && !r.programs[realPath(host)] {
		return "", fmt.Errorf("%w: %s is not one of the programs this worker runs", ErrNotAllowed, p)
	}
	if r.cfg.Off {
		return host, nil // no sandbox: the program sees the host
	}
	return filepath.Clean(p), nil
}

// lookup resolves a Config.Programs entry to its real host path.
func (r *Runner) lookup(p string) (string, error) {
	if !strings.Contains(p, "/") {
		var err error
		if p, err = r.findOnPath(p); err != nil {
			return "", err
		}
	}
	if !filepath.IsAbs(p) {
		return "", fmt.Errorf("program %q: want an absolute path or a name on %s", p, PATH)
	}
	if _, err := os.Stat(r.hostPath(p)); err != nil {
		return "", fmt.Errorf("program %s: %w", p, err)
	}
	return realPath(r.hostPath(p)), nil
}

// findOnPath looks name up on PATH, as the sandbox would.
func (r *Runner) findOnPath(name string) (string, error) {
	for _, dir := range filepath.SplitList(PATH) {
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode().Perm()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("the program %q is not on the sandbox's PATH (%s)", name, PATH)
}

// hostPath is the host path of a path the sandbox sees: under a mount's
// Path, the mount's Host; else the same path.
func (r *Runner) hostPath(p string) string {
	best := -1
	for i, m := range r.cfg.Mounts {
		if within(p, m.Path) && (best < 0 || len(m.Path) > len(r.cfg.Mounts[best].Path)) {
			best = i
		}
	}
	if best < 0 {
		return p
	}
	m := r.cfg.Mounts[best]
	return filepath.Join(m.Host, strings.TrimPrefix(p, m.Path))
}

// mounted reports whether the sandbox sees p through a mount.
func (r *Runner) mounted(p string) bool {
	return slices.ContainsFunc(r.cfg.Mounts, func(m Mount) bool { return within(p, m.Path) })
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}
