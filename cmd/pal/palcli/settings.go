package palcli

import (
	"fmt"
	"log/slog"
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

// settings are what every pal command that connects to NATS reads the
// same way. A command parses them once, before it starts anything
// (withSettings), and passes them down: every runs.Client of the process —
// a one-shot pal run command's (connectClient), pal server's REST API and
// NATS service's, a worker's command processor's — is built from them by
// client, so a command journals the same rules whichever door it came in
// by.
type settings struct {
	// nats is where NATS is and as whom to connect (--nats-url or
	// PAL_NATS_URL, PAL_NATS_CREDS).
	nats natsTarget
	// log is the process logger (PAL_LOG_LEVEL).
	log *slog.Logger
	// anomalies are the PAL_ANOMALY_* rules the runs the process starts
	// record under their workflow's own, and its workers' defaults.
	anomalies map[string]event.AnomalyRule
	// replyPrefixes are where command replies may go besides _INBOX.
	// (PAL_REPLY_PREFIX).
	replyPrefixes []string
}

// readSettings parses the settings; an invalid one is exit code 2, named.
func (e *env) readSettings(cmd *cobra.Command) (*settings, error) {
	s := &settings{}
	var err error
	if s.nats, err = e.natsTarget(cmd); err != nil {
		return nil, err
	}
	if s.log, err = e.logger(); err != nil {
		return nil, err
	}
	if s.anomalies, err = parseAnomalySettings(e.getenv); err != nil {
		return nil, withCode(ExitBadInput, err)
	}
	if s.replyPrefixes, err = runs.ParseReplyPrefixes(e.getenv("PAL_REPLY_PREFIX")); err != nil {
		return nil, withCode(ExitBadInput, err)
	}
	// Prices change: a file of one's own overrides the embedded table,
	// and the runs this process creates journal their models' prices
	// from it (engine.RunCreated).
	if err := e.loadPrices(); err != nil {
		return nil, err
	}
	return s, nil
}

// withSettings is the RunE of a command that connects to NATS: it reads
// the settings once, then runs the command with them.
func (e *env) withSettings(run func(cmd *cobra.Command, args []string, s *settings) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		s, err := e.readSettings(cmd)
		if err != nil {
			return err
		}
		return run(cmd, args, s)
	}
}

// client is the front door over store, the one way the process builds
// one.
func (s *settings) client(store *eventstore.Store) *runs.Client {
	return runs.New(store, runs.WithReplyPrefixes(s.replyPrefixes...), runs.WithAnomalyDefaults(s.anomalies))
}
