package workers

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/internal/telemetry"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/schemas"
	"github.com/palrun/pal/workflow"
)

// execAI sends an LLM step's call (an ai-step, an agent turn): its
// journaled input, with the images it names read, streamed to the step's
// watchers as it is written. An answer that does not match the node's
// responseSchema fails the attempt (class llm) with the usage it spent.
func (d *drive) execAI(p engine.StepPlan) (stepResult, error) {
	var in engine.AIInput
	if err := json.Unmarshal(p.Call(), &in); err != nil {
		return stepResult{}, permanent("step %s: bad input: %v", p.StepID, err)
	}
	prov, err := d.w.providers.Get(in.Provider)
	if err != nil {
		return stepResult{}, permanent("step %s: %v", p.StepID, err)
	}
	var schema *schemas.AnswerSchema
	if len(in.ResponseSchema) > 0 {
		if schema, err = schemas.CompileAnswer(in.ResponseSchema); err != nil {
			return stepResult{}, permanent("step %s: %v", p.StepID, err)
		}
	}
	msgs, err := d.withImages(p.StepID, in.Messages)
	if err != nil {
		return stepResult{}, err
	}
	gate := p.Confidence
	req := provider.Request{Model: in.Model, System: in.System, MaxTokens: in.MaxTokens,
		Temperature: in.Temperature, Messages: msgs, Tools: in.Tools, IdempotencyKey: p.Key,
		ResponseSchema: in.ResponseSchema, Logprobs: gate != nil && gate.Source == workflow.ConfidenceLogprobs}
	if req.MaxTokens <= 0 {
		// A step journaled before every call sent a cap: send the default.
		req.MaxTokens = engine.DefaultOutputTokens
	}
	ctx, call := telemetry.StartLLM(d.ctx, in.Provider, in.Model)
	resp, err := d.complete(ctx, prov, req, d.deltas(p), p.TimeoutMs)
	if err != nil {
		call.End(telemetry.LLMResult{}, err)
		return stepResult{}, err
	}
	u := d.st.UsageOf(resp.Model, in.Model, resp.Usage)
	call.End(telemetry.LLMResult{Model: resp.Model, ResponseID: resp.ID, FinishReason: resp.FinishReason,
		InputTokens: u.InputTokens, OutputTokens: u.OutputTokens, CacheReadTokens: u.CacheReadTokens,
		CacheWriteTokens: u.CacheWriteTokens, ReasoningTokens: u.ReasoningTokens, CostUSD: u.CostUSD}, nil)
	llm := engine.LLMOutput{Text: resp.Text, Model: resp.Model, FinishReason: resp.FinishReason,
		ToolCalls: resp.ToolCalls, ID: resp.ID}
	res := stepResult{usage: u, final: len(resp.ToolCalls) == 0}
	if schema != nil && res.final {
		if llm.JSON, err = schema.Validate([]byte(resp.Text)); err != nil {
			// The provider did the work: the next attempt asks again
			// (a new key), and this one's usage is journaled with its
			// failure.
			return stepResult{usage: u}, &provider.Error{Provider: in.Provider, Status: http.StatusOK, Retryable: true,
				Err: fmt.Errorf("the answer does not match the step's responseSchema: %w", err)}
		}
	}
	if gate != nil && res.final {
		score, judged, err := d.score(p, gate, resp)
		if err != nil {
			return stepResult{}, err
		}
		if judged != nil {
			u.Add(*judged)
		}
		llm.Confidence = &score
		res.confidence = &event.ConfidenceEvaluatedData{Score: score, Min: gate.Min, Passed: score >= gate.Min,
			Source: gate.Source, Usage: u}
	}
	if res.output, err = json.Marshal(llm); err != nil {
		return stepResult{}, err
	}
	if res.confidence != nil {
		res.confidence.Output = res.output
	}
	return res, nil
}

// complete sends one model call once a concurrency slot for its provider
// and model is free (PAL_PROVIDER_CONCURRENCY), handing its answer's text
// to sink as it streams. Waiting for a slot is not part of the call's
// timeout and not a failure: it ends only with the drive (a lost lease, a
// shutdown).
func (d *drive) complete(ctx context.Context, prov provider.Provider, req provider.Request, sink provider.Sink, timeoutMs int) (*provider.Response, error) {
	release, err := d.w.slots.acquire(ctx, prov.Name(), req.Model)
	if err != nil {
		return nil, err
	}
	defer release()
	ctx, cancel := context.WithTimeout(ctx, timeoutOf(timeoutMs, defaultLLMTimeout))
	defer cancel()
	return prov.Complete(ctx, req, sink)
}

// sha256Hex matches a blob's name.
var sha256Hex = regexp.MustCompile(`^[0-9a-f]{64}$`)

// withImages returns msgs with the bytes of every image that names a blob:
// a value the run holds (its input, or a step's input or output, kept in
// PAL_BLOBS when big), which is a JSON string of the image's bytes in
// base64 (or a data: URL). A blob the run does not hold, or that is not
// an image, fails the step: trying again would find the same.
func (d *drive) withImages(stepID string, msgs []provider.Message) ([]provider.Message, error) {
	out, cloned := msgs, false
	for i, m := range msgs {
		for j, img := range m.Images {
			if img.Blob == "" {
				continue
			}
			data, err := d.imageBytes(img)
			if err != nil {
				return nil, permanent("step %s: messages[%d].images[%d]: %v", stepID, i, j, err)
			}
			if !cloned {
				out, cloned = slices.Clone(msgs), true // the plan's messages are the state's: not changed
			}
			images := slices.Clone(out[i].Images)
			images[j] = provider.Image{MediaType: img.MediaType, Data: data}
			out[i].Images = images
		}
	}
	return out, nil
}

// imageBytes reads the bytes of an image that names a blob of the run.
func (d *drive) imageBytes(img provider.Image) ([]byte, error) {
	sum := strings.ToLower(img.Blob)
	if !sha256Hex.MatchString(sum) {
		return nil, fmt.Errorf("blob %.80q is not the hex sha256 of a value", img.Blob)
	}
	if !slices.Contains(provider.ImageMediaTypes, img.MediaType) {
		return nil, fmt.Errorf("media type %q is not one of %s", img.MediaType, strings.Join(provider.ImageMediaTypes, ", "))
	}
	value, ok := d.heldValue(sum)
	if !ok {
		return nil, fmt.Errorf("blob %s is no value this run holds (its input, a step's input or output)", sum)
	}
	var s string
	if err := json.Unmarshal(value, &s); err != nil {
		return nil, fmt.Errorf("blob %s is not a JSON string of base64 bytes", sum)
	}
	if _, data, ok := strings.Cut(s, ";base64,"); ok && strings.HasPrefix(s, "data:") {
		s = data
	}
	if base64.StdEncoding.DecodedLen(len(s)) > provider.MaxImageBytes+3 {
		return nil, fmt.Errorf("blob %s holds an image over %d MiB", sum, provider.MaxImageBytes>>20)
	}
	b, err := base64.StdEncoding.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("blob %s is not base64: %v", sum, err)
	}
	if len(b) > provider.MaxImageBytes {
		return nil, fmt.Errorf("blob %s holds an image over %d MiB", sum, provider.MaxImageBytes>>20)
	}
	return b, nil
}

// heldValue finds the value of the run whose bytes hash to sum: its input,
// or a step attempt's input or output. The folded state holds them as
// journaled (a blob's exact bytes), so its hash is the blob's name.
func (d *drive) heldValue(sum string) (json.RawMessage, bool) {
	match := func(v json.RawMessage) bool {
		if len(v) < 64 {
			return false // no image is that small
		}
		h := sha256.Sum256(v)
		return hex.EncodeToString(h[:]) == sum
	}
	if match(d.st.Created.Input) {
		return d.st.Created.Input, true
	}
	for _, id := range d.st.Order {
		for _, a := range d.st.Steps[id].Attempts {
			for _, v := range []json.RawMessage{a.Output, a.Input} {
				if match(v) {
					return v, true
				}
			}
		}
	}
	return nil, false
}
