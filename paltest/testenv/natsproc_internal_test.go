package testenv

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/stretchr/testify/require"
)

// The separate process cannot be asked for its settings, so check that the
// file Strict writes means fsync-always to the same server version.
func TestStrictNATSConfigSyncsAlways(t *testing.T) {
	t.Parallel()
	conf := filepath.Join(t.TempDir(), "nats.conf")
	require.NoError(t, os.WriteFile(conf, []byte(strictNATSConfig), 0o644))
	opts, err := server.ProcessConfigFile(conf)
	require.NoError(t, err)
	require.True(t, opts.SyncAlways, "SyncAlways")
}
