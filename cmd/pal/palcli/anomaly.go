package palcli

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/palrun/pal/engine"
	"github.com/palrun/pal/event"
)

// parseAnomalySettings reads the settings' anomaly defaults:
// PAL_ANOMALY_<TYPE> (PAL_ANOMALY_RUNAWAY_LOOP, …) holds comma-separated
// key=value pairs, threshold, perStep, requests, floor, action, e.g.
// "threshold=3,action=pause". Errors name the variable.
func parseAnomalySettings(getenv func(string) string) (map[string]event.AnomalyRule, error) {
	out := map[string]event.AnomalyRule{}
	for _, t := range engine.AnomalyTypes {
		name := "PAL_ANOMALY_" + strings.ToUpper(t)
		v := strings.TrimSpace(getenv(name))
		if v == "" {
			continue
		}
		if len(v) > 256 {
			return nil, fmt.Errorf("%s: %d bytes; the limit is 256", name, len(v))
		}
		var r event.AnomalyRule
		for _, kv := range strings.Split(v, ",") {
			k, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
			if !ok {
				return nil, fmt.Errorf("%s: %q is not key=value (keys: threshold, perStep, requests, floor, action)", name, kv)
			}
			if k == "action" {
				switch val {
				case event.ActionRecord, event.ActionHalt, event.ActionPause:
					r.Action = val
					continue
				}
				return nil, fmt.Errorf("%s: action %q: want record, halt or pause", name, val)
			}
			f, err := strconv.ParseFloat(val, 64)
			if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) || f > 1e9 {
				return nil, fmt.Errorf("%s: %s=%q: want a number from 0 to 1e9", name, k, val)
			}
			switch k {
			case "threshold":
				r.Threshold = f
			case "perStep":
				r.PerStep = f
			case "requests":
				r.Requests = f
			case "floor":
				r.Floor = f
			default:
				return nil, fmt.Errorf("%s: unknown key %q (keys: threshold, perStep, requests, floor, action)", name, k)
			}
		}
		out[t] = r
	}
	return out, nil
}
