package palcli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/internal/retry"
	"github.com/palrun/pal/internal/service"
	"github.com/palrun/pal/projections"
)

func addDatabaseFlag(cmd *cobra.Command) {
	cmd.Flags().String("database-url", "", "Postgres connection URL (env DATABASE_URL)")
}

// databaseURL returns --database-url or DATABASE_URL; exit code 2 when
// neither is set.
func (e *env) databaseURL(cmd *cobra.Command) (string, error) {
	url := e.stringSetting(cmd, "database-url", "DATABASE_URL", "")
	if url == "" {
		return "", badInput("DATABASE_URL is not set: point it at the Postgres database PAL projects into " +
			"(e.g. DATABASE_URL=postgres://pal:secret@127.0.0.1:5432/pal), or pass --database-url")
	}
	return url, nil
}

// pgConfig parses a database URL; exit code 2 when it does not parse.
func pgConfig(url string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, badInput("DATABASE_URL: %v", err)
	}
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	}
	return cfg, nil
}

// pgWhere names a database without its credentials, for messages.
func pgWhere(cfg *pgxpool.Config) string {
	return fmt.Sprintf("%s:%d/%s", cfg.ConnConfig.Host, cfg.ConnConfig.Port, cfg.ConnConfig.Database)
}

// connectPGNow opens a pool for a one-shot command: exit code 4 when
// Postgres cannot be reached.
func (e *env) connectPGNow(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgConfig(url)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, badInput("DATABASE_URL: %v", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, withCode(ExitUnavailable, fmt.Errorf("cannot reach Postgres at %s: %v (start it, or set DATABASE_URL)", pgWhere(cfg), err))
	}
	return pool, nil
}

// connectPGDurable opens a pool for a long-running process: it waits while
// Postgres is unreachable, and gives up (exit code 4) only when Postgres
// answers with an error (bad credentials, no such database).
func connectPGDurable(ctx context.Context, url string, log *slog.Logger) (*pgxpool.Pool, error) {
	cfg, err := pgConfig(url)
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, badInput("DATABASE_URL: %v", err)
	}
	err = waitFor(ctx, log, "waiting for Postgres at "+pgWhere(cfg), func() error {
		pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return pool.Ping(pctx)
	})
	if err != nil {
		pool.Close()
		return nil, withCode(ExitUnavailable, fmt.Errorf("connecting to Postgres at %s: %w", pgWhere(cfg), err))
	}
	return pool, nil
}

// waitFor calls f until it succeeds, ctx ends, or Postgres answers with an
// error that waiting cannot fix (bad credentials, no such database, no
// permission), waiting longer each time. what says, in the log, what the
// process is waiting for.
func waitFor(ctx context.Context, log *slog.Logger, what string, f func() error) error {
	return retry.Do(ctx, waitPolicy, func() error {
		err := f()
		if permanentPG(err) {
			return retry.Permanent(err)
		}
		return err
	}, retry.OnRetry(func(err error, attempt int, _ time.Duration) {
		if attempt == 1 || attempt%10 == 0 {
			log.Warn(what, "attempt", attempt, "err", err)
		}
	}))
}

// waitPolicy paces a long-running process that waits for NATS or Postgres
// to come up.
var waitPolicy = retry.Policy{Initial: 100 * time.Millisecond, Max: 2 * time.Second}

// permanentPG reports an answer from Postgres that retrying cannot change:
// invalid authorization (class 28), an unknown database (3D000), a
// permission or syntax error (class 42). A server starting up or shutting
// down (57P0x) or out of connections (53300) is worth waiting for.
func permanentPG(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return false
	}
	return strings.HasPrefix(pgErr.Code, "28") || pgErr.Code == "3D000" || strings.HasPrefix(pgErr.Code, "42")
}

func (e *env) migrateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Apply PAL's Postgres migrations",
		Long: `pal migrate applies the migrations embedded in pal to the database named by
DATABASE_URL: the tables journal_events, runs, steps, side_effect_receipts and
projection_checkpoints. It prints each migration it applies; run again, it
changes nothing. pal projector and pal dev migrate at start too.

Exit codes: 2 when DATABASE_URL is missing, 4 when Postgres cannot be reached.`,
		Args: cobra.NoArgs,
		RunE: e.runMigrate,
	}
	addDatabaseFlag(cmd)
	return cmd
}

func (e *env) runMigrate(cmd *cobra.Command, _ []string) error {
	ctx := cmd.Context()
	url, err := e.databaseURL(cmd)
	if err != nil {
		return err
	}
	pool, err := e.connectPGNow(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()
	res, err := projections.Migrate(ctx, pool)
	if err != nil {
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) {
			return withCode(ExitUnavailable, err)
		}
		return err
	}
	for _, m := range res.Applied {
		fmt.Fprintf(e.stdout, "applied %s (%s)\n", m.Name, m.Duration.Round(time.Millisecond))
	}
	if len(res.Applied) == 0 {
		fmt.Fprintf(e.stdout, "schema up to date (version %d)\n", res.Version)
	} else {
		fmt.Fprintf(e.stdout, "schema at version %d\n", res.Version)
	}
	return nil
}

func (e *env) projectorCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "projector",
		Short: "Project the journal into Postgres",
		Long: `pal projector applies the migrations, then folds every event of PAL_EVENTS
into the Postgres tables (journal_events, runs, steps, side_effect_receipts)
with the same fold the workers use, in batches that commit together with the
checkpoint. It runs until SIGTERM. Run one per database.

While Postgres is down it retries and acknowledges nothing, and catches up
when Postgres returns; the workers do not need Postgres. Killed at any
moment, it starts again from the checkpoint and changes nothing twice.

With PAL_RETENTION (e.g. 30d, 12h; at least 1h) it also removes the journals
of runs that ended longer ago than that: their messages in PAL_EVENTS, their
journal_events rows and their PAL_BLOBS objects. Their runs, steps and
side_effect_receipts rows stay, and so do their receipts in PAL_RECEIPTS.
Archive first if you need the events: pal run export RUN_ID > run.jsonl, or
nats stream backup PAL_EVENTS. Unset, journals are kept forever.

With PAL_METRICS_ADDR (host:port) it serves Prometheus metrics at /metrics
there, without a token: its lag and its consumer's pending count.`,
		Args: cobra.NoArgs,
		RunE: e.withSettings(e.runProjector),
	}
	addDatabaseFlag(cmd)
	cmd.Flags().Int("replicas", 0, "stream replicas if the projector creates PAL's streams (env PAL_REPLICAS, default 1)")
	cmd.Flags().Int("batch-size", 0, "most messages written per transaction (env PAL_PROJECTOR_BATCH, default 1000)")
	return cmd
}

func (e *env) runProjector(cmd *cobra.Command, _ []string, s *settings) (err error) {
	ctx := cmd.Context()
	url, err := e.databaseURL(cmd)
	if err != nil {
		return err
	}
	log := s.log
	replicas, err := e.replicas(cmd)
	if err != nil {
		return err
	}
	batch, err := e.intSetting(cmd, "batch-size", "PAL_PROJECTOR_BATCH", projections.DefaultBatchSize, 1)
	if err != nil {
		return err
	}
	retention, err := projections.ParseRetention(e.getenv("PAL_RETENTION"))
	if err != nil {
		return badInput("%v", err)
	}
	var st service.Stack
	defer stopStack(ctx, &st, &err)
	// Served while Postgres and NATS are awaited too.
	if err := e.startMetrics(ctx, &st, log); err != nil {
		return err
	}
	pool, err := connectPGDurable(ctx, url, log)
	if err != nil {
		return shutdownOr(ctx, err)
	}
	st.Started("the Postgres pool", service.Closer(pool.Close))
	var res projections.MigrateResult
	err = waitFor(ctx, log, "applying the migrations", func() (err error) {
		res, err = projections.Migrate(ctx, pool)
		return err
	})
	if err != nil {
		return shutdownOr(ctx, err)
	}
	for _, m := range res.Applied {
		log.Info("migration applied", "name", m.Name, "took", m.Duration)
	}

	nc, err := connectDurable(s.nats, "pal-projector", log)
	if err != nil {
		return withCode(ExitUnavailable, fmt.Errorf("connecting to NATS at %s: %w", s.nats, err))
	}
	st.Started("the NATS connection", service.Closer(nc.Close))
	store, err := openStoreWait(ctx, nc, eventstore.Config{Replicas: replicas}, log)
	if err != nil {
		return shutdownOr(ctx, withCode(ExitUnavailable, err))
	}

	p := projections.New(pool, store, projections.Config{BatchSize: batch, Logger: log, Retention: retention})
	if err := st.Start(ctx, "the projector", p); err != nil {
		var ahead *projections.CheckpointAheadError
		if errors.As(err, &ahead) {
			return badInput("%v", err)
		}
		return shutdownOr(ctx, withCode(ExitUnavailable, err))
	}
	cfg, _ := pgConfig(url)
	log.Info("projector ready", "checkpoint", p.Stats().Checkpoint, "nats", s.nats.String(), "database", pgWhere(cfg))
	<-ctx.Done()
	return nil
}

// shutdownOr returns nil when ctx ended (SIGTERM while waiting), else err.
func shutdownOr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}

func (e *env) projectionsCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "projections",
		Short: "Manage the Postgres projections",
	}
	rebuild := &cobra.Command{
		Use:   "rebuild",
		Short: "Replay PAL_EVENTS into fresh tables and swap them in",
		Long: `pal projections rebuild replays the whole PAL_EVENTS stream into fresh tables
in the schema pal_rebuild, with the same fold as pal projector, then swaps them
in for journal_events, runs, steps and side_effect_receipts in one transaction
and sets the projector's checkpoint. A running pal projector may stay up: it
waits for the swap and carries on. Readers see the old tables or the new
ones, never a mix. Progress goes to stderr, the summary to stdout.`,
		Args: cobra.NoArgs,
		RunE: e.withSettings(e.runRebuild),
	}
	addDatabaseFlag(rebuild)
	cmd.AddCommand(rebuild)
	return cmd
}

func (e *env) runRebuild(cmd *cobra.Command, _ []string, s *settings) error {
	ctx := cmd.Context()
	url, err := e.databaseURL(cmd)
	if err != nil {
		return err
	}
	log := s.log
	nc, err := e.connectNow(s.nats, "pal-projections-rebuild")
	if err != nil {
		return err
	}
	defer nc.Close()
	store, err := openStore(ctx, nc)
	if err != nil {
		return err
	}
	pool, err := e.connectPGNow(ctx, url)
	if err != nil {
		return err
	}
	defer pool.Close()

	var last time.Time
	phase := ""
	res, err := projections.Rebuild(ctx, pool, store.JetStream(), projections.RebuildOptions{
		Logger: log,
		Progress: func(p projections.RebuildProgress) {
			if p.Phase == phase && time.Since(last) < 500*time.Millisecond {
				return
			}
			phase, last = p.Phase, time.Now()
			fmt.Fprintf(e.stderr, "pal projections rebuild: %-7s %d events written, stream seq %d of %d\n",
				p.Phase, p.Events, p.StreamSeq, p.Target)
		},
	})
	if errors.Is(err, projections.ErrRebuildRunning) {
		return withCode(ExitUnavailable, err)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(e.stdout, "rebuilt the projection of %s up to stream seq %d in %s (%d events replayed)\n",
		eventstore.EventsStream, res.StreamSeq, res.Duration.Round(time.Millisecond), res.Events)
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "  journal_events\t%d\n  runs\t%d\n  steps\t%d\n  side_effect_receipts\t%d\n",
		res.JournalRows, res.Runs, res.Steps, res.Receipts)
	if err := tw.Flush(); err != nil {
		return err
	}
	if res.FoldErrors > 0 {
		fmt.Fprintf(e.stderr, "pal projections rebuild: %d runs whose journal does not fold have journal rows only (see the log)\n", res.FoldErrors)
	}
	return nil
}
