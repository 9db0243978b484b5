package palcli

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
)

// TestParseAnomalySettings: PAL_ANOMALY_<TYPE> overlays the built-in
// rules; a wrong or over-long value is refused naming the variable.
func TestParseAnomalySettings(t *testing.T) {
	t.Parallel()
	env := map[string]string{"PAL_ANOMALY_RUNAWAY_LOOP": "threshold=3, action=pause", "PAL_ANOMALY_COST_SPIKE": "floor=2"}
	got, err := parseAnomalySettings(func(k string) string { return env[k] })
	require.NoError(t, err)
	require.Equal(t, event.AnomalyRule{Threshold: 3, Action: event.ActionPause}, got[event.AnomalyRunawayLoop])
	eff := engine.EffectiveAnomalies(got, nil)
	require.Equal(t, event.AnomalyRule{Threshold: 3, Requests: 10, Action: event.ActionPause}, eff[event.AnomalyRunawayLoop])
	require.Equal(t, 2.0, eff[event.AnomalyCostSpike].Floor)
	for _, bad := range []string{"threshold", "action=stop", "threshold=-1", "nope=1", "threshold=NaN", strings.Repeat("threshold=1,", 22)} {
		_, err := parseAnomalySettings(func(k string) string {
			if k == "PAL_ANOMALY_RETRY_STORM" {
				return bad
			}
			return ""
		})
		require.ErrorContains(t, err, "PAL_ANOMALY_RETRY_STORM", bad)
	}
}
