package testenv_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/paltest/testenv"
)

// TestCountRequests: the counted connection counts what waits for an
// answer (a request, a JetStream publish, a publish with a reply subject)
// by subject, and not a plain publish, a reply, or words that look like
// protocol inside a payload or a header; ignored prefixes are not
// counted.
func TestCountRequests(t *testing.T) {
	t.Parallel()
	srv := testenv.NATS(t)
	nc, reqs := srv.CountRequests(t)
	other := srv.Conn(t)
	_, err := other.Subscribe("svc", func(m *nats.Msg) { _ = m.Respond([]byte("PUB x y 1\r\n")) })
	require.NoError(t, err)
	require.NoError(t, other.Flush())
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx := waitCtx(t)
	_, err = js.CreateStream(ctx, jetstream.StreamConfig{Name: "COUNTED", Subjects: []string{"counted.>"}})
	require.NoError(t, err)
	reqs.Ignore("ignored.")

	mark := reqs.Mark()
	require.NoError(t, nc.Publish("plain", []byte("PUB fake reply 3\r\nabc\r\n")))
	_, err = nc.Request("svc", []byte(strings.Repeat("HPUB a b 1 2\r\n", 1000)), 5*time.Second)
	require.NoError(t, err)
	msg := &nats.Msg{Subject: "counted.a", Header: nats.Header{"X": []string{"PUB h r 9"}}, Data: []byte("x")}
	_, err = js.PublishMsg(ctx, msg)
	require.NoError(t, err)
	require.NoError(t, nc.PublishRequest("ignored.x", "reply.x", nil))
	require.NoError(t, nc.PublishRequest("noreply", "reply.y", nil))
	require.NoError(t, nc.Flush())
	require.Equal(t, []string{"svc", "counted.a", "noreply"}, reqs.Since(mark))
}
