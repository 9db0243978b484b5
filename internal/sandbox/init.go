package sandbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The sandbox's own processes are the worker's binary started again under
// another name (the re-exec pattern): Init, called first thing in main,
// runs them and never returns then.
const (
	// execName is the exec shim: it waits until it may go, sets its
	// rlimits and executes the target. Outside the sandbox it is the host
	// init (before bwrap, or before the program without a sandbox); in
	// the sandbox it starts the program for the init.
	execName = "pal-sandbox-exec"
	// innerInitName is the init in the sandbox, the program's parent.
	innerInitName = "pal-sandbox"
)

// Init runs the sandbox's processes when the running binary was started
// as one of them, and then exits; otherwise it returns at once. Call it
// first thing in main, and in TestMain of tests that start sandboxes.
func Init() {
	if len(os.Args) < 3 {
		return
	}
	switch filepath.Base(os.Args[0]) {
	case execName:
		os.Exit(execShim(os.Args[1], os.Args[2:]))
	case innerInitName:
		os.Exit(innerInit(os.Args[1], os.Args[2:]))
	}
}

// execConfig configures the exec shim.
type execConfig struct {
	// Sync, when not 0, is a pipe to read one byte from before going on:
	// the worker has put the shim in the step's cgroups.
	Sync    int      `json:"sync,omitempty"`
	Rlimits []rlimit `json:"rlimits,omitempty"`
}

type rlimit struct {
	Resource int    `json:"resource"`
	Cur      uint64 `json:"cur"`
	Max      uint64 `json:"max"`
}

// execShim runs as execName: args are the target's path and argv.
func execShim(config string, args []string) int {
	var c execConfig
	if err := json.Unmarshal([]byte(config), &c); err != nil || len(args) < 2 {
		fmt.Fprintf(os.Stderr, "pal sandbox: bad exec configuration: %v\n", err)
		return 125
	}
	if c.Sync != 0 {
		f := os.NewFile(uintptr(c.Sync), "sync")
		b := make([]byte, 1)
		if n, _ := f.Read(b); n != 1 {
			return 125 // the worker gave up before the start
		}
		f.Close()
	}
	for _, l := range c.Rlimits {
		if err := syscall.Setrlimit(l.Resource, &syscall.Rlimit{Cur: l.Cur, Max: l.Max}); err != nil {
			fmt.Fprintf(os.Stderr, "pal sandbox: setting rlimit %d: %v\n", l.Resource, err)
			return 125
		}
	}
	err := syscall.Exec(args[0], args[1:], os.Environ())
	fmt.Fprintf(os.Stderr, "pal sandbox: executing %s: %v\n", args[0], err)
	return 127
}

// innerConfig configures the init in the sandbox.
type innerConfig struct {
	// Extra fds from 3 on go to the program as they are.
	Extra   int `json:"extra"`
	Status  int `json:"status"`
	Control int `json:"control"`
	// Exec configures the shim that starts the program (its rlimits).
	Exec execConfig `json:"exec"`
	// Proxy, when set, is where to listen for connections to relay to
	// the Unix socket ProxySocket.
	Proxy       string `json:"proxy,omitempty"`
	ProxySocket string `json:"proxy_socket,omitempty"`
	// Watch are tmpfs mounts: when one fills up, everything is stopped.
	Watch []string `json:"watch,omitempty"`
}

// initStatus is how the program ended, as the init reports it.
type initStatus struct {
	Code   int    `json:"code"`
	Signal int    `json:"signal,omitempty"`
	CPUMs  int64  `json:"cpu_ms"`
	Full   string `json:"full,omitempty"`
	Err    string `json:"error,omitempty"`
}

// ctlTerminate is what the worker writes to the init's control pipe to
// terminate the program.
const ctlTerminate = 't'

// innerInit runs as innerInitName in the sandbox: args are the program's
// argv, args[0] its path.
func innerInit(config string, args []string) int {
	var c innerConfig
	if err := json.Unmarshal([]byte(config), &c); err != nil || len(args) < 1 {
		fmt.Fprintf(os.Stderr, "pal sandbox: bad init configuration: %v\n", err)
		return 125
	}
	// The program, under the same uid, may not read the init's memory or
	// open its descriptors (/proc/1/fd): it could forge the status.
	_ = unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0)
	closeInherited(3 + c.Extra)
	status := os.NewFile(uintptr(c.Status), "status")
	report := func(st initStatus) int {
		b, _ := json.Marshal(st)
		_, _ = status.Write(b)
		if st.Signal != 0 {
			return 128 + st.Signal
		}
		return st.Code
	}
	if c.Proxy != "" {
		if err := forward(c.Proxy, c.ProxySocket); err != nil {
			return report(initStatus{Code: 126, Err: "starting the egress relay: " + err.Error()})
		}
	}
	shim, _ := json.Marshal(c.Exec)
	cmd := &exec.Cmd{Path: InitPath, Args: append([]string{execName, string(shim), args[0]}, args...),
		Env: os.Environ(), Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr,
		SysProcAttr: &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}}
	for fd := 3; fd < 3+c.Extra; fd++ {
		cmd.ExtraFiles = append(cmd.ExtraFiles, os.NewFile(uintptr(fd), "extra"))
	}
	if err := cmd.Start(); err != nil {
		return report(initStatus{Code: 127, Err: fmt.Sprintf("starting %s: %v", args[0], err)})
	}
	relayStops(c.Control)
	full := make(chan string, 1)
	stop := make(chan struct{})
	go watchFull(c.Watch, full, stop)
	err := cmd.Wait()
	close(stop)
	st := statusOf(cmd.ProcessState, err)
	select {
	case st.Full = <-full:
	default:
		st.Full = fullOne(c.Watch)
	}
	return report(st)
}

// relayStops passes a terminate (SIGTERM to the init, or ctlTerminate on
// the control pipe) to every process of the sandbox but PID 1 and the
// init itself, setsid and new process groups regardless.
func relayStops(control int) {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	go func() {
		for range sigs {
			_ = syscall.Kill(-1, syscall.SIGTERM)
		}
	}()
	go func() {
		ctl := os.NewFile(uintptr(control), "control")
		b := make([]byte, 1)
		for {
			if _, err := ctl.Read(b); err != nil {
				return
			}
			if b[0] == ctlTerminate {
				_ = syscall.Kill(-1, syscall.SIGTERM)
			}
		}
	}()
}

// statusOf is how the program ended.
func statusOf(ps *os.ProcessState, err error) initStatus {
	if ps == nil {
		return initStatus{Code: 127, Err: fmt.Sprint(err)}
	}
	st := initStatus{CPUMs: (ps.UserTime() + ps.SystemTime()).Milliseconds()}
	ws := ps.Sys().(syscall.WaitStatus)
	st.Code = ws.ExitStatus()
	if ws.Signaled() {
		st.Code, st.Signal = -1, int(ws.Signal())
	}
	return st
}

// closeInherited marks every descriptor from first on close-on-exec: what
// bwrap and the worker left open reaches no program.
func closeInherited(first int) {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return
	}
	for _, e := range entries {
		if fd, err := strconv.Atoi(e.Name()); err == nil && fd >= first {
			syscall.CloseOnExec(fd)
		}
	}
}

// watchFull stops every process of the sandbox when one of the tmpfs
// paths fills up, and sends its path on full.
func watchFull(paths []string, full chan<- string, stop <-chan struct{}) {
	if len(paths) == 0 {
		return
	}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			if p := fullOne(paths); p != "" {
				_ = syscall.Kill(-1, syscall.SIGKILL)
				full <- p
				return
			}
		}
	}
}

// fullOne returns the first of paths whose filesystem has no block left.
func fullOne(paths []string) string {
	for _, p := range paths {
		var s syscall.Statfs_t
		if syscall.Statfs(p, &s) == nil && s.Blocks > 0 && s.Bavail == 0 {
			return p
		}
	}
	return ""
}

// errStatus is a status the init did not write.
var errStatus = errors.New("the sandbox's init reported nothing")

// readStatus reads the init's report from r.
func readStatus(r io.Reader) (initStatus, error) {
	b, err := io.ReadAll(io.LimitReader(r, 64<<10))
	if err != nil {
		return initStatus{}, err
	}
	if len(b) == 0 {
		return initStatus{}, errStatus
	}
	var st initStatus
	if err := json.Unmarshal(b, &st); err != nil {
		return initStatus{}, fmt.Errorf("the sandbox's init reported %q: %w", b, err)
	}
	return st, nil
}
