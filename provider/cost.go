package provider

import (
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"strings"
	"sync/atomic"

	"github.com/palrun/pal/event"
)

// EnvPrices names a JSON price file that overrides the embedded table (see
// LoadPrices for its form).
const EnvPrices = "PAL_PRICES"

// maxPriceFile bounds a price file: a table of a few hundred models is a
// few tens of KiB.
const maxPriceFile = 1 << 20

// price is a model's list price in US dollars per million tokens: input
// and output required, the prompt cache's rates optional (absent: input's).
type price struct {
	Input      *float64 `json:"input_per_mtok"`
	Output     *float64 `json:"output_per_mtok"`
	CacheRead  *float64 `json:"cache_read_per_mtok"`
	CacheWrite *float64 `json:"cache_write_per_mtok"`
}

// priceFile is the form of prices.json and of a PAL_PRICES file.
type priceFile struct {
	Comment string           `json:"_comment,omitempty"`
	Models  map[string]price `json:"models"`
}

//go:embed prices.json
var embeddedPrices []byte

// table is the process's price table: the embedded one, or it overridden
// by LoadPrices. Reads are lock-free; a process loads its override once
// at start.
var table atomic.Pointer[event.Prices]

func init() {
	m, err := parsePrices(bytes.NewReader(embeddedPrices))
	if err != nil {
		panic("provider: embedded prices.json: " + err.Error())
	}
	table.Store(&m)
}

// parsePrices reads a price file: {"models": {"<model>": {"input_per_mtok":
// 2.5, "output_per_mtok": 10, "cache_read_per_mtok": 1.25}}}. Input and
// output are required; every price is finite and ≥ 0; unknown fields are
// errors (a typo must not price a model at 0).
func parsePrices(r io.Reader) (event.Prices, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxPriceFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxPriceFile {
		return nil, fmt.Errorf("price file is over %d bytes", maxPriceFile)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var f priceFile
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("price file is not {\"models\": {\"<model>\": {\"input_per_mtok\": N, \"output_per_mtok\": N}}}: %w", err)
	}
	if f.Models == nil {
		return nil, errors.New(`price file has no "models" object`)
	}
	out := make(event.Prices, len(f.Models))
	for name, p := range f.Models {
		if strings.TrimSpace(name) == "" {
			return nil, errors.New("price file names a model with an empty name")
		}
		for what, v := range map[string]*float64{"input_per_mtok": p.Input, "output_per_mtok": p.Output,
			"cache_read_per_mtok": p.CacheRead, "cache_write_per_mtok": p.CacheWrite} {
			if v == nil {
				if what == "input_per_mtok" || what == "output_per_mtok" {
					return nil, fmt.Errorf("model %q: %s is missing", name, what)
				}
				continue
			}
			if math.IsNaN(*v) || math.IsInf(*v, 0) || *v < 0 {
				return nil, fmt.Errorf("model %q: %s is %v, want a price ≥ 0", name, what, *v)
			}
		}
		pr := event.Price{InputPerMTok: *p.Input, OutputPerMTok: *p.Output}
		if p.CacheRead != nil {
			pr.CacheReadPerMTok = *p.CacheRead
		}
		if p.CacheWrite != nil {
			pr.CacheWritePerMTok = *p.CacheWrite
		}
		out[strings.ToLower(name)] = pr
	}
	return out, nil
}

// LoadPrices reads the price file at path and overrides the embedded table
// with it: a model the file names takes the file's prices, the others keep
// the embedded ones. The file's form:
//
//	{"models": {"gpt-4o": {"input_per_mtok": 2.50, "output_per_mtok": 10.00}}}
//
// A file that does not parse changes nothing and returns an error naming
// the file.
func LoadPrices(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("%s: %w", EnvPrices, err)
	}
	defer f.Close()
	over, err := parsePrices(f)
	if err != nil {
		return fmt.Errorf("%s=%s: %w", EnvPrices, path, err)
	}
	base, _ := parsePrices(bytes.NewReader(embeddedPrices))
	for k, v := range over {
		base[k] = v
	}
	table.Store(&base)
	return nil
}

// Prices is a copy of the process's price table: the embedded one, or it
// overridden by LoadPrices (PAL_PRICES). Whoever creates a run journals
// the part of it the run's workflow names (run_created.prices), so the
// run is priced the same by every worker, whatever its own table.
func Prices() event.Prices { return maps.Clone(*table.Load()) }

// PriceOf returns model's list price in US dollars per million input and
// output tokens in the process's table, and false when the table does not
// know the model. A dated snapshot name is priced as its model
// (claude-sonnet-4-5-20250929 as claude-sonnet-4-5). A run is priced with
// its journaled prices, not with this.
func PriceOf(model string) (inputPerMTok, outputPerMTok float64, ok bool) {
	p, ok := table.Load().Of(model)
	return p.InputPerMTok, p.OutputPerMTok, ok
}

// Cost estimates the price in US dollars of a call to model that used u,
// from the process's table: cached input at the cache rates. It is an
// estimate from list prices: it knows nothing of batch discounts or
// negotiated rates, and a model the table does not know costs 0 (PriceOf
// tells whether it knows it).
func Cost(model string, u Usage) float64 {
	p, _ := table.Load().Of(model)
	return p.CostOf(u.Event())
}

// Event is u as a step journals it (event.Usage), without a cost.
func (u Usage) Event() event.Usage {
	return event.Usage{InputTokens: u.InputTokens, OutputTokens: u.OutputTokens, TotalTokens: u.InputTokens + u.OutputTokens,
		CacheReadTokens: u.CacheReadTokens, CacheWriteTokens: u.CacheWriteTokens, ReasoningTokens: u.ReasoningTokens}
}

// ResetPrices restores the embedded table (tests).
func ResetPrices() {
	m, _ := parsePrices(bytes.NewReader(embeddedPrices))
	table.Store(&m)
}
