package testenv

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestHermeticEnv(t *testing.T) {
	t.Parallel()
	got := hermeticEnv([]string{
		"PATH=/bin", "PAL_NATS_URL=x", "DATABASE_URL=y", "DATABASE_URLX=z",
		"OPENAI_API_KEY=k", "ANTHROPIC_BASE_URL=u", "PALETTE=keep", "HOME=/root",
	})
	require.Equal(t, []string{"PATH=/bin", "PALETTE=keep", "HOME=/root"}, got)
}
