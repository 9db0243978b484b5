package event_test

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
)

func TestPricesOf(t *testing.T) {
	t.Parallel()
	p := event.Prices{"gpt-4o": {InputPerMTok: 2.5, OutputPerMTok: 10}, "gpt-4o-2024-08-06": {InputPerMTok: 1, OutputPerMTok: 2}}
	for model, want := range map[string]float64{
		"gpt-4o": 2.5, "GPT-4o": 2.5, "gpt-4o-2024-05-13": 2.5, "gpt-4o-20240513": 2.5,
		"gpt-4o-2024-08-06": 1, // the snapshot's own price
	} {
		got, ok := p.Of(model)
		require.True(t, ok, model)
		require.Equal(t, want, got.InputPerMTok, model)
	}
	for _, model := range []string{"gpt-4", "gpt-4o-mini", "gpt-4o-latest", ""} {
		_, ok := p.Of(model)
		require.False(t, ok, model)
	}
	_, ok := event.Prices(nil).Of("gpt-4o")
	require.False(t, ok)
	require.InDelta(t, (3*2.5+4*10.0)/1e6, p["gpt-4o"].Cost(3, 4), 1e-18)
}

// TestPricesJournaledEvenEmpty: a run_created whose workflow names no
// priced model still says so ("prices": {}), which a reader tells from a
// run_created written before prices were journaled (no "prices").
func TestPricesJournaledEvenEmpty(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		prices event.Prices
		json   string
	}{{nil, `{"input":null,"depth":0}`}, {event.Prices{}, `{"input":null,"depth":0,"prices":{}}`}} {
		b, err := json.Marshal(event.RunCreatedData{Prices: tt.prices})
		require.NoError(t, err)
		require.JSONEq(t, tt.json, string(b))
		var back event.RunCreatedData
		require.NoError(t, json.Unmarshal(b, &back))
		require.Equal(t, tt.prices == nil, back.Prices == nil)
	}
}
