package workers

import (
	"bytes"
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
// watchers as it is written (c.deltas). An answer that does not match the
// node's responseSchema fails the attempt (class llm) with the usage it
// spent.
func (c *call) execAI() (stepResult, error) {
	p := c.p
	var in engine.AIInput
	if err := json.Unmarshal(p.Call(), &in); err != nil {
		return stepResult{}, permanent("step %s: bad input: %v", p.StepID, err)
	}
	prov, err := c.d.w.providers.Get(in.Provider)
	if err != nil {
		return stepResult{}, permanent("step %s: %v", p.StepID, err)
	}
	var schema *schemas.AnswerSchema
	if len(in.ResponseSchema) > 0 {
		if schema, err = schemas.CompileAnswer(in.ResponseSchema); err != nil {
			return stepResult{}, permanent("step %s: %v", p.StepID, err)
		}
	}
	msgs, err := c.withImages(in.Messages)
	if err != nil {
		return stepResult{}, err
	}
	// An agent's first turn offers its MCP servers' tools, as they list
	// them now; its output journals them for the later turns.
	var listed []engine.MCPTool
	if len(in.MCP) > 0 {
		taken := make([]string, len(in.Tools))
		for i, t := range in.Tools {
			taken[i] = t.Name
		}
		if listed, err = c.mcpTools(in.MCP, taken); err != nil {
			return stepResult{}, err
		}
		in.Tools = slices.Clip(in.Tools)
		for _, t := range listed {
			in.Tools = append(in.Tools, provider.Tool{Name: t.Name, Description: t.Description, Parameters: t.Parameters})
		}
	}
	if ts, ok := threadOf(c.thread, p); ok {
		prior, err := c.joinThread(ts)
		if err != nil {
			return stepResult{}, err
		}
		msgs = append(prior, msgs...)
	}
	gate := p.Confidence
	req := provider.Request{Model: in.Model, System: in.System, MaxTokens: in.MaxTokens,
		Temperature: in.Temperature, Messages: msgs, Tools: in.Tools, IdempotencyKey: p.Key,
		ResponseSchema: in.ResponseSchema, Logprobs: gate != nil && gate.Source == workflow.ConfidenceLogprobs}
	req.Fake = c.fake()
	if req.MaxTokens <= 0 {
		// A step journaled before every call sent a cap: send the default.
		req.MaxTokens = engine.DefaultOutputTokens
	}
	ctx, llm := telemetry.StartLLM(c.ctx, in.Provider, in.Model)
	resp, err := c.d.complete(ctx, prov, req, c.deltas, p.TimeoutMs)
	if err != nil {
		llm.End(telemetry.LLMResult{}, err)
		return stepResult{}, err
	}
	u := engine.UsageAt(c.prices, resp.Model, in.Model, resp.Usage)
	llm.End(telemetry.LLMResult{Model: resp.Model, ResponseID: resp.ID, FinishReason: resp.FinishReason,
		InputTokens: u.InputTokens, OutputTokens: u.OutputTokens, CacheReadTokens: u.CacheReadTokens,
		CacheWriteTokens: u.CacheWriteTokens, ReasoningTokens: u.ReasoningTokens, CostUSD: u.CostUSD}, nil)
	out := engine.LLMOutput{Text: resp.Text, Model: resp.Model, FinishReason: resp.FinishReason,
		ToolCalls: resp.ToolCalls, ID: resp.ID, MCPTools: listed}
	res := stepResult{usage: u, final: len(resp.ToolCalls) == 0}
	if schema != nil && res.final {
		if out.JSON, err = schema.Validate([]byte(resp.Text)); err != nil {
			// The provider did the work: the next attempt asks again
			// (a new key), and this one's usage is journaled with its
			// failure.
			return stepResult{usage: u}, &provider.Error{Provider: in.Provider, Status: http.StatusOK, Retryable: true,
				Err: fmt.Errorf("the answer does not match the step's responseSchema: %w", err)}
		}
	}
	if gate != nil && res.final {
		score, judged, err := c.score(gate, resp)
		if err != nil {
			return stepResult{}, err
		}
		if judged != nil {
			u.Add(*judged)
		}
		out.Confidence = &score
		res.confidence = &event.ConfidenceEvaluatedData{Score: score, Min: gate.Min, Passed: score >= gate.Min,
			Source: gate.Source, Usage: u}
	}
	if res.output, err = json.Marshal(out); err != nil {
		return stepResult{}, err
	}
	if res.confidence != nil {
		res.confidence.Output = res.output
	}
	return res, nil
}

// fake is what the step's node tells pal dev's fake provider (its fake
// block, workflow.Fake), nil when it has none. A provider configured for
// the fake (DevFake, PAL_DEV_FAKE) sends it; any other ignores it, so the
// block is not part of the step's journaled input (the journal holds it
// in the workflow, docs/architecture.md §9.7). Its failures count under
// the node's step (an agent's, for all its turns), and its turn is the
// agent turn's index (0 for an ai-step).
func (c *call) fake() *provider.Fake {
	if c.p.Node == nil {
		return nil
	}
	f := workflow.FakeOf(c.p.Node)
	if f == nil {
		return nil
	}
	script, err := f.Header()
	if err != nil {
		return nil
	}
	step, turn := c.p.StepID, 0
	if id, err := engine.ParseStepID(step); err == nil && id.Kind == engine.StepOfTurn {
		step, turn = engine.StepID{Loops: id.Loops, Node: id.Node}.String(), id.Turn
	}
	return &provider.Fake{Script: script, Step: c.d.runID + "/" + step, Turn: turn}
}

// complete sends one model call once a concurrency slot for its provider
// and model is free (PAL_PROVIDER_CONCURRENCY), handing its answer's text
// to sink as it streams. Waiting for a slot is not part of the call's
// timeout and not a failure: it ends only with the call's context (a lost
// lease, a shutdown, a step beside it failing the run).
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
func (c *call) withImages(msgs []provider.Message) ([]provider.Message, error) {
	out, cloned := msgs, false
	for i, m := range msgs {
		for j, img := range m.Images {
			if img.Blob == "" {
				continue
			}
			data, err := c.imageBytes(img)
			if err != nil {
				return nil, permanent("step %s: messages[%d].images[%d]: %v", c.p.StepID, i, j, err)
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
func (c *call) imageBytes(img provider.Image) ([]byte, error) {
	sum := strings.ToLower(img.Blob)
	if !sha256Hex.MatchString(sum) {
		return nil, fmt.Errorf("blob %.80q is not the hex sha256 of a value", img.Blob)
	}
	if !slices.Contains(provider.ImageMediaTypes, img.MediaType) {
		return nil, fmt.Errorf("media type %q is not one of %s", img.MediaType, strings.Join(provider.ImageMediaTypes, ", "))
	}
	value, ok := heldValue(c.held, sum)
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

// minImageValue is the smallest value an image may be: no image is
// smaller than a sha256's hex.
const minImageValue = 64

// namesBlob reports whether an LLM step's call may name a blob (an image
// part's "blob"): only then does its call need the run's values.
func namesBlob(call json.RawMessage) bool { return bytes.Contains(call, []byte(`"blob"`)) }

// heldValues are the values of the run an image may name: its input, and
// each step attempt's input and output, as journaled (a blob's exact
// bytes, so its hash is the blob's name). Taken on the drive's goroutine
// for a call that runs beside it; a journaled value is never changed.
func (d *drive) heldValues() []json.RawMessage {
	var out []json.RawMessage
	keep := func(v json.RawMessage) {
		if len(v) >= minImageValue {
			out = append(out, v)
		}
	}
	keep(d.st.Created.Input)
	for _, id := range d.st.Order {
		for _, a := range d.st.Steps[id].Attempts {
			keep(a.Output)
			keep(a.Input)
		}
	}
	return out
}

// heldValue finds the value of held whose bytes hash to sum.
func heldValue(held []json.RawMessage, sum string) (json.RawMessage, bool) {
	for _, v := range held {
		h := sha256.Sum256(v)
		if hex.EncodeToString(h[:]) == sum {
			return v, true
		}
	}
	return nil, false
}
