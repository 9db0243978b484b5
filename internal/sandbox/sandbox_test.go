package sandbox_test

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/internal/sandbox"
)

const python = "/usr/bin/python3"

// newRunner returns a Runner with cfg whose sandbox works.
func newRunner(t *testing.T, cfg sandbox.Config) *sandbox.Runner {
	t.Helper()
	r, err := sandbox.New(cfg)
	require.NoError(t, err)
	require.NoError(t, r.Available())
	return r
}

// output is what a program wrote and how it ended.
type output struct {
	stdout, stderr string
	res            sandbox.Result
}

// lockedBuf is a buffer safe for the copying goroutines of os/exec.
type lockedBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// run runs spec to its end (at most a minute) and removes its sandbox.
func run(t *testing.T, r *sandbox.Runner, spec sandbox.Spec) output {
	t.Helper()
	p := start(t, r, spec)
	return finish(t, p)
}

var outputs sync.Map // *sandbox.Process → [2]*lockedBuf

func start(t *testing.T, r *sandbox.Runner, spec sandbox.Spec) *sandbox.Process {
	t.Helper()
	p := prepare(t, r, spec)
	require.NoError(t, p.Start())
	return p
}

// prepare resolves spec's program and prepares it, capturing its output.
func prepare(t *testing.T, r *sandbox.Runner, spec sandbox.Spec) *sandbox.Process {
	t.Helper()
	path, err := r.Resolve(spec.Argv[0])
	require.NoError(t, err)
	spec.Argv = append([]string{path}, spec.Argv[1:]...)
	out, errb := &lockedBuf{}, &lockedBuf{}
	spec.Stdout, spec.Stderr = out, errb
	p, err := r.Prepare(spec)
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	outputs.Store(p, [2]*lockedBuf{out, errb})
	return p
}

func finish(t *testing.T, p *sandbox.Process) output {
	t.Helper()
	select {
	case <-p.Done():
	case <-time.After(time.Minute):
		p.Kill()
		t.Fatal("the program did not end within a minute")
	}
	bufs, _ := outputs.Load(p)
	b := bufs.([2]*lockedBuf)
	require.NoError(t, p.Close())
	return output{stdout: b[0].String(), stderr: b[1].String(), res: p.Result()}
}

// pyJSON runs a Python script in a sandbox and decodes the JSON it prints.
func pyJSON(t *testing.T, r *sandbox.Runner, spec sandbox.Spec, script string, into any) output {
	t.Helper()
	spec.Argv = []string{python, "-c", script}
	o := run(t, r, spec)
	require.True(t, o.res.OK(), "%+v\nstdout: %s\nstderr: %s", o.res, o.stdout, o.stderr)
	require.NoError(t, json.Unmarshal([]byte(o.stdout), into), o.stdout)
	return o
}

// probes tries what a hostile program would try; each entry says what it
// got (an error message, or "GOT: …").
const probes = `
import json, os, socket, sys
out = {}
def attempt(name, fn):
    try:
        out[name] = "GOT: " + str(fn())[:200]
    except Exception as e:
        out[name] = type(e).__name__ + ": " + str(e)[:200]
def read(p):
    with open(p, "rb") as f:
        return f.read()
def write(p):
    with open(p, "w") as f:
        f.write("x")
    return p
def connect(host, port):
    s = socket.create_connection((host, port), timeout=2)
    s.close()
    return "connected"
data = os.environ["DATA_DIR"]
for f in ["nats-admin.nk", "pal.key", "dev.env"]:
    attempt("read " + f, lambda f=f: read(os.path.join(data, f)))
    attempt("read mounted " + f, lambda f=f: read(os.path.join("/srv/repo/.pal", f)))
attempt("list data dir", lambda: os.listdir(data))
attempt("list mounted data dir", lambda: os.listdir("/srv/repo/.pal"))
attempt("worker environ", lambda: read("/proc/%s/environ" % os.environ["WORKER_PID"]))
def environs():
    found = []
    for p in os.listdir("/proc"):
        try:
            if p.isdigit() and b"NEIGHBOUR_SECRET" in read("/proc/%s/environ" % p):
                found.append(p)
        except OSError:
            pass
    if not found:
        raise LookupError("no process with the neighbour's environment")
    return found
attempt("other environs", environs)
attempt("kill worker", lambda: os.kill(int(os.environ["WORKER_PID"]), 9))
attempt("connect nats", lambda: connect("127.0.0.1", int(os.environ["NATS_PORT"])))
attempt("connect metadata", lambda: connect("169.254.169.254", 80))
for p in ["/escape", "/usr/escape", "/etc/escape", "/srv/repo/escape", "/run/pal/ipc/escape", "/dev/escape", data + "/escape"]:
    attempt("write " + p, lambda p=p: write(p))
attempt("write work", lambda: write("/home/pal/ok"))
attempt("write tmp", lambda: write("/tmp/ok"))
out["processes"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
out["env"] = sorted(os.environ)
out["uid"] = os.getuid()
print(json.dumps(out))
`

// TestSandboxSeesNothingOfTheWorker: a program that reads the worker's
// keys, its environment and another sandbox's, lists its data directory,
// connects to the host's loopback and the metadata address, kills the
// worker and writes outside its work directory gets nothing.
func TestSandboxSeesNothingOfTheWorker(t *testing.T) {
	t.Parallel()
	repo := t.TempDir()
	require.NoError(t, os.Chmod(repo, 0o755))
	require.NoError(t, os.Chmod(filepath.Dir(repo), 0o755))
	data := filepath.Join(repo, ".pal")
	require.NoError(t, os.Mkdir(data, 0o755))
	for _, f := range []string{"nats-admin.nk", "pal.key", "dev.env"} {
		require.NoError(t, os.WriteFile(filepath.Join(data, f), []byte("SECRET-"+f), 0o644))
	}
	nats, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer nats.Close()
	accepted := make(chan struct{}, 1)
	go func() {
		if c, err := nats.Accept(); err == nil {
			c.Close()
			accepted <- struct{}{}
		}
	}()
	r := newRunner(t, sandbox.Config{Mounts: []sandbox.Mount{{Host: repo, Path: "/srv/repo"}}, Private: []string{data}})

	// A neighbour: another sandbox whose environment holds a secret.
	neighbour := start(t, r, sandbox.Spec{Argv: []string{"/bin/sleep", "60"}, Env: []string{"NEIGHBOUR_SECRET=s3cr3t"}})

	var got map[string]any
	o := pyJSON(t, r, sandbox.Spec{Env: []string{"DATA_DIR=" + data, "WORKER_PID=" + strconv.Itoa(os.Getpid()),
		"NATS_PORT=" + strconv.Itoa(nats.Addr().(*net.TCPAddr).Port)}}, probes, &got)
	t.Logf("%s", o.stdout)
	for k, v := range got {
		switch {
		case k == "env" || k == "uid" || k == "processes":
		case k == "write work" || k == "write tmp":
			require.Contains(t, v, "GOT:", k)
		case k == "list mounted data dir":
			require.Equal(t, "GOT: []", v, "the data directory under a mount is an empty directory")
		default:
			require.NotContains(t, v, "GOT:", k)
		}
	}
	require.NotContains(t, o.stdout, "SECRET-")
	require.NotContains(t, o.stdout, "s3cr3t")
	require.Equal(t, []any{"DATA_DIR", "HOME", "LANG", "NATS_PORT", "PATH", "PWD", "TMPDIR", "WORKER_PID"}, withoutPythonVars(got["env"]))
	require.EqualValues(t, 1000, got["uid"])
	require.Len(t, got["processes"], 3, "bwrap's PID 1, the sandbox's init, the program: nothing else")
	select {
	case <-accepted:
		t.Fatal("the sandbox reached the worker's loopback")
	default:
	}
	require.NoError(t, syscall.Kill(os.Getpid(), 0)) // the worker lives

	neighbour.Kill()
	finish(t, neighbour)
}

// withoutPythonVars drops what the interpreter adds to its own environment.
func withoutPythonVars(v any) []any {
	var out []any
	for _, k := range v.([]any) {
		if k != "LC_CTYPE" {
			out = append(out, k)
		}
	}
	return out
}

// TestSandboxRefusesAMountInsideAPrivatePath: the data directory cannot be
// mounted, nor anything in it; an unknown bwrap leaves no sandbox.
func TestSandboxRefusesAMountInsideAPrivatePath(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	_, err := sandbox.New(sandbox.Config{Mounts: []sandbox.Mount{{Host: data}}, Private: []string{data}})
	require.ErrorContains(t, err, "no sandbox may see")
	for _, at := range []string{"/proc/x", "/", "/tmp", "/home/pal/x", "/usr/local/x", "/bin/x", "/run/pal/ipc"} {
		_, err = sandbox.New(sandbox.Config{Mounts: []sandbox.Mount{{Host: data, Path: at}}})
		require.ErrorContains(t, err, "the sandbox's own", at)
	}
	// As root the sandbox's uid must reach a mount: t.TempDir's parent is
	// 0700.
	_, err = sandbox.New(sandbox.Config{Mounts: []sandbox.Mount{{Host: data, Path: "/tmp/x"}}})
	if os.Geteuid() == 0 {
		require.ErrorContains(t, err, "the sandbox's uid cannot reach it")
	} else {
		require.NoError(t, err)
	}
	require.NoError(t, os.Chmod(filepath.Dir(data), 0o755))
	_, err = sandbox.New(sandbox.Config{Mounts: []sandbox.Mount{{Host: data, Path: "/tmp/x"}}})
	require.NoError(t, err)

	r, err := sandbox.New(sandbox.Config{Bwrap: "/nonexistent/bwrap"})
	require.NoError(t, err)
	err = r.Available()
	require.ErrorIs(t, err, sandbox.ErrUnavailable)
	require.ErrorContains(t, err, "not installed")
}

func TestParseMounts(t *testing.T) {
	t.Parallel()
	ms, err := sandbox.ParseMounts(" /opt/agent , /srv/repo=/opt/pal, /tmp/out:rw,/a=/b:ro")
	require.NoError(t, err)
	require.Equal(t, []sandbox.Mount{{Host: "/opt/agent"}, {Host: "/srv/repo", Path: "/opt/pal"},
		{Host: "/tmp/out", Writable: true}, {Host: "/a", Path: "/b"}}, ms)
	for _, bad := range []string{"relative", "/a=relative", "=/b"} {
		_, err := sandbox.ParseMounts(bad)
		require.Error(t, err, bad)
	}
	require.Equal(t, []string{"python3", "/usr/bin/env", "/opt/x"}, sandbox.ParsePrograms("python3,/usr/bin/env:/opt/x"))
}

// TestSandboxProgramsAllowlist: a program not listed is refused before
// anything starts; a listed one, by name or by path, runs.
func TestSandboxProgramsAllowlist(t *testing.T) {
	t.Parallel()
	r, err := sandbox.New(sandbox.Config{Programs: []string{"echo", "/usr/bin/python3"}})
	require.NoError(t, err)
	for _, ok := range []string{"echo", "/bin/echo", "/usr/bin/echo", "python3", "/usr/bin/python3.11"} {
		_, err := r.Resolve(ok)
		require.NoError(t, err, ok)
	}
	for _, bad := range []string{"sh", "/bin/sh", "cat", "/usr/bin/env"} {
		_, err := r.Resolve(bad)
		require.ErrorIs(t, err, sandbox.ErrNotAllowed, bad)
	}
	_, err = r.Resolve("no-such-program")
	require.ErrorContains(t, err, "not on the sandbox's PATH")
	_, err = r.Resolve("bin/echo")
	require.ErrorContains(t, err, "neither a name on PATH nor an absolute path")
	_, err = sandbox.New(sandbox.Config{Programs: []string{"no-such-program"}})
	require.Error(t, err)
}

// TestSandboxSocketIsItsOwn: a program reaches the socket its process
// listens on, under IPCDir, and sees no other process's.
func TestSandboxSocketIsItsOwn(t *testing.T) {
	t.Parallel()
	r := newRunner(t, sandbox.Config{})
	script := `
import os, socket
s = socket.socket(socket.AF_UNIX)
s.connect(os.environ["SOCK"])
s.sendall(os.environ["NAME"].encode())
s.close()
print(" ".join(sorted(os.listdir("/run/pal/ipc"))))
`
	got := make(chan string, 2)
	var procs []*sandbox.Process
	for _, name := range []string{"one", "two"} {
		p := prepare(t, r, sandbox.Spec{Argv: []string{python, "-c", script}, Env: []string{"NAME=" + name}})
		ln, sock, err := p.Listen(name + ".sock")
		require.NoError(t, err)
		require.Equal(t, sandbox.IPCDir+"/"+name+".sock", sock)
		p.SetEnv("SOCK", sock)
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			b := make([]byte, 64)
			n, _ := c.Read(b)
			got <- name + " <- " + string(b[:n])
		}()
		procs = append(procs, p)
	}
	for i, p := range procs {
		require.NoError(t, p.Start())
		o := finish(t, p)
		require.True(t, o.res.OK(), "%v", errExit(o))
		require.Equal(t, []string{"one.sock", "two.sock"}[i], strings.TrimSpace(o.stdout))
	}
	require.ElementsMatch(t, []string{"one <- one", "two <- two"}, []string{<-got, <-got})
}

// descendants returns the host pids of the processes whose environment
// holds marker.
func descendants(marker string) []int {
	var pids []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err == nil && strings.Contains(string(b), marker) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// errExit describes how a program ended, for failure messages.
func errExit(o output) error {
	return fmt.Errorf("%+v\nstdout: %s\nstderr: %s", o.res, o.stdout, o.stderr)
}

// BenchmarkSandboxTrue is what a sandbox costs a step: /bin/true from
// Prepare to Close, with and without the sandbox.
func BenchmarkSandboxTrue(b *testing.B) {
	for _, off := range []bool{false, true} {
		name := "bwrap"
		if off {
			name = "off"
		}
		b.Run(name, func(b *testing.B) {
			r, err := sandbox.New(sandbox.Config{Off: off})
			require.NoError(b, err)
			require.NoError(b, r.Available())
			for b.Loop() {
				p, err := r.Prepare(sandbox.Spec{Argv: []string{"/bin/true"}})
				require.NoError(b, err)
				require.NoError(b, p.Start())
				<-p.Done()
				require.True(b, p.Result().OK())
				require.NoError(b, p.Close())
			}
		})
	}
}
