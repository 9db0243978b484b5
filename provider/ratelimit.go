package provider

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// maxRetryAfter bounds what a provider's header can ask for: a header is
// outside input, and a wait of years is a bug, not a rate limit. The
// worker's own cap (PAL_RETRY_AFTER_MAX) is usually far lower.
const maxRetryAfter = 24 * time.Hour

// RetryAfter reads how long a provider asks the caller to wait before
// trying again, from the headers of an error answer, and reports whether
// it asked at all. In order of precedence:
//
//   - retry-after-ms (OpenAI): milliseconds;
//   - Retry-After (RFC 9110): delay-seconds or an HTTP date;
//   - OpenAI x-ratelimit-reset-requests and x-ratelimit-reset-tokens
//     (durations such as "1s", "6m0s", "20ms"): the longer;
//   - Anthropic anthropic-ratelimit-{requests,tokens,input-tokens,
//     output-tokens}-reset (RFC 3339 times): the latest, from now.
//
// A value that does not parse, is negative or is over a day is ignored.
func RetryAfter(h http.Header, now time.Time) (time.Duration, bool) {
	if h == nil {
		return 0, false
	}
	ok := func(d time.Duration) bool { return d >= 0 && d <= maxRetryAfter }
	if v := strings.TrimSpace(h.Get("retry-after-ms")); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ok(time.Duration(ms*float64(time.Millisecond))) {
			return time.Duration(ms * float64(time.Millisecond)), true
		}
	}
	if v := strings.TrimSpace(h.Get("Retry-After")); v != "" {
		if s, err := strconv.ParseFloat(v, 64); err == nil && s >= 0 && s <= maxRetryAfter.Seconds() {
			return time.Duration(s * float64(time.Second)), true
		}
		if t, err := http.ParseTime(v); err == nil {
			if d := t.Sub(now); ok(d) {
				return d, true
			} else if d < 0 {
				return 0, true
			}
		}
	}
	var best time.Duration
	found := false
	for _, name := range []string{"x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"} {
		if d, err := time.ParseDuration(strings.TrimSpace(h.Get(name))); err == nil && ok(d) {
			best, found = max(best, d), true
		}
	}
	for _, name := range []string{"anthropic-ratelimit-requests-reset", "anthropic-ratelimit-tokens-reset",
		"anthropic-ratelimit-input-tokens-reset", "anthropic-ratelimit-output-tokens-reset"} {
		if t, err := time.Parse(time.RFC3339, strings.TrimSpace(h.Get(name))); err == nil {
			if d := max(t.Sub(now), 0); ok(d) {
				best, found = max(best, d), true
			}
		}
	}
	return best, found
}

// rateLimited reports whether status is a provider's "slow down": 429 Too
// Many Requests, 503 Service Unavailable, or Anthropic's 529 Overloaded.
// The request was refused, not done: a retry may carry the same key.
func rateLimited(status int) bool {
	return status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable || status == 529
}
