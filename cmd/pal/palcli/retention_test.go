package palcli_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/paltest/testenv"
)

// A bad PAL_RETENTION stops pal projector at start, naming the variable,
// before it connects to anything.
func TestBadRetention(t *testing.T) {
	t.Parallel()
	bin := testenv.PalBinary(t)
	for _, c := range []struct{ env, want string }{
		{"PAL_RETENTION=5m", `PAL_RETENTION="5m": below the minimum 1h0m0s`},
		{"PAL_RETENTION=soon", `PAL_RETENTION="soon": want a number of days (30d) or a Go duration (12h)`},
		{"PAL_RETENTION=0d", `PAL_RETENTION="0d": want a whole number of days`},
	} {
		env := []string{"PAL_NATS_URL=nats://127.0.0.1:1", "PAL_DATA_DIR=" + t.TempDir(), "DATABASE_URL=postgres://127.0.0.1:1/x", c.env}
		r := runPal(t, bin, env, "projector")
		require.Equal(t, 2, r.code, "%s: %s", c.env, r)
		require.Contains(t, r.stderr, c.want)
	}
}
