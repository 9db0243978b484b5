package testenv_test

import (
	"net"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/paltest/testenv"
)

// publishOne creates a file-backed stream on subject and publishes payload
// with an acknowledgement, returning the stream sequence.
func publishOne(t *testing.T, js jetstream.JetStream, stream, subject, payload string) uint64 {
	t.Helper()
	ctx := waitCtx(t)
	_, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name:     stream,
		Subjects: []string{subject},
		Storage:  jetstream.FileStorage,
	})
	require.NoError(t, err)
	ack, err := js.Publish(ctx, subject, []byte(payload))
	require.NoError(t, err)
	return ack.Sequence
}

// requireMessage reads message seq of stream and checks its payload.
func requireMessage(t *testing.T, js jetstream.JetStream, stream string, seq uint64, payload string) {
	t.Helper()
	ctx := waitCtx(t)
	s, err := js.Stream(ctx, stream)
	require.NoError(t, err)
	msg, err := s.GetMsg(ctx, seq)
	require.NoError(t, err)
	require.Equal(t, payload, string(msg.Data))
}

func TestNATSRestartKeepsMessages(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		opts   []testenv.NATSOption
		strict bool
	}{
		{"default", nil, false},
		{"strict", []testenv.NATSOption{testenv.Strict()}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			n := testenv.NATS(t, tc.opts...)
			require.Equal(t, tc.strict, n.Server().JetStreamConfig().SyncAlways, "SyncAlways")
			url := n.URL()
			js, err := jetstream.New(n.Conn(t))
			require.NoError(t, err)
			seq := publishOne(t, js, "PAL_TEST", "pal.test.run_1", "hello")

			before := n.Server()
			n.Restart(t)
			require.NotSame(t, before, n.Server(), "Restart kept the old server")
			require.Equal(t, url, n.URL(), "URL changed across Restart")
			// The old connection reconnects to the same address by itself.
			requireMessage(t, js, "PAL_TEST", seq, "hello")
		})
	}
}

func TestNATSPortAndLogging(t *testing.T) {
	t.Parallel()
	port := testenv.FreePort(t)
	n := testenv.NATS(t, testenv.Port(port), testenv.Logging())
	require.Equal(t, net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), n.Server().Addr().String())
	require.Equal(t, "nats://127.0.0.1:"+strconv.Itoa(port), n.URL())
	require.True(t, n.Conn(t).IsConnected())
	n.Shutdown()
	n.Shutdown() // idempotent
}
