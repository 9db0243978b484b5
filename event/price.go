package event

import (
	"regexp"
	"strings"
)

// Price is a model's list price in US dollars per million tokens.
type Price struct {
	InputPerMTok  float64 `json:"input_per_mtok"`
	OutputPerMTok float64 `json:"output_per_mtok"`
}

// Cost is the price in US dollars of a call that used in input and out
// output tokens.
func (p Price) Cost(in, out int64) float64 {
	return (float64(in)*p.InputPerMTok + float64(out)*p.OutputPerMTok) / 1e6
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
