package event

import (
	"regexp"
	"strings"
)

// Price is a model's list price in US dollars per million tokens. Input
// read from the provider's prompt cache and input written to it have their
// own rates; a rate that is 0 (absent, as in prices journaled before they
// were priced apart) prices those tokens as input.
type Price struct {
	InputPerMTok      float64 `json:"input_per_mtok"`
	OutputPerMTok     float64 `json:"output_per_mtok"`
	CacheReadPerMTok  float64 `json:"cache_read_per_mtok,omitempty"`
	CacheWritePerMTok float64 `json:"cache_write_per_mtok,omitempty"`
}

// Cost is the price in US dollars of a call that used in input and out
// output tokens, none of them cached.
func (p Price) Cost(in, out int64) float64 {
	return (float64(in)*p.InputPerMTok + float64(out)*p.OutputPerMTok) / 1e6
}

// CostOf is the price in US dollars of a call that used u: its input
// tokens at the input rate, but those read from or written to the prompt
// cache at the cache rates, and its output tokens (reasoning included) at
// the output rate.
func (p Price) CostOf(u Usage) float64 {
	plain := u.InputTokens - u.CacheReadTokens - u.CacheWriteTokens
	if plain < 0 {
		plain = 0 // a provider's counts that do not add up are not a refund
	}
	return (float64(plain)*p.InputPerMTok + float64(u.CacheReadTokens)*p.cacheRead() +
		float64(u.CacheWriteTokens)*p.cacheWrite() + float64(u.OutputTokens)*p.OutputPerMTok) / 1e6
}

// InputWorstPerMTok is the most an input token can cost: the input rate,
// or the cache-write rate when that is higher (a budget's worst case).
func (p Price) InputWorstPerMTok() float64 { return max(p.InputPerMTok, p.cacheWrite()) }

func (p Price) cacheRead() float64 {
	if p.CacheReadPerMTok > 0 {
		return p.CacheReadPerMTok
	}
	return p.InputPerMTok
}

func (p Price) cacheWrite() float64 {
	if p.CacheWritePerMTok > 0 {
		return p.CacheWritePerMTok
	}
	return p.InputPerMTok
}

// Prices is a price table by model name in lower case: a process's
// (package provider) or the one a run journals in run_created.
type Prices map[string]Price

// dateSuffix matches the snapshot date some model names carry
// (claude-sonnet-4-5-20250929, gpt-4o-mini-2024-07-18).
var dateSuffix = regexp.MustCompile(`-(\d{8}|\d{4}-\d{2}-\d{2})$`)

// Of returns model's price, and false when p does not know the model. A
// name is matched in lower case, and a dated snapshot name is priced as
// its model (claude-sonnet-4-5-20250929 as claude-sonnet-4-5) unless p
// names the snapshot itself.
func (p Prices) Of(model string) (Price, bool) {
	name := strings.ToLower(model)
	pr, ok := p[name]
	if !ok {
		pr, ok = p[dateSuffix.ReplaceAllString(name, "")]
	}
	return pr, ok
}
