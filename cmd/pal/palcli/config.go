package palcli

import (
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/runs"
)

// DefaultNATSURL is where PAL looks for NATS when PAL_NATS_URL is unset.
const DefaultNATSURL = "nats://127.0.0.1:4222"

// Durability modes (PAL_DURABILITY).
const (
	DurabilityProcess = "process"
	DurabilityStrict  = "strict"
)

// stringSetting returns a flag's value if set, else the env variable, else
// def.
func (e *env) stringSetting(cmd *cobra.Command, flag, envName, def string) string {
	if f := cmd.Flags().Lookup(flag); f != nil && f.Changed {
		return f.Value.String()
	}
	if v := e.getenv(envName); v != "" {
		return v
	}
	return def
}

func (e *env) natsURL(cmd *cobra.Command) string {
	return e.stringSetting(cmd, "nats-url", "PAL_NATS_URL", DefaultNATSURL)
}

// rawSetting is a flag's value if set, else the env variable's; what says
// where it came from, for errors: `--flag "v"` or `ENV="v"`.
func (e *env) rawSetting(cmd *cobra.Command, flag, envName string) (v string, what func() string) {
	if f := cmd.Flags().Lookup(flag); flag != "" && f != nil && f.Changed {
		v = f.Value.String()
		return v, func() string { return fmt.Sprintf("--%s %q", flag, v) }
	}
	v = e.getenv(envName)
	return v, func() string { return fmt.Sprintf("%s=%q", envName, v) }
}

func (e *env) durationSetting(cmd *cobra.Command, flag, envName string, def, min time.Duration) (time.Duration, error) {
	v, what := e.rawSetting(cmd, flag, envName)
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, badInput("%s: not a duration (write it like 3s or 500ms)", what())
	}
	if d < min {
		return 0, badInput("%s: must be at least %s", what(), min)
	}
	return d, nil
}

func (e *env) intSetting(cmd *cobra.Command, flag, envName string, def, min int) (int, error) {
	v, what := e.rawSetting(cmd, flag, envName)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < min {
		return 0, badInput("%s: want a whole number ≥ %d", what(), min)
	}
	return n, nil
}

func (e *env) durability(cmd *cobra.Command) (string, error) {
	v, what := e.rawSetting(cmd, "durability", "PAL_DURABILITY")
	switch v {
	case "":
		return DurabilityProcess, nil
	case DurabilityProcess, DurabilityStrict:
		return v, nil
	}
	return "", badInput("%s: want %q or %q", what(), DurabilityProcess, DurabilityStrict)
}

func (e *env) leaseTTL(cmd *cobra.Command) (time.Duration, error) {
	d, err := e.durationSetting(cmd, "lease-ttl", "PAL_LEASE_TTL", 3*time.Second, time.Second)
	if err != nil {
		return 0, err
	}
	if d%time.Second != 0 {
		_, what := e.rawSetting(cmd, "lease-ttl", "PAL_LEASE_TTL")
		return 0, badInput("%s: leases expire in whole seconds (write 1s, 2s, 3s …)", what())
	}
	return d, nil
}

func (e *env) workerID(cmd *cobra.Command) (string, error) {
	id, what := e.rawSetting(cmd, "worker-id", "PAL_WORKER_ID")
	if id == "" {
		return "", nil
	}
	if err := event.ValidateRunID(id); err != nil {
		return "", badInput("%s: use letters, digits, '_' and '-' only", what())
	}
	return id, nil
}

func (e *env) replicas(cmd *cobra.Command) (int, error) {
	return e.intSetting(cmd, "replicas", "PAL_REPLICAS", 1, 1)
}

// runsClient is the front door over store, with the reply prefixes of
// PAL_REPLY_PREFIX and the anomaly defaults of PAL_ANOMALY_*. Errors name
// the variable.
func (e *env) runsClient(store *eventstore.Store) (*runs.Client, error) {
	prefixes, err := runs.ParseReplyPrefixes(e.getenv("PAL_REPLY_PREFIX"))
	if err != nil {
		return nil, err
	}
	anomalies, err := parseAnomalySettings(e.getenv)
	if err != nil {
		return nil, err
	}
	return runs.New(store, runs.WithReplyPrefixes(prefixes...), runs.WithAnomalyDefaults(anomalies)), nil
}
