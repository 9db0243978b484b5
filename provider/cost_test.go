package provider_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
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
		// Cached input at the cache rates: 1,000,000 input tokens of which
		// 600,000 read from the cache and 300,000 written to it.
		{"claude-sonnet-4-5", provider.Usage{InputTokens: 1_000_000, CacheReadTokens: 600_000, CacheWriteTokens: 300_000, OutputTokens: 1000},
			(100_000*3.00 + 600_000*0.30 + 300_000*3.75 + 1000*15.00) / 1e6},
		{"gpt-4.1", provider.Usage{InputTokens: 10_000, CacheReadTokens: 8_000, OutputTokens: 100, ReasoningTokens: 60},
			(2_000*2.00 + 8_000*0.50 + 100*8.00) / 1e6},
		// Counts that do not add up are no refund.
		{"claude-haiku-4-5", provider.Usage{InputTokens: 10, CacheReadTokens: 100}, 100 * 0.10 / 1e6},
	}
	for _, tt := range tests {
		require.InDelta(t, tt.want, provider.Cost(tt.model, tt.u), 1e-12, tt.model)
	}
}

func TestLoadPrices(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := dir + "/" + name
		require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
		return p
	}
	t.Cleanup(func() { provider.ResetPrices() })

	for name, body := range map[string]string{
		"notjson.json":  `{`,
		"nomodels.json": `{}`,
		"typo.json":     `{"models": {"m": {"input_per_mtok": 1, "outptu_per_mtok": 2}}}`,
		"missing.json":  `{"models": {"m": {"input_per_mtok": 1}}}`,
		"negative.json": `{"models": {"m": {"input_per_mtok": -1, "output_per_mtok": 2}}}`,
		"cache.json":    `{"models": {"m": {"input_per_mtok": 1, "output_per_mtok": 2, "cache_read_per_mtok": -0.1}}}`,
		"big.json":      `{"models": {}, "_comment": "` + strings.Repeat("x", 1<<20) + `"}`,
	} {
		err := provider.LoadPrices(write(name, body))
		require.Error(t, err, name)
		require.Contains(t, err.Error(), "PAL_PRICES", name)
	}
	require.Error(t, provider.LoadPrices(dir+"/absent.json"))
	_, _, ok := provider.PriceOf("m")
	require.False(t, ok, "a bad file changes nothing")

	require.NoError(t, provider.LoadPrices(write("ok.json",
		`{"models": {"my-model": {"input_per_mtok": 1, "output_per_mtok": 2}, "gpt-4o": {"input_per_mtok": 0, "output_per_mtok": 1}}}`)))
	in, out, ok := provider.PriceOf("my-model")
	require.True(t, ok)
	require.Equal(t, []float64{1, 2}, []float64{in, out})
	require.InDelta(t, 1.0, provider.Cost("gpt-4o", provider.Usage{InputTokens: 1e6, OutputTokens: 1e6}), 1e-12, "overridden")
	require.InDelta(t, 0.75, provider.Cost("gpt-4o-mini", provider.Usage{InputTokens: 1e6, OutputTokens: 1e6}), 1e-12, "kept")
	cached := provider.Usage{InputTokens: 1e6, CacheReadTokens: 1e6}
	require.InDelta(t, 1.0, provider.Cost("my-model", cached), 1e-12, "no cache rate: cached input at the input rate")

	require.NoError(t, provider.LoadPrices(write("cache.json",
		`{"models": {"my-model": {"input_per_mtok": 1, "output_per_mtok": 2, "cache_read_per_mtok": 0.1, "cache_write_per_mtok": 1.25}}}`)))
	require.InDelta(t, 0.1, provider.Cost("my-model", cached), 1e-12)
	require.InDelta(t, 1.25, provider.Cost("my-model", provider.Usage{InputTokens: 1e6, CacheWriteTokens: 1e6}), 1e-12)
}

// TestPricesIsACopy: the table a run creator journals from is the
// process's, and changing the copy changes nothing.
func TestPricesIsACopy(t *testing.T) {
	t.Parallel()
	p := provider.Prices()
	want, ok := p.Of("gpt-4o")
	require.True(t, ok)
	require.Equal(t, event.Price{InputPerMTok: 2.50, OutputPerMTok: 10, CacheReadPerMTok: 1.25}, want)
	delete(p, "gpt-4o")
	_, _, ok = provider.PriceOf("gpt-4o")
	require.True(t, ok)
}
