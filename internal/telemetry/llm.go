package telemetry

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// LLMCall is one provider call in flight: a GenAI client span and the
// provider metrics, recorded together when it ends.
type LLMCall struct {
	span     trace.Span
	provider string
	model    string
	start    time.Time
}

// StartLLM opens the span of a chat call to provider (gen_ai.system) for
// model (gen_ai.request.model), following the OpenTelemetry GenAI
// semantic conventions.
func StartLLM(ctx context.Context, provider, model string) (context.Context, *LLMCall) {
	ctx, span := tracer().Start(ctx, "chat "+model, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(
		attribute.String("gen_ai.operation.name", "chat"),
		attribute.String("gen_ai.system", provider),
		attribute.String("gen_ai.request.model", model)))
	return ctx, &LLMCall{span: span, provider: provider, model: model, start: time.Now()}
}

// LLMResult is what a provider call returned.
type LLMResult struct {
	Model        string // the response's model; "" keeps the requested one
	ResponseID   string
	FinishReason string
	InputTokens  int64
	OutputTokens int64
	// CacheReadTokens and CacheWriteTokens are parts of InputTokens,
	// ReasoningTokens a part of OutputTokens.
	CacheReadTokens  int64
	CacheWriteTokens int64
	ReasoningTokens  int64
	CostUSD          float64
}

// End ends the call: err is the provider's failure, nil on success.
// Metrics are labelled with the requested model, which the workflow
// names (bounded), rather than the response's (a dated snapshot name).
func (c *LLMCall) End(res LLMResult, err error) {
	provider, model := providers.value(c.provider), models.value(c.model)
	providerSeconds.WithLabelValues(provider, model).Observe(time.Since(c.start).Seconds())
	if err != nil {
		providerCalls.WithLabelValues(provider, model, "error").Inc()
		c.span.SetStatus(codes.Error, err.Error())
		c.span.SetAttributes(attribute.String("error.type", "provider_error"))
		c.span.End()
		return
	}
	providerCalls.WithLabelValues(provider, model, "ok").Inc()
	providerTokens.WithLabelValues(provider, model, "input").Add(float64(res.InputTokens))
	providerTokens.WithLabelValues(provider, model, "output").Add(float64(res.OutputTokens))
	for direction, n := range map[string]int64{"cache_read": res.CacheReadTokens, "cache_write": res.CacheWriteTokens,
		"reasoning": res.ReasoningTokens} {
		if n > 0 {
			providerTokens.WithLabelValues(provider, model, direction).Add(float64(n))
		}
	}
	providerCost.WithLabelValues(provider, model).Add(res.CostUSD)
	attrs := []attribute.KeyValue{
		attribute.Int64("gen_ai.usage.input_tokens", res.InputTokens),
		attribute.Int64("gen_ai.usage.output_tokens", res.OutputTokens),
	}
	if res.Model != "" {
		attrs = append(attrs, attribute.String("gen_ai.response.model", res.Model))
	}
	if res.ResponseID != "" {
		attrs = append(attrs, attribute.String("gen_ai.response.id", res.ResponseID))
	}
	if res.FinishReason != "" {
		attrs = append(attrs, attribute.StringSlice("gen_ai.response.finish_reasons", []string{res.FinishReason}))
	}
	c.span.SetAttributes(attrs...)
	c.span.End()
}
