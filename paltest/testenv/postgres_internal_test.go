package testenv

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWithDatabase(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ dsn, want string }{
		{"postgres://u:p@127.0.0.1:5432/postgres?sslmode=disable", "postgres://u:p@127.0.0.1:5432/pal_test_1?sslmode=disable"},
		{"postgresql://u@h/db", "postgresql://u@h/pal_test_1"},
		{"postgres://u@h", "postgres://u@h/pal_test_1"},
		{"host=h user=u dbname=postgres", "host=h user=u dbname=postgres dbname=pal_test_1"},
	} {
		require.Equal(t, tc.want, withDatabase(tc.dsn, "pal_test_1"), tc.dsn)
	}
}

func TestMajorVersion(t *testing.T) {
	t.Parallel()
	for version, want := range map[string]int{
		"15.18 (Debian 15.18-0+deb12u1)": 15,
		"9.6.24":                         9,
		"17devel":                        17,
		"16":                             16,
		"":                               0,
	} {
		require.Equal(t, want, majorVersion(version), version)
	}
}
