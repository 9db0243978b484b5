package testenv_test

import (
	"strconv"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/paltest/testenv"
)

func TestNATSProcessKillKeepsAckedMessage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts []testenv.NATSOption
	}{
		{"default", nil},
		{"strict", []testenv.NATSOption{testenv.Strict()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := testenv.NATSProcess(t, tc.opts...)
			js, err := jetstream.New(n.Conn(t))
			require.NoError(t, err)
			seq := publishOne(t, js, "PAL_TEST", "pal.test.run_1", "acked")

			pid := n.Process().PID()
			n.Kill()
			require.Nil(t, n.Process(), "Process() after Kill")
			n.Start(t)
			require.NotEqual(t, pid, n.Process().PID(), "Start did not start a new process")
			// The connection made before the kill reconnects by itself.
			requireMessage(t, js, "PAL_TEST", seq, "acked")
		})
	}
}

func TestNATSProcessStop(t *testing.T) {
	t.Parallel()
	port := testenv.FreePort(t)
	n := testenv.NATSProcess(t, testenv.Port(port))
	require.Equal(t, "nats://127.0.0.1:"+strconv.Itoa(port), n.URL())
	p := n.Process()
	n.Stop()
	select {
	case <-p.Exited():
	default:
		t.Fatal("Stop returned before the server exited")
	}
	require.NoError(t, p.Wait(waitCtx(t)), "nats-server did not exit cleanly on SIGTERM:\n%s", p.Output())
	n.Stop() // idempotent
	n.Start(t)
	require.True(t, n.Conn(t).IsConnected())
}
