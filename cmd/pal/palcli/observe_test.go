package palcli_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/paltest/testenv"
)

// Bad observability settings stop a process at start, naming the
// variable, before it connects to anything.
func TestBadObservabilitySettings(t *testing.T) {
	t.Parallel()
	bin := testenv.PalBinary(t)
	for _, c := range []struct {
		cmd  string
		env  string
		want string
	}{
		{"worker", "PAL_METRICS_ADDR=0.0.0.0", `PAL_METRICS_ADDR="0.0.0.0": want host:port`},
		{"worker", "PAL_METRICS_ADDR=metrics.example:9464", `PAL_METRICS_ADDR="metrics.example:9464"`},
		{"projector", "PAL_METRICS_ADDR=:x", `PAL_METRICS_ADDR=":x"`},
		{"server", "PAL_METRICS_OPEN=yes", `PAL_METRICS_OPEN="yes": want 1 or 0`},
		{"worker", "OTEL_EXPORTER_OTLP_PROTOCOL=grpc", `OTEL_EXPORTER_OTLP_PROTOCOL="grpc": PAL exports OTLP over http/protobuf only`},
	} {
		env := []string{"PAL_NATS_URL=nats://127.0.0.1:1", "PAL_DATA_DIR=" + t.TempDir(), "DATABASE_URL=postgres://127.0.0.1:1/x",
			"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:1", c.env}
		r := runPal(t, bin, env, c.cmd)
		require.Equal(t, 2, r.code, "%s %s: %s", c.cmd, c.env, r)
		require.Contains(t, r.stderr, c.want, c.cmd)
	}
}
