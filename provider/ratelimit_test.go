package provider_test

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/provider"
)

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	h := func(kv ...string) http.Header {
		out := http.Header{}
		for i := 0; i < len(kv); i += 2 {
			out.Set(kv[i], kv[i+1])
		}
		return out
	}
	tests := []struct {
		name string
		h    http.Header
		want time.Duration
		ok   bool
	}{
		{"none", h(), 0, false},
		{"nil", nil, 0, false},
		{"seconds", h("Retry-After", "2"), 2 * time.Second, true},
		{"fractional", h("Retry-After", "0.5"), 500 * time.Millisecond, true},
		{"http date", h("Retry-After", now.Add(7*time.Second).Format(http.TimeFormat)), 7 * time.Second, true},
		{"past date", h("Retry-After", now.Add(-time.Minute).Format(http.TimeFormat)), 0, true},
		{"ms wins", h("retry-after-ms", "1500", "Retry-After", "9"), 1500 * time.Millisecond, true},
		{"garbage", h("Retry-After", "soon"), 0, false},
		{"negative", h("Retry-After", "-3"), 0, false},
		{"absurd", h("Retry-After", "99999999999"), 0, false},
		{"openai resets", h("x-ratelimit-reset-requests", "1s", "x-ratelimit-reset-tokens", "6m0s"), 6 * time.Minute, true},
		{"openai ms", h("x-ratelimit-reset-tokens", "20ms"), 20 * time.Millisecond, true},
		{"anthropic resets", h("anthropic-ratelimit-requests-reset", now.Add(3*time.Second).Format(time.RFC3339),
			"anthropic-ratelimit-tokens-reset", now.Add(5*time.Second).Format(time.RFC3339)), 5 * time.Second, true},
		{"retry-after first", h("Retry-After", "1", "x-ratelimit-reset-requests", "30s"), time.Second, true},
	}
	for _, tt := range tests {
		got, ok := provider.RetryAfter(tt.h, now)
		require.Equal(t, tt.ok, ok, tt.name)
		require.Equal(t, tt.want, got, tt.name)
	}
}

func TestClassifyRateLimited(t *testing.T) {
	t.Parallel()
	for status, limited := range map[int]bool{429: true, 503: true, 529: true, 500: false, 502: false, 400: false} {
		var pe *provider.Error
		require.ErrorAs(t, provider.Classify("openai", status, errors.New("refused")), &pe)
		require.Equal(t, limited, pe.RateLimited, status)
		require.True(t, pe.Retryable || status == 400, status)
	}
}
