package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Limits bound a program. Zero means no limit, except Disk.
type Limits struct {
	// Memory bounds the memory of the program and its descendants, the
	// files of its tmpfs included, in bytes.
	Memory int64
	// CPU bounds the CPU time of each process, in whole seconds.
	CPU time.Duration
	// Processes bounds the processes and threads alive at once.
	Processes int
	// FileSize bounds the size of a file written, in bytes.
	FileSize int64
	// Disk is the size of the work directory, of /tmp and of /dev/shm,
	// each (default 256 MiB).
	Disk int64
}

// DefaultDisk is Limits.Disk when it is 0.
const DefaultDisk = 256 << 20

// Spec is a program to run.
type Spec struct {
	// Argv is the program and its arguments; Argv[0] is what Resolve
	// returned.
	Argv []string
	// Env is the program's environment (KEY=value) besides PATH, HOME,
	// TMPDIR and LANG, which the sandbox sets (and the proxy variables
	// with NetworkEgress).
	Env []string
	// Dir is where the program starts: relative to WorkDir, or absolute.
	Dir     string
	Network Network
	// Dial makes the connections of NetworkEgress.
	Dial   DialFunc
	Limits Limits
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
	// ExtraFiles are the program's descriptors from 3 on.
	ExtraFiles []*os.File
}

// waitDelay bounds the wait for the program's output once it has exited
// (a process it left behind without a sandbox may hold stdout open).
const waitDelay = 5 * time.Second

// Process is a program prepared or running in a sandbox.
type Process struct {
	r      *Runner
	spec   Spec
	uid    int // the host uid it runs as; -1: the worker's
	runDir string
	cg     *stepCgroup
	proxy  *egressProxy
	lns    []net.Listener
	cmd    *exec.Cmd
	ctl    *os.File // the init's control pipe (with a sandbox)
	tail   tail     // the end of stderr, for the limits rlimits leave unnamed

	done      chan struct{}
	res       Result
	mu        sync.Mutex
	stoppedBy Limit // a limit the worker stopped it for
	closeOnce sync.Once
}

// Prepare makes the sandbox of a program: its run directory, its cgroup
// and, with NetworkEgress, its proxy. Listen adds sockets; Start starts
// it; Close removes it all.
func (r *Runner) Prepare(spec Spec) (*Process, error) {
	if len(spec.Argv) == 0 || !filepath.IsAbs(spec.Argv[0]) {
		return nil, errors.New("sandbox: Argv[0] must be the absolute path Resolve returns")
	}
	if spec.Limits.Disk <= 0 {
		spec.Limits.Disk = DefaultDisk
	}
	spec.Limits.CPU = spec.Limits.CPU.Round(time.Second)
	p := &Process{r: r, spec: spec, uid: -1, done: make(chan struct{})}
	if r.root && !r.cfg.Off {
		p.uid = UID
	}
	var err error
	if p.runDir, err = os.MkdirTemp("", fmt.Sprintf("%s%d-", runDirPrefix, os.Getpid())); err != nil {
		return nil, fmt.Errorf("sandbox: making the run directory: %w", err)
	}
	if err := p.prepare(); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

func (p *Process) prepare() error {
	dirs := []string{"ipc"}
	if p.r.cfg.Off {
		dirs = append(dirs, "work")
	}
	for _, d := range dirs {
		if err := os.Mkdir(filepath.Join(p.runDir, d), 0o700); err != nil {
			return err
		}
	}
	if !p.r.cfg.Off {
		if err := writeEtc(p.runDir); err != nil {
			return fmt.Errorf("sandbox: writing its /etc: %w", err)
		}
	}
	if p.uid >= 0 {
		err := filepath.WalkDir(p.runDir, func(path string, _ os.DirEntry, err error) error {
			if err != nil {
				return err
			}
			return os.Lchown(path, p.uid, p.uid)
		})
		if err != nil {
			return fmt.Errorf("sandbox: giving the run directory to uid %d: %w", p.uid, err)
		}
	}
	if p.r.cg != nil {
		name := fmt.Sprintf("%s%d-%d", cgroupPrefix, os.Getpid(), seq.Add(1))
		var err error
		if p.cg, err = p.r.cg.create(name, p.spec.Limits); err != nil {
			return fmt.Errorf("sandbox: %w", err)
		}
	}
	if p.spec.Network == NetworkEgress {
		ln, _, err := p.Listen("egress.sock")
		if err != nil {
			return err
		}
		p.proxy = serveEgress(ln, p.spec.Dial, p.r.log)
	}
	return nil
}

// Listen makes a Unix socket the program can connect to, and returns it
// with its path as the program sees it. Only this program sees it.
func (p *Process) Listen(name string) (net.Listener, string, error) {
	host := filepath.Join(p.runDir, "ipc", name)
	ln, err := net.Listen("unix", host)
	if err != nil {
		return nil, "", fmt.Errorf("sandbox: listening on %s: %w", host, err)
	}
	err = os.Chmod(host, 0o600)
	if err == nil && p.uid >= 0 {
		err = os.Chown(host, p.uid, p.uid)
	}
	if err != nil {
		ln.Close()
		return nil, "", fmt.Errorf("sandbox: %s: %w", host, err)
	}
	p.lns = append(p.lns, ln)
	if p.r.cfg.Off {
		return ln, host, nil
	}
	return ln, IPCDir + "/" + name, nil
}

// SetEnv sets a variable of the program's environment (a socket's path);
// call it before Start.
func (p *Process) SetEnv(key, value string) {
	p.spec.Env = append(p.spec.Env, key+"="+value)
}

// env is the program's environment: the spec's, with PATH, HOME, TMPDIR
// (and the proxy variables) the sandbox's own, and LANG C.UTF-8 unless the
// spec sets it.
func (p *Process) env() []string {
	own := map[string]string{"PATH": PATH, "HOME": WorkDir, "TMPDIR": "/tmp"}
	if p.r.cfg.Off {
		own["HOME"], own["TMPDIR"] = filepath.Join(p.runDir, "work"), os.TempDir()
	}
	if p.spec.Network == NetworkEgress {
		for _, k := range []string{"HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"} {
			own[k] = "http://" + ProxyAddr
		}
	}
	env := make([]string, 0, len(p.spec.Env)+len(own)+1)
	lang := false
	for _, kv := range p.spec.Env {
		k, _, _ := strings.Cut(kv, "=")
		if _, mine := own[k]; !mine {
			env = append(env, kv)
			lang = lang || k == "LANG"
		}
	}
	if !lang {
		env = append(env, "LANG=C.UTF-8")
	}
	for k, v := range own {
		env = append(env, k+"="+v)
	}
	return env
}

// rlimits are the rlimits of the program: the ones the cgroup does not
// cover, and no core files.
func (p *Process) rlimits() []rlimit {
	l := p.spec.Limits
	out := []rlimit{{Resource: syscall.RLIMIT_CORE}}
	if l.CPU > 0 {
		s := uint64(l.CPU / time.Second)
		out = append(out, rlimit{Resource: syscall.RLIMIT_CPU, Cur: s, Max: s + 1})
	}
	if l.FileSize > 0 {
		out = append(out, rlimit{Resource: syscall.RLIMIT_FSIZE, Cur: uint64(l.FileSize), Max: uint64(l.FileSize)})
	}
	if l.Memory > 0 && (p.cg == nil || p.cg.memory == "") {
		out = append(out, rlimit{Resource: syscall.RLIMIT_AS, Cur: uint64(l.Memory), Max: uint64(l.Memory)})
	}
	if l.Processes > 0 && (p.cg == nil || p.cg.pids == "") {
		n := uint64(l.Processes + overheadTasks)
		out = append(out, rlimit{Resource: rlimitNPROC, Cur: n, Max: n})
	}
	return out
}

// rlimitNPROC is RLIMIT_NPROC on Linux.
const rlimitNPROC = 6

// Start starts the program.
func (p *Process) Start() error {
	if p.cmd != nil {
		return errors.New("sandbox: started twice")
	}
	cmd, status, syncW, err := p.command()
	if err != nil {
		return err
	}
	defer syncW.Close()
	err = cmd.Start()
	closeFrom(cmd.ExtraFiles, len(p.spec.ExtraFiles)) // the child has its copies
	if err != nil {
		if status != nil {
			status.Close()
		}
		return fmt.Errorf("sandbox: starting %s: %w", p.spec.Argv[0], err)
	}
	p.cmd = cmd
	if p.cg != nil {
		if err := p.cg.join(cmd.Process.Pid); err != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			p.res = Result{ExitCode: -1, Err: err}
			close(p.done)
			return fmt.Errorf("sandbox: %w", err)
		}
	}
	// The shim may go on: it is in the step's cgroup.
	if _, err := syncW.Write([]byte{'g'}); err != nil {
		_ = cmd.Process.Kill()
	}
	var st chan initStatus
	if status != nil {
		st = make(chan initStatus, 1)
		go func() {
			defer status.Close()
			v, err := readStatus(status)
			if err != nil {
				v.Err = err.Error()
			}
			st <- v
		}()
	}
	go p.wait(st)
	go p.watchForks()
	return nil
}

// command builds the host shim's command: it waits on the sync pipe
// (returned with the status pipe's read end, without a sandbox nil), then
// executes bwrap, or the program itself without a sandbox.
func (p *Process) command() (cmd *exec.Cmd, status, syncW *os.File, err error) {
	syncR, syncW, err := os.Pipe()
	if err != nil {
		return nil, nil, nil, err
	}
	fds := &fdTable{files: append([]*os.File(nil), p.spec.ExtraFiles...)}
	shim := execConfig{Sync: fds.add(syncR)}
	fail := func(err error) (*exec.Cmd, *os.File, *os.File, error) {
		closeFrom(fds.files, len(p.spec.ExtraFiles))
		syncW.Close()
		if status != nil {
			status.Close()
		}
		return nil, nil, nil, err
	}
	var target []string
	if p.r.cfg.Off {
		shim.Rlimits = p.rlimits()
		target = append([]string{p.spec.Argv[0]}, p.spec.Argv...)
	} else {
		var statusW, ctlR *os.File
		if status, statusW, err = os.Pipe(); err != nil {
			return fail(err)
		}
		statusFd := fds.add(statusW)
		if ctlR, p.ctl, err = os.Pipe(); err != nil {
			return fail(err)
		}
		inner := innerConfig{Extra: len(p.spec.ExtraFiles), Status: statusFd, Control: fds.add(ctlR),
			Exec: execConfig{Rlimits: p.rlimits()}, Watch: []string{WorkDir, "/tmp", "/dev/shm"}}
		if p.spec.Network == NetworkEgress {
			inner.Proxy, inner.ProxySocket = ProxyAddr, IPCDir+"/egress.sock"
		}
		args, err := p.bwrapArgs(inner)
		if err != nil {
			return fail(err)
		}
		target = append([]string{p.r.bwrap, p.r.bwrap}, args...)
	}
	cfg, _ := json.Marshal(shim)
	cmd = &exec.Cmd{Path: "/proc/self/exe", Args: append([]string{execName, string(cfg)}, target...),
		Env: p.env(), Stdin: p.spec.Stdin, Stdout: p.spec.Stdout, Stderr: io.MultiWriter(orDiscard(p.spec.Stderr), &p.tail),
		ExtraFiles: fds.files, WaitDelay: waitDelay,
		SysProcAttr: &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}}
	if p.r.cfg.Off {
		if cmd.Dir = p.spec.Dir; cmd.Dir == "" {
			cmd.Dir = filepath.Join(p.runDir, "work")
		}
	}
	if p.uid >= 0 {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: uint32(p.uid), Gid: uint32(p.uid)}
	}
	return cmd, status, syncW, nil
}

func orDiscard(w io.Writer) io.Writer {
	if w == nil {
		return io.Discard
	}
	return w
}

// closeFrom closes files[from:], the parent's copies of the child's
// descriptors.
func closeFrom(files []*os.File, from int) {
	for _, f := range files[from:] {
		f.Close()
	}
}

// Pid is the host pid of the process the worker started (bwrap's, or the
// program's without a sandbox).
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the program has ended and Result is ready.
func (p *Process) Done() <-chan struct{} { return p.done }

// Result is how the program ended; call it after Done.
func (p *Process) Result() Result {
	<-p.done
	return p.res
}

// Terminate asks every process of the program to stop (SIGTERM).
func (p *Process) Terminate() {
	if p.cmd == nil {
		return
	}
	if p.r.cfg.Off {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
		p.signalCgroup(syscall.SIGTERM)
		return
	}
	_, _ = p.ctl.Write([]byte{ctlTerminate})
}

// Kill ends every process of the program at once.
func (p *Process) Kill() {
	if p.cmd == nil {
		return
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	if p.cg != nil {
		p.cg.killAll()
	}
}

func (p *Process) signalCgroup(sig syscall.Signal) {
	if p.cg == nil {
		return
	}
	for _, d := range p.cg.dirs {
		b, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		for _, f := range strings.Fields(string(b)) {
			if pid, err := strconv.Atoi(f); err == nil {
				_ = syscall.Kill(pid, sig)
			}
		}
	}
}

// Close kills what is left of the program and removes its sandbox: its
// sockets, proxy, cgroup and run directory.
func (p *Process) Close() error {
	var err error
	p.closeOnce.Do(func() {
		if p.cmd != nil {
			p.Kill()
			<-p.done
		}
		if p.ctl != nil {
			p.ctl.Close()
		}
		if p.proxy != nil {
			p.proxy.close()
		}
		for _, ln := range p.lns {
			ln.Close()
		}
		if p.cg != nil {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			err = p.cg.remove(ctx)
			cancel()
		}
		err = errors.Join(err, os.RemoveAll(p.runDir))
	})
	return err
}
