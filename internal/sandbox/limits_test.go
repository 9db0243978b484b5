package sandbox_test

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/internal/sandbox"
)

// TestSandboxLimits: each limit stops a program that passes it, and the
// result names it.
func TestSandboxLimits(t *testing.T) {
	t.Parallel()
	r := newRunner(t, sandbox.Config{})
	for _, tc := range []struct {
		name   string
		argv   []string
		limits sandbox.Limits
		want   sandbox.Limit
		full   string
	}{
		{"fork bomb", []string{python, "-c", "import os\nwhile True:\n  try: os.fork()\n  except OSError: pass"},
			sandbox.Limits{Processes: 32}, sandbox.LimitProcesses, ""},
		{"disk filler", []string{"/bin/sh", "-c", "i=0; while :; do head -c 1048576 /dev/zero > /home/pal/f$i; i=$((i+1)); done"},
			sandbox.Limits{Disk: 8 << 20}, sandbox.LimitDisk, "/home/pal"},
		{"tmp filler", []string{python, "-c", "import itertools\nfor i in itertools.count():\n  try: open('/tmp/f%d' % i, 'wb').write(b'x' * 65536)\n  except OSError: pass"},
			sandbox.Limits{Disk: 4 << 20}, sandbox.LimitDisk, "/tmp"},
		{"big file", []string{"/bin/sh", "-c", "head -c 2097152 /dev/zero > /home/pal/big"},
			sandbox.Limits{FileSize: 1 << 20}, sandbox.LimitFileSize, ""},
		{"memory", []string{python, "-c", "b = b'x' * (512 << 20)\nprint(len(b))"},
			sandbox.Limits{Memory: 64 << 20}, sandbox.LimitMemory, ""},
		{"cpu", []string{python, "-c", "while True: pass"},
			sandbox.Limits{CPU: time.Second}, sandbox.LimitCPU, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := run(t, r, sandbox.Spec{Argv: tc.argv, Limits: tc.limits})
			require.False(t, o.res.OK(), "%v", errExit(o))
			require.Equal(t, tc.want, o.res.Limit, "%v", errExit(o))
			require.Equal(t, tc.full, o.res.Full)
		})
	}
}

// TestSandboxFileSizeGetsNothing: a program that writes past its file
// size limit writes no more than the limit.
func TestSandboxFileSizeGetsNothing(t *testing.T) {
	t.Parallel()
	r := newRunner(t, sandbox.Config{})
	var got struct {
		Error string `json:"error"`
		Size  int    `json:"size"`
	}
	pyJSON(t, r, sandbox.Spec{Limits: sandbox.Limits{FileSize: 1 << 20}}, `
import json, os
err = ""
try:
    with open("/home/pal/big", "wb") as f:
        f.write(b"x" * (3 << 20))
except OSError as e:
    err = str(e)
print(json.dumps({"error": err, "size": os.path.getsize("/home/pal/big")}))`, &got)
	require.Contains(t, got.Error, "File too large")
	require.LessOrEqual(t, got.Size, 1<<20)
}

// marker returns a string unique to one test's processes.
func marker(t *testing.T) string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return "PAL_TEST_MARK=" + hex.EncodeToString(b) + strings.ReplaceAll(t.Name(), "/", "_")
}

// requireNoneAlive waits until no process with marker in its environment
// (and a command line starting with cmd) runs; a zombie does not run.
func requireNoneAlive(t *testing.T, marker, cmd string) {
	t.Helper()
	require.Eventually(t, func() bool { return len(alive(marker, cmd)) == 0 },
		10*time.Second, 10*time.Millisecond, "a process of the sandbox outlived it")
}

// alive returns the pids of the running processes with marker in their
// environment whose command line starts with cmd.
func alive(marker, cmd string) []int {
	var out []int
	for _, pid := range descendants(marker) {
		line, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil || !strings.HasPrefix(strings.ReplaceAll(string(line), "\x00", " "), cmd) {
			continue
		}
		// The state follows the command name in parentheses.
		if s := string(stat); strings.LastIndexByte(s, ')') > 0 {
			if i := strings.LastIndexByte(s, ')'); i+2 < len(s) && s[i+2] != 'Z' {
				out = append(out, pid)
			}
		}
	}
	return out
}

// TestSandboxEndsEveryDescendant: grandchildren that left with setsid and
// sleep forever are gone when the program exits, when it is killed, and
// when it is terminated (they get the SIGTERM, the program ignores it).
func TestSandboxEndsEveryDescendant(t *testing.T) {
	t.Parallel()
	r := newRunner(t, sandbox.Config{})
	const forever = "setsid sh -c 'sleep 1000; sleep 1000' & setsid sleep 1000 & "
	for _, how := range []string{"exit", "kill", "terminate"} {
		t.Run(how, func(t *testing.T) {
			mark := marker(t)
			script := forever + "echo started; read line" // exits at a line on stdin
			if how != "exit" {
				// The grandchildren do not inherit the ignored SIGTERM.
				script = forever + "trap '' TERM; echo started; while :; do sleep 0.1; done"
			}
			stdin, w, err := os.Pipe()
			require.NoError(t, err)
			defer w.Close()
			p := start(t, r, sandbox.Spec{Argv: []string{"/bin/sh", "-c", script}, Env: []string{mark}, Stdin: stdin})
			stdin.Close()
			bufs, _ := outputs.Load(p)
			out := bufs.([2]*lockedBuf)[0]
			require.Eventually(t, func() bool { return strings.Contains(out.String(), "started") && len(alive(mark, "sleep 1000")) == 2 },
				10*time.Second, 10*time.Millisecond)
			switch how {
			case "exit":
				_, err := w.Write([]byte("go\n"))
				require.NoError(t, err)
			case "kill":
				p.Kill()
			case "terminate":
				p.Terminate()
				requireNoneAlive(t, mark, "sleep 1000")
				require.NotEmpty(t, alive(mark, "/bin/sh -c"), "the program ignores SIGTERM")
				p.Kill()
			}
			o := finish(t, p)
			if how == "exit" {
				require.True(t, o.res.OK(), "%v", errExit(o))
			}
			requireNoneAlive(t, mark, "")
		})
	}
}

// TestSandboxRlimitsWithoutCgroups: where the worker may create no
// cgroup, memory and processes are bounded by RLIMIT_AS and RLIMIT_NPROC,
// and a program that fails at its memory limit has the limit named.
func TestSandboxRlimitsWithoutCgroups(t *testing.T) {
	t.Parallel()
	r := newRunner(t, sandbox.Config{})
	sandbox.WithoutCgroups(r)
	o := run(t, r, sandbox.Spec{Argv: []string{python, "-c", "b = b'x' * (512 << 20)"}, Limits: sandbox.Limits{Memory: 64 << 20}})
	require.Equal(t, sandbox.LimitMemory, o.res.Limit, "%v", errExit(o))
	require.Contains(t, o.stderr, "MemoryError")

	var got struct{ Forked, Refused int }
	pyJSON(t, r, sandbox.Spec{Limits: sandbox.Limits{Processes: 8}}, `
import json, os, time
forked = refused = 0
for i in range(100):
    try:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
        forked += 1
    except OSError:
        refused += 1
print(json.dumps({"Forked": forked, "Refused": refused}))`, &got)
	require.Positive(t, got.Refused)
	require.Less(t, got.Forked, 8+16, "no more than the limit and the sandbox's own")
}
