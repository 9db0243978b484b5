package cli_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/internal/testenv"
)

// A bad PAL_EGRESS_ALLOW stops pal worker at start, naming the variable,
// before it connects to anything.
func TestWorkerRefusesBadEgressAllow(t *testing.T) {
	t.Parallel()
	bin := testenv.PalBinary(t)
	for _, cmd := range []string{"worker", "dev"} {
		r := runPal(t, bin, []string{"PAL_NATS_URL=nats://127.0.0.1:1", "PAL_EGRESS_ALLOW=127.0.0.1/32,10.0.0.0/33", "PAL_DATA_DIR=" + t.TempDir()}, cmd)
		require.Equal(t, 2, r.code, "%s", r)
		require.Contains(t, r.stderr, `PAL_EGRESS_ALLOW: "10.0.0.0/33" is not a CIDR`, cmd)
	}
}
