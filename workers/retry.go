package workers

import (
	"context"
	"errors"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/palrun/pal/connector"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/workflow"
)

// failure is a classified step failure.
type failure struct {
	// classes lists the retry classes the error belongs to, most specific
	// first (a timed-out LLM call is "timeout" and "llm").
	classes   []string
	retryable bool
	// unknown: the call may have reached its target; retry with the same
	// idempotency key.
	unknown bool
	// rateLimited: the provider refused to do the work now (429, 503,
	// 529); the retry keeps the idempotency key, as nothing was done.
	rateLimited bool
	// retryAfter is the wait the provider asked for (0: none).
	retryAfter time.Duration
	// fallback: the failure is the model's (a provider's error, an answer
	// that did not do): a step with a model list may move to the next.
	fallback bool
	// down: the provider is down (no connection, an HTTP 5xx), so a step
	// with a model list moves to the next model at once.
	down bool
}

// outage reports an outage-class failure: the provider down, or rate
// limiting for longer than the worker waits (limit, PAL_RETRY_AFTER_MAX).
func (f failure) outage(limit time.Duration) bool {
	return f.down || (f.rateLimited && f.retryAfter > limit)
}

// sameKey reports whether a retry keeps the attempt and its idempotency key.
func (f failure) sameKey() bool { return f.unknown || f.rateLimited }

func classify(nodeType string, err error) failure {
	base := baseClass(nodeType)
	var pe *provider.Error
	var ce *connector.Error
	var te *ToolError
	switch {
	case errors.Is(err, errPermanent):
		return failure{classes: []string{base}}
	case errors.As(err, &pe):
		f := failure{classes: []string{event.ClassLLM}, retryable: pe.Retryable, unknown: pe.Unknown,
			rateLimited: pe.RateLimited, retryAfter: pe.RetryAfter, fallback: !errors.Is(pe, context.Canceled),
			down: pe.Status >= 500 || (pe.Status == 0 && pe.Retryable && !pe.Unknown && !pe.Timeout)}
		if pe.Timeout {
			f.classes = []string{event.ClassTimeout, event.ClassLLM}
		}
		return f
	case errors.As(err, &ce):
		f := failure{classes: []string{event.ClassConnector}, retryable: ce.Retryable, unknown: ce.Unknown}
		if ce.Timeout {
			f.classes = []string{event.ClassTimeout, event.ClassConnector}
		}
		return f
	case errors.As(err, &te):
		return failure{classes: []string{event.ClassTool}, retryable: te.Retryable}
	case errors.Is(err, context.DeadlineExceeded):
		return failure{classes: []string{event.ClassTimeout, base}, retryable: true, unknown: true}
	default:
		return failure{classes: []string{base}, retryable: true}
	}
}

func baseClass(nodeType string) string {
	switch nodeType {
	case workflow.TypeAIStep, workflow.TypeAgent:
		return event.ClassLLM
	case workflow.TypeConnector:
		return event.ClassConnector
	default:
		return event.ClassTool
	}
}

// retryWait is the wait before the next try of a failed step: what the
// provider asked for, within limit, or else the policy's backoff. It
// returns the wait and what the provider asked (0: nothing).
func retryWait(p *workflow.RetryPolicy, tries int, f failure, limit time.Duration) (wait, asked time.Duration) {
	if f.retryAfter > 0 {
		return min(f.retryAfter, limit), f.retryAfter
	}
	return retryDelay(p, tries), 0
}

// retryDelay is the backoff before try number tries+1 (tries ≥ 1), from
// an exponential backoff starting at the policy's backoffMs.
func retryDelay(p *workflow.RetryPolicy, tries int) time.Duration {
	base := p.Backoff()
	if base <= 0 {
		return 0
	}
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = base
	bo.Multiplier = 2
	bo.RandomizationFactor = 0.2
	bo.MaxInterval = time.Minute
	bo.MaxElapsedTime = 0
	bo.Reset()
	d := bo.NextBackOff()
	for i := 1; i < tries; i++ {
		d = bo.NextBackOff()
	}
	return d
}
