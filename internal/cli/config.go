package cli

import (
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/palrun/pal/engine"
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

func (e *env) durationSetting(cmd *cobra.Command, flag, envName string, def, min time.Duration) (time.Duration, error) {
	src := "--" + flag
	v := ""
	if f := cmd.Flags().Lookup(flag); f != nil && f.Changed {
		v = f.Value.String()
	} else if v = e.getenv(envName); v != "" {
		src = envName
	}
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return 0, badInput("%s=%q: not a duration (write it like 3s or 500ms)", src, v)
	}
	if d < min {
		return 0, badInput("%s=%q: must be at least %s", src, v, min)
	}
	return d, nil
}

func (e *env) intSetting(cmd *cobra.Command, flag, envName string, def, min int) (int, error) {
	src := "--" + flag
	v := ""
	if f := cmd.Flags().Lookup(flag); f != nil && f.Changed {
		v = f.Value.String()
	} else if v = e.getenv(envName); v != "" {
		src = envName
	}
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < min {
		return 0, badInput("%s=%q: want a whole number ≥ %d", src, v, min)
	}
	return n, nil
}

func (e *env) durability(cmd *cobra.Command) (string, error) {
	v := e.stringSetting(cmd, "durability", "PAL_DURABILITY", DurabilityProcess)
	switch v {
	case DurabilityProcess, DurabilityStrict:
		return v, nil
	}
	return "", badInput("PAL_DURABILITY=%q: want %q or %q", v, DurabilityProcess, DurabilityStrict)
}

func (e *env) leaseTTL(cmd *cobra.Command) (time.Duration, error) {
	d, err := e.durationSetting(cmd, "lease-ttl", "PAL_LEASE_TTL", 3*time.Second, time.Second)
	if err != nil {
		return 0, err
	}
	if d%time.Second != 0 {
		return 0, badInput("PAL_LEASE_TTL=%s: leases expire in whole seconds (write 1s, 2s, 3s …)", d)
	}
	return d, nil
}

func (e *env) workerID(cmd *cobra.Command) (string, error) {
	id := e.stringSetting(cmd, "worker-id", "PAL_WORKER_ID", "")
	if id == "" {
		return "", nil
	}
	if err := event.ValidateRunID(id); err != nil {
		return "", badInput("PAL_WORKER_ID=%q: use letters, digits, '_' and '-' only", id)
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
	anomalies, err := engine.ParseAnomalySettings(e.getenv)
	if err != nil {
		return nil, err
	}
	return runs.New(store, runs.WithReplyPrefixes(prefixes...), runs.WithAnomalyDefaults(anomalies)), nil
}
