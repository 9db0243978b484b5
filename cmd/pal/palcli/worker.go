package palcli

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/palrun/pal/connector"
	"github.com/palrun/pal/connector/email"
	"github.com/palrun/pal/connector/webhook"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/internal/egress"
	"github.com/palrun/pal/internal/sandbox"
	"github.com/palrun/pal/internal/service"
	"github.com/palrun/pal/projections"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/provider/anthropic"
	"github.com/palrun/pal/provider/openai"
	"github.com/palrun/pal/receipt"
	"github.com/palrun/pal/runs"
	"github.com/palrun/pal/workers"
	"github.com/palrun/pal/workflow"
)

func (e *env) workerCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Drive runs from the work queue",
		Long: `pal worker takes runs from the PAL_WORK queue and drives them, journaling
every step to PAL_EVENTS. Run as many as you like; each run is driven by
one worker at a time (a lease in PAL_LEASES). On SIGTERM a worker hands its
runs to the others at once.

Workers also carry out the durable commands of PAL_CMDS and answer the NATS
service pal, holding each caller to the limits of PAL_LIMIT_STARTS and
PAL_LIMIT_COMMANDS (pal server --help says them; each worker process
keeps its own count), and run the recovery sweep every PAL_RECOVERY_INTERVAL
(default 30s): runs in flight (the PAL_INFLIGHT index, and with
DATABASE_URL the runs the projection shows running or queued) with no
live lease and no pending work are queued again.

Every worker fires the due ticks of the schedules in PAL_SCHEDULES (pal
schedule): a tick is one run whatever the number of workers, and with
several a kill -9 of one costs no tick.

With PAL_METRICS_ADDR (host:port) the worker serves Prometheus metrics at
/metrics there, without a token. With OTEL_EXPORTER_OTLP_ENDPOINT it
exports OpenTelemetry traces (one per drive) over OTLP/HTTP.`,
		Args: cobra.NoArgs,
		RunE: e.withSettings(func(cmd *cobra.Command, _ []string, s *settings) error {
			wc, err := e.workerConfig(cmd)
			if err != nil {
				return err
			}
			for _, w := range providerWarnings(e.getenv) {
				s.log.Warn(w)
			}
			providers, err := e.providersFromEnv()
			if err != nil {
				return err
			}
			return e.runWorker(cmd.Context(), s, wc, providers, e.getenv("DATABASE_URL"))
		}),
	}
	addWorkerFlags(cmd)
	return cmd
}

func addWorkerFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.String("worker-id", "", "worker id in leases and events (env PAL_WORKER_ID, default host-pid)")
	f.String("lease-ttl", "", "lease time-to-live, whole seconds (env PAL_LEASE_TTL, default 3s)")
	f.Int("concurrency", 0, "runs driven at once (env PAL_WORKER_CONCURRENCY, default 64)")
	f.Int("run-concurrency", 0, "steps of one run in flight at once, at most (env PAL_RUN_CONCURRENCY, default 32, at most 1000)")
	f.String("queues", "", "work queues to take runs from, comma-separated (env PAL_QUEUES, default: default)")
	f.String("durability", "", "process or strict (env PAL_DURABILITY, default process)")
	f.Int("replicas", 0, "stream replicas: 1 on one server, 3 in a cluster (env PAL_REPLICAS, default 1)")
}

// workerConfig is a validated worker configuration.
type workerConfig struct {
	id          string
	leaseTTL    time.Duration
	concurrency int
	// runConcurrency caps the steps of one run in flight
	// (PAL_RUN_CONCURRENCY).
	runConcurrency int
	// queues are the work queues the worker takes runs from (PAL_QUEUES).
	queues     []string
	durability string
	replicas   int
	egress     *egress.Policy // PAL_EGRESS_ALLOW
	smtpURL    string         // PAL_SMTP_URL, for the email connector
	keys       *receipt.Keys  // PAL_SIGNING_KEY (+ _OLD); nil signs nothing
	// retryAfterMax caps a provider's Retry-After (PAL_RETRY_AFTER_MAX).
	retryAfterMax time.Duration
	// providerConcurrency limits model calls in flight
	// (PAL_PROVIDER_CONCURRENCY).
	providerConcurrency map[string]int
	// blobThreshold is the size above which a step value goes to
	// PAL_BLOBS (PAL_BLOB_THRESHOLD).
	blobThreshold int
	// recovery is the sweep's interval (PAL_RECOVERY_INTERVAL), and
	// recoveryWarn why it is the default when a value was given.
	recovery     time.Duration
	recoveryWarn string
	// sandbox runs process steps (PAL_PROCESS_SANDBOX,
	// PAL_PROCESS_PROGRAMS, PAL_PROCESS_MOUNTS) and stdio MCP servers.
	sandbox *sandbox.Runner
	// mcp are the MCP servers tools may call (PAL_MCP_CONFIG).
	mcp *workers.MCPConfig
	// threads bound each thread (PAL_THREAD_MAX_TURNS,
	// PAL_THREAD_MAX_BYTES).
	threads eventstore.ThreadLimits
}

func (e *env) workerConfig(cmd *cobra.Command) (workerConfig, error) {
	var wc workerConfig
	var err error
	if wc.id, err = e.workerID(cmd); err != nil {
		return wc, err
	}
	if wc.leaseTTL, err = e.leaseTTL(cmd); err != nil {
		return wc, err
	}
	if wc.concurrency, err = e.intSetting(cmd, "concurrency", "PAL_WORKER_CONCURRENCY", 64, 1); err != nil {
		return wc, err
	}
	if wc.runConcurrency, err = e.runConcurrency(cmd); err != nil {
		return wc, err
	}
	if wc.queues, err = e.queues(cmd); err != nil {
		return wc, err
	}
	if wc.blobThreshold, err = e.intSetting(cmd, "blob-threshold", "PAL_BLOB_THRESHOLD", eventstore.DefaultBlobThreshold, eventstore.MinBlobThreshold); err != nil {
		return wc, err
	}
	if wc.durability, err = e.durability(cmd); err != nil {
		return wc, err
	}
	if wc.replicas, err = e.replicas(cmd); err != nil {
		return wc, err
	}
	if wc.egress, err = egress.Parse(e.getenv(egress.EnvAllow)); err != nil {
		return wc, withCode(ExitBadInput, err)
	}
	// Unset is fine (email steps then fail with the reason); a wrong value
	// is refused at start rather than at the first email.
	if wc.smtpURL = e.getenv(email.EnvURL); wc.smtpURL != "" {
		if _, err := email.ParseURL(wc.smtpURL); err != nil {
			return wc, withCode(ExitBadInput, err)
		}
	}
	if wc.keys, err = receipt.LoadKeys(e.getenv); err != nil {
		return wc, withCode(ExitBadInput, err)
	}
	if wc.retryAfterMax, err = e.durationSetting(cmd, "", workers.EnvRetryAfterMax, workers.DefaultRetryAfterMax, time.Millisecond); err != nil {
		return wc, err
	}
	if wc.providerConcurrency, err = workers.ParseProviderConcurrency(e.getenv(workers.EnvProviderConcurrency)); err != nil {
		return wc, withCode(ExitBadInput, err)
	}
	// Secrets and their hosts are read from the process's own
	// environment as a step sends (never dev.env); a bad host list stops
	// the worker here instead.
	if err := workers.CheckSecretHosts(os.Environ()); err != nil {
		return wc, withCode(ExitBadInput, err)
	}
	if wc.threads.MaxTurns, err = e.intSetting(cmd, "", workers.EnvThreadMaxTurns, event.DefaultThreadMaxTurns, 1); err != nil {
		return wc, err
	}
	if wc.threads.MaxBytes, err = e.intSetting(cmd, "", workers.EnvThreadMaxBytes, event.DefaultThreadMaxBytes, 1); err != nil {
		return wc, err
	}
	wc.recovery, wc.recoveryWarn = workers.RecoveryInterval(e.getenv("PAL_RECOVERY_INTERVAL"))
	if wc.sandbox, err = e.processSandbox(cmd); err != nil {
		return wc, withCode(ExitBadInput, err)
	}
	if wc.mcp, err = workers.LoadMCPConfig(e.getenv(workers.EnvMCPConfig)); err != nil {
		return wc, withCode(ExitBadInput, err)
	}
	return wc, nil
}

// EnvQueues names the work queues a worker takes runs from.
const EnvQueues = "PAL_QUEUES"

// maxQueues bounds how many queues one worker takes runs from.
const maxQueues = 16

// queues is PAL_QUEUES (--queues): the work queues the worker takes runs
// from, comma-separated; unset, the default queue.
func (e *env) queues(cmd *cobra.Command) ([]string, error) {
	v, what := e.rawSetting(cmd, "queues", EnvQueues)
	if strings.TrimSpace(v) == "" {
		return []string{event.DefaultQueue}, nil
	}
	var qs []string
	for _, q := range strings.Split(v, ",") {
		q = strings.TrimSpace(q)
		if err := event.ValidateQueue(q); err != nil {
			return nil, badInput("%s: %v", what(), err)
		}
		if !slices.Contains(qs, q) {
			qs = append(qs, q)
		}
	}
	if len(qs) > maxQueues {
		return nil, badInput("%s: at most %d queues", what(), maxQueues)
	}
	return qs, nil
}

// runConcurrency is PAL_RUN_CONCURRENCY (--run-concurrency): how many
// steps of one run a worker has in flight at once, at most; a workflow's
// policy.concurrency asks for fewer or as many.
func (e *env) runConcurrency(cmd *cobra.Command) (int, error) {
	n, err := e.intSetting(cmd, "run-concurrency", workers.EnvRunConcurrency, workers.DefaultRunConcurrency, 1)
	if err != nil {
		return 0, err
	}
	if n > workflow.MaxConcurrency {
		_, what := e.rawSetting(cmd, "run-concurrency", workers.EnvRunConcurrency)
		return 0, badInput("%s: at most %d (a workflow's policy.concurrency is at most that)", what(), workflow.MaxConcurrency)
	}
	return n, nil
}

// processSandbox reads the settings of the process tier. No sandbox may
// see the data directory, the signing key or the NATS credentials, also
// under a mount.
func (e *env) processSandbox(cmd *cobra.Command) (*sandbox.Runner, error) {
	// The data directory named, and the one whose dev.env this command
	// read (the nearest .pal above it), which may differ.
	cfg := sandbox.Config{Private: []string{e.dataDir(cmd), filepath.Dir(devEnvPath(e.getenv)),
		e.getenv(receipt.EnvSigningKey), e.getenv("PAL_NATS_CREDS")}}
	switch v := e.getenv(workers.EnvProcessSandbox); v {
	case "", "on":
	case "off":
		cfg.Off = true
	default:
		return nil, fmt.Errorf("%s=%q: want on or off", workers.EnvProcessSandbox, v)
	}
	var err error
	if cfg.Mounts, err = sandbox.ParseMounts(e.getenv(workers.EnvProcessMounts)); err != nil {
		return nil, fmt.Errorf("%s: %w", workers.EnvProcessMounts, err)
	}
	cfg.Programs = sandbox.ParsePrograms(e.getenv(workers.EnvProcessPrograms))
	r, err := sandbox.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("%s, %s: %w", workers.EnvProcessMounts, workers.EnvProcessPrograms, err)
	}
	return r, nil
}

// providersFromEnv builds the LLM providers from OPENAI_*, ANTHROPIC_* and
// PAL_DEV_FAKE (the environment, then pal dev's dev.env).
func (e *env) providersFromEnv() (provider.Registry, error) { return providersOf(e.getenv) }

// envDevFake names the setting that says the providers are pal dev's
// built-in fake: a node's fake block is sent to it (§9.7).
const envDevFake = "PAL_DEV_FAKE"

// providersOf builds the LLM providers from OPENAI_API_KEY, OPENAI_BASE_URL,
// ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL and PAL_DEV_FAKE as getenv gives
// them. With PAL_DEV_FAKE=1 a provider whose base URL is on loopback sends
// the nodes' fake blocks (DevFake); a provider elsewhere never does.
func providersOf(getenv func(string) string) (provider.Registry, error) {
	var fake bool
	switch v := getenv(envDevFake); v {
	case "", "0", "false":
	case "1", "true":
		fake = true
	default:
		return nil, badInput("%s=%q: want 1 or 0", envDevFake, v)
	}
	openaiURL, anthropicURL := getenv("OPENAI_BASE_URL"), getenv("ANTHROPIC_BASE_URL")
	return provider.Registry{
		"openai": openai.New(openai.Config{APIKey: getenv("OPENAI_API_KEY"), BaseURL: openaiURL,
			DevFake: fake && onLoopback(openaiURL)}),
		"anthropic": anthropic.New(anthropic.Config{APIKey: getenv("ANTHROPIC_API_KEY"), BaseURL: anthropicURL,
			DevFake: fake && onLoopback(anthropicURL)}),
	}, nil
}

// onLoopback reports whether a base URL names this machine (localhost or
// a loopback address), where pal dev's fake provider listens.
func onLoopback(base string) bool {
	u, err := url.Parse(base)
	if err != nil {
		return false
	}
	host := u.Hostname()
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// providerWarnings names each provider that would call its public API
// without an API key: every LLM step for it would fail, so a worker says
// so when it starts rather than at the first step. A base URL of one's own
// (a local server) may well need no key.
func providerWarnings(getenv func(string) string) []string {
	var out []string
	for _, p := range []struct{ name, prefix string }{{"openai", "OPENAI"}, {"anthropic", "ANTHROPIC"}} {
		if getenv(p.prefix+"_API_KEY") == "" && getenv(p.prefix+"_BASE_URL") == "" {
			out = append(out, fmt.Sprintf("%s_API_KEY and %s_BASE_URL are unset: every %s step will fail against the public API. "+
				"Set them, or run this worker in the directory of a running pal dev (it reads .pal/dev.env, the fake provider's address)",
				p.prefix, p.prefix, p.name))
		}
	}
	return out
}

func connectors(wc workerConfig) connector.Registry {
	wh := webhook.New(webhook.WithEgress(wc.egress))
	em := email.New(wc.smtpURL, email.WithEgress(wc.egress))
	return connector.Registry{wh.Kind(): wh, em.Kind(): em}
}

// startWriteSide starts, on st, a worker, the durable command processor,
// the NATS service pal, the scheduler and the recovery sweep (over the runs in flight of
// PAL_INFLIGHT, and with pool the projection's too). nc, when given, is
// used instead of dialling s.nats (pal dev passes an in-process
// connection).
func startWriteSide(ctx context.Context, st *service.Stack, s *settings, wc workerConfig, nc *nats.Conn, providers provider.Registry, pool *pgxpool.Pool) error {
	log := s.log
	if nc == nil {
		var err error
		if nc, err = connectDurable(s.nats, "pal-worker", log); err != nil {
			return withCode(ExitUnavailable, fmt.Errorf("connecting to NATS at %s: %w", s.nats, err))
		}
		st.Started("the NATS connection", service.Closer(nc.Close))
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if err := setupWithRetry(ctx, js, eventstore.Config{Replicas: wc.replicas, LeaseTTL: wc.leaseTTL, Queues: wc.queues}, log); err != nil {
		return withCode(ExitUnavailable, err)
	}
	// A try that gets no answer (the server or the stream's leader died
	// mid-request) is retried after this long; the retry is resolved by the
	// lost-ack check. Short, since on a cluster the new leader is there
	// within about a second (natsraft.Fast): 500 ms at the default TTL.
	reqTimeout := min(max(wc.leaseTTL/6, 500*time.Millisecond), 5*time.Second)
	store, err := eventstore.Open(ctx, js, eventstore.WithPacking(wc.durability == DurabilityStrict),
		eventstore.WithRequestTimeout(reqTimeout), eventstore.WithBlobThreshold(wc.blobThreshold))
	if err != nil {
		return withCode(ExitUnavailable, err)
	}
	leases, err := eventstore.OpenLeases(ctx, js, wc.leaseTTL, eventstore.WithLeaseLogger(log))
	if err != nil {
		return withCode(ExitUnavailable, err)
	}
	wcfg := workers.Config{ID: wc.id, Concurrency: wc.concurrency, RunConcurrency: wc.runConcurrency, Queues: wc.queues, Logger: log, Egress: wc.egress,
		AnomalyDefaults: s.anomalies, RetryAfterMax: wc.retryAfterMax, ProviderConcurrency: wc.providerConcurrency,
		ThreadLimits: wc.threads,
		Sandbox:      wc.sandbox, MCP: wc.mcp}
	logProcessSandbox(wc.sandbox, s.log)
	var receipts *receipt.Store
	if wc.keys != nil {
		if receipts, err = receipt.Open(ctx, js, store); err != nil {
			return withCode(ExitUnavailable, err)
		}
		wcfg.Receipts, wcfg.SigningKey = receipts, wc.keys.Current
	} else {
		log.Info("run receipts off: set PAL_SIGNING_KEY to a PEM Ed25519 private key file to sign them")
	}
	w := workers.New(wcfg, store, leases, providers, connectors(wc))
	if err := st.Start(ctx, "the worker", w); err != nil {
		return err
	}
	client := s.client(store)
	if err := st.Start(ctx, "the command processor", runs.NewCommandProcessor(client, log)); err != nil {
		return withCode(ExitUnavailable, err)
	}
	if err := st.Start(ctx, "the NATS service", natsService(nc, client, pool, log)); err != nil {
		return err
	}
	// Every worker fires the schedules' ticks; a tick two fire is one run
	// (docs/architecture.md §10.11).
	if err := st.Start(ctx, "the scheduler", runs.NewScheduler(client, runs.WithSchedulerLogger(log))); err != nil {
		return err
	}
	if wc.recoveryWarn != "" {
		log.Warn(wc.recoveryWarn)
	}
	// The sweep reads the runs in flight from NATS (PAL_INFLIGHT), and
	// with Postgres the runs table too.
	var src workers.OrphanSource = workers.NewInflightSource(store)
	if pool != nil {
		src = workers.Sources(src, projections.NewReader(pool))
	}
	sweep := workers.NewSweeper(store, leases, src, wc.recovery, log)
	if receipts != nil && pool != nil {
		// Missing receipts are found in the run_receipts table.
		sweep.WithReceipts(projections.NewReader(pool), receipts, wc.keys.Current)
	}
	if err := st.Start(ctx, "the recovery sweep", sweep); err != nil {
		return err
	}
	if wc.mcp != nil {
		log.Info("MCP servers", "mcp", wc.mcp.Names())
	}
	log.Info("worker ready", "id", w.ID(), "nats", s.nats.String(), "durability", wc.durability, "lease_ttl", wc.leaseTTL,
		"egress_allow", wc.egress.String())
	return nil
}

// logProcessSandbox probes the sandbox of process steps, once, and says
// how they will run: unsafely, not at all, or in bubblewrap.
func logProcessSandbox(r *sandbox.Runner, log *slog.Logger) {
	if r == nil {
		return
	}
	switch err := r.Available(); {
	case r.Off():
		log.Warn("UNSAFE: "+workers.EnvProcessSandbox+"=off: process steps run without a sandbox, as this worker's user, "+
			"seeing its files, keys and network", "process_sandbox", r.Describe())
	case err != nil:
		log.Warn("process steps will fail: "+err.Error()+"; install bubblewrap (apt-get install bubblewrap) or set "+
			workers.EnvProcessSandbox+"=off (unsafe)", "process_sandbox", "unavailable")
	default:
		log.Info("process steps run in a sandbox", "process_sandbox", r.Describe())
	}
}

// runWorker runs the write side until ctx ends.
func (e *env) runWorker(ctx context.Context, s *settings, wc workerConfig, providers provider.Registry, dbURL string) (err error) {
	var st service.Stack
	defer stopStack(ctx, &st, &err)
	if err := e.startTracing(ctx, &st, "pal-worker", s.log); err != nil {
		return err
	}
	if err := e.startMetrics(ctx, &st, s.log); err != nil {
		return err
	}
	var pool *pgxpool.Pool
	if dbURL != "" {
		if pool, err = connectPGDurable(ctx, dbURL, s.log); err != nil {
			return shutdownOr(ctx, err)
		}
		st.Started("the Postgres pool", service.Closer(pool.Close))
	}
	if err := startWriteSide(ctx, &st, s, wc, nil, providers, pool); err != nil {
		return err
	}
	<-ctx.Done()
	return nil
}
