package provider_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/provider"
)

func TestCost(t *testing.T) {
	t.Parallel()
	million := provider.Usage{InputTokens: 1_000_000, OutputTokens: 1_000_000}
	tests := []struct {
		model string
		u     provider.Usage
		want  float64
	}{
		{"gpt-4o-mini", million, 0.15 + 0.60},
		{"gpt-4o-mini-2024-07-18", million, 0.15 + 0.60},
		{"gpt-4o", provider.Usage{InputTokens: 1000, OutputTokens: 500}, (1000*2.50 + 500*10.0) / 1e6},
		{"gpt-4.1", million, 2 + 8},
		{"gpt-4.1-mini", million, 0.40 + 1.60},
		{"claude-sonnet-4-5", million, 3 + 15},
		{"claude-sonnet-4-5-20250929", million, 3 + 15},
		{"claude-haiku-4-5", million, 1 + 5},
		{"claude-opus-4-1", provider.Usage{InputTokens: 2000}, 2000 * 15.0 / 1e6},
		{"unknown-model", million, 0},
		{"", million, 0},
		{"gpt-4o-mini", provider.Usage{}, 0},
	}
	for _, tt := range tests {
		require.InDelta(t, tt.want, provider.Cost(tt.model, tt.u), 1e-12, tt.model)
	}
}
