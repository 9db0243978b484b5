package testenv_test

import (
	"context"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/paltest/testenv"
)

// helperPkg is a tiny main for exercising processes and the builder.
const helperPkg = "./paltest/testenv/testdata/helper"

func startHelper(t *testing.T, args ...string) *testenv.Process {
	t.Helper()
	p := testenv.StartProcess(t, testenv.BuildBinary(t, helperPkg), args, nil)
	if len(args) == 0 {
		require.NoError(t, p.WaitForOutput(waitCtx(t), "helper ready"))
	}
	return p
}

// stopped reports whether /proc shows pid as stopped (state T).
func stopped(t *testing.T, pid int) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	require.NoError(t, err)
	s := string(b) // pid (comm) state …
	return strings.Fields(s[strings.LastIndexByte(s, ')')+1:])[0] == "T"
}

func TestProcessKill(t *testing.T) {
	t.Parallel()
	p := startHelper(t)
	p.Kill()
	select {
	case <-p.Exited():
	default:
		t.Fatal("Kill returned before the process was reaped")
	}
	var exitErr *exec.ExitError
	require.ErrorAs(t, p.Wait(waitCtx(t)), &exitErr)
	require.Equal(t, syscall.SIGKILL, exitErr.Sys().(syscall.WaitStatus).Signal())

	p.Kill() // no-op once exited
	require.ErrorIs(t, p.Term(), os.ErrProcessDone)
}

func TestProcessStopCont(t *testing.T) {
	t.Parallel()
	if runtime.GOOS != "linux" {
		t.Skip("reads the process state from /proc")
	}
	p := startHelper(t)
	require.NoError(t, p.Stop())
	require.Eventually(t, func() bool { return stopped(t, p.PID()) }, 10*time.Second, 5*time.Millisecond)

	// A frozen process handles no signal until it is resumed.
	require.NoError(t, syscall.Kill(p.PID(), syscall.SIGUSR1))
	require.NoError(t, p.Cont())
	require.NoError(t, p.WaitForOutput(waitCtx(t), "usr1 1"))
	require.False(t, stopped(t, p.PID()))

	require.NoError(t, p.Term())
	require.NoError(t, p.Wait(waitCtx(t)), "exit after SIGTERM")
	require.Contains(t, p.Output(), "helper terminated")
}

func TestProcessWaitForOutput(t *testing.T) {
	t.Parallel()
	p := startHelper(t, "-exit", "3")
	err := p.WaitForOutput(waitCtx(t), "never printed")
	require.ErrorContains(t, err, "helper exiting", "the error quotes the output")
	var exitErr *exec.ExitError
	require.ErrorAs(t, p.Wait(waitCtx(t)), &exitErr)
	require.Equal(t, 3, exitErr.ExitCode())

	p = startHelper(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	require.ErrorIs(t, p.WaitForOutput(ctx, "never printed"), context.Canceled)
	require.ErrorIs(t, p.Wait(ctx), context.Canceled)
	select {
	case <-p.Exited():
		t.Fatal("the helper exited on its own")
	default:
	}
}

func TestProcessEnvIsHermetic(t *testing.T) {
	// t.Setenv forbids t.Parallel.
	t.Setenv("PAL_NATS_URL", "nats://leaked:4222")
	t.Setenv("DATABASE_URL", "postgres://leaked/db")
	t.Setenv("OPENAI_API_KEY", "leaked")
	t.Setenv("ANTHROPIC_API_KEY", "leaked")
	t.Setenv("PAL_TESTENV_LEAKED", "x")
	t.Setenv("TESTENV_INHERITED", "yes")

	bin := testenv.BuildBinary(t, helperPkg)
	p := testenv.StartProcess(t, bin, []string{"-env", "-exit", "0"}, []string{"PAL_WORKER_ID=w1"})
	require.NoError(t, p.Wait(waitCtx(t)))
	out := p.Output()
	require.NotContains(t, out, "leaked")
	require.NotContains(t, out, "LEAKED")
	require.Contains(t, out, "env: TESTENV_INHERITED=yes")
	require.Contains(t, out, "env: PAL_WORKER_ID=w1")
}
