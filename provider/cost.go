package provider

import (
	"regexp"
	"strings"
)

// price is a model's list price in US dollars per million tokens.
type price struct {
	input, output float64
}

// prices holds list prices (USD per million tokens, standard tier, no
// caching or batch discounts) for a handful of models. They change; update
// them from the providers' price pages.
var prices = map[string]price{
	// OpenAI
	"gpt-4o":       {2.50, 10.00},
	"gpt-4o-mini":  {0.15, 0.60},
	"gpt-4.1":      {2.00, 8.00},
	"gpt-4.1-mini": {0.40, 1.60},
	"gpt-4.1-nano": {0.10, 0.40},
	"gpt-5":        {1.25, 10.00},
	"gpt-5-mini":   {0.25, 2.00},
	"gpt-5-nano":   {0.05, 0.40},
	// Anthropic
	"claude-opus-4-1":   {15.00, 75.00},
	"claude-opus-4-5":   {5.00, 25.00},
	"claude-sonnet-4":   {3.00, 15.00},
	"claude-sonnet-4-5": {3.00, 15.00},
	"claude-haiku-4-5":  {1.00, 5.00},
}

// dateSuffix matches the snapshot date some model names carry
// (claude-sonnet-4-5-20250929, gpt-4o-mini-2024-07-18).
var dateSuffix = regexp.MustCompile(`-(\d{8}|\d{4}-\d{2}-\d{2})$`)

// PriceOf returns model's list price in US dollars per million input and
// output tokens, and false when the table does not know the model. A dated
// snapshot name is priced as its model (claude-sonnet-4-5-20250929 as
// claude-sonnet-4-5).
func PriceOf(model string) (inputPerMTok, outputPerMTok float64, ok bool) {
	p, ok := prices[model]
	if !ok {
		p, ok = prices[dateSuffix.ReplaceAllString(strings.ToLower(model), "")]
	}
	return p.input, p.output, ok
}

// Cost estimates the price in US dollars of a call to model that used u. It
// is an estimate from a small built-in table of list prices: it knows nothing
// of cached-input or batch discounts, negotiated rates or price changes, and
// a model it does not know costs 0 (PriceOf tells whether it knows it).
func Cost(model string, u Usage) float64 {
	in, out, ok := PriceOf(model)
	if !ok {
		return 0
	}
	return (float64(u.InputTokens)*in + float64(u.OutputTokens)*out) / 1e6
}
