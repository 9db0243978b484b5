package cli

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/palrun/pal/internal/egress"
	"github.com/palrun/pal/internal/pgcluster"
	"github.com/palrun/pal/projections"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/provider/anthropic"
	"github.com/palrun/pal/provider/openai"
	"github.com/palrun/pal/provider/providertest"
)

func (e *env) devCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run everything in one process for local development",
		Long: `pal dev runs all of PAL in one process: an embedded NATS server with
JetStream (store under ./.pal/nats, listening on the address of PAL_NATS_URL,
by default 127.0.0.1:4222, so the nats CLI can connect), a local PostgreSQL
(data under ./.pal/pg, from the machine's PostgreSQL binaries) unless
DATABASE_URL is set, the projector, a worker with the recovery sweep, and the
REST API on PAL_HTTP_ADDR (default 127.0.0.1:8080). When PAL_API_TOKENS is
unset it makes up a token and prints it.

When neither OPENAI_API_KEY nor ANTHROPIC_API_KEY is set, LLM steps go to a
built-in fake provider that answers "echo: <prompt>".`,
		Args: cobra.NoArgs,
		RunE: e.runDev,
	}
	addWorkerFlags(cmd)
	addRESTFlags(cmd)
	cmd.Flags().String("data-dir", "", "where pal dev keeps its data (env PAL_DATA_DIR, default ./.pal)")
	return cmd
}

func (e *env) runDev(cmd *cobra.Command, _ []string) error {
	ctx := cmd.Context()
	wc, err := e.workerConfig(cmd)
	if err != nil {
		return err
	}
	wc.egress = wc.egress.With(egress.Loopback...) // the tour calls local receivers
	rc, err := e.restSettings(cmd, true)
	if err != nil {
		return err
	}
	log, err := e.logger()
	if err != nil {
		return err
	}
	dataDir := e.stringSetting(cmd, "data-dir", "PAL_DATA_DIR", ".pal")
	host, port, err := listenAddr(wc.natsURL)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return badInput("creating %s: %v", dataDir, err)
	}
	_ = os.Chmod(dataDir, 0o755) // PostgreSQL's own user must be able to reach ./.pal/pg
	storeDir := filepath.Join(dataDir, "nats")
	if err := os.MkdirAll(storeDir, 0o755); err != nil {
		return badInput("creating %s: %v", storeDir, err)
	}

	// NATS with JetStream, in this process.
	srv, err := server.NewServer(&server.Options{
		ServerName: "pal-dev", JetStream: true, StoreDir: storeDir, Host: host, Port: port,
		NoSigs: true, NoLog: true, SyncAlways: wc.durability == DurabilityStrict,
	})
	if err != nil {
		return badInput("configuring the embedded NATS server: %v", err)
	}
	go srv.Start()
	defer func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	}()
	if !srv.ReadyForConnections(10 * time.Second) {
		return withCode(ExitUnavailable, fmt.Errorf("the embedded NATS server could not listen on %s:%d (is another pal dev or NATS server running? set PAL_NATS_URL=nats://127.0.0.1:4333 to use another port)", host, port))
	}
	nc, err := nats.Connect("", nats.InProcessServer(srv), nats.Name("pal-dev"))
	if err != nil {
		return err
	}
	defer nc.Close()

	// PostgreSQL: DATABASE_URL, or a local cluster under the data dir.
	dbURL, pgNote := e.getenv("DATABASE_URL"), "DATABASE_URL"
	if dbURL == "" {
		pg, err := pgcluster.Dev(ctx, filepath.Join(dataDir, "pg"), log)
		if err != nil {
			return withCode(ExitUnavailable, fmt.Errorf("starting the local PostgreSQL: %w", err))
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if err := pg.Stop(sctx, pgcluster.StopFast); err != nil {
				log.Warn("stopping the local PostgreSQL", "err", err)
			}
		}()
		dbURL, pgNote = pg.DSN(pgcluster.DevDatabase), "local, data in "+pg.DataDir()
	}
	pool, err := connectPGDurable(ctx, dbURL, log)
	if err != nil {
		return shutdownOr(ctx, err)
	}
	defer pool.Close()
	if err := retry(ctx, log, "applying the migrations", func() error {
		_, err := projections.Migrate(ctx, pool)
		return err
	}); err != nil {
		return shutdownOr(ctx, err)
	}

	providers, llmNote, closeFake, err := e.devProviders()
	if err != nil {
		return err
	}
	defer closeFake()
	if wc.id == "" {
		hostname, _ := os.Hostname()
		wc.id = "dev-" + sanitizeID(hostname)
	}

	// The write side, the projector and the REST API.
	ws, err := e.startWriteSide(ctx, wc, nc, providers, pool, log)
	if err != nil {
		return err
	}
	stopCtx := func() (context.Context, context.CancelFunc) {
		return context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	}
	defer func() {
		sctx, cancel := stopCtx()
		defer cancel()
		_ = ws.stop(sctx)
	}()
	proj := projections.New(pool, ws.store, projections.Config{Logger: log})
	if err := proj.Start(ctx); err != nil {
		return withCode(ExitUnavailable, err)
	}
	defer func() {
		sctx, cancel := stopCtx()
		defer cancel()
		_ = proj.Stop(sctx)
	}()
	rest, err := startREST(ctx, rc, ws.store, nc, pool, log)
	if err != nil {
		return err
	}
	defer func() {
		sctx, cancel := stopCtx()
		defer cancel()
		_ = rest.Stop(sctx)
	}()

	abs, _ := filepath.Abs(dataDir)
	fmt.Fprintf(e.stderr, `
PAL dev is running.
  NATS       nats://%s:%d   (JetStream store: %s)
  Postgres   %s   (%s)
  worker     %s   (durability %s, lease TTL %s)
  LLM        %s
`, host, port, filepath.Join(abs, "nats"), redactDSN(dbURL), pgNote, wc.id, wc.durability, wc.leaseTTL, llmNote)
	printREST(e.stderr, rest, rc)
	fmt.Fprintf(e.stderr, `
Try it (in another terminal):
  pal run start --workflow examples/hello.json --input '{"text":"PAL journals every step"}' --wait
  pal run events <run_id>
  nats sub --stream PAL_EVENTS --all -T 'pal.events.<run_id>'
  DATABASE_URL='%s' pal run list

Press Ctrl-C to stop.
`, dbURL)
	<-ctx.Done()
	fmt.Fprintln(e.stderr, "PAL dev is stopping…")
	return nil
}

// redactDSN hides a password in a connection string.
func redactDSN(dsn string) string {
	u, err := url.Parse(dsn)
	if err != nil || u.User == nil {
		return dsn
	}
	if _, ok := u.User.Password(); ok {
		u.User = url.UserPassword(u.User.Username(), "xxxxx")
	}
	return u.String()
}

// devProviders returns real providers when API keys are set, else the
// built-in fake provider.
func (e *env) devProviders() (provider.Registry, string, func(), error) {
	if e.getenv("OPENAI_API_KEY") != "" || e.getenv("ANTHROPIC_API_KEY") != "" {
		return providersFromEnv(), "OpenAI / Anthropic from OPENAI_* and ANTHROPIC_* variables", func() {}, nil
	}
	fake, err := providertest.Start("127.0.0.1:0")
	if err != nil {
		return nil, "", nil, fmt.Errorf("starting the fake LLM provider: %w", err)
	}
	fake.Dedup(true)
	reg := provider.Registry{
		"openai":    openai.New(openai.Config{APIKey: "pal-dev", BaseURL: fake.OpenAIBaseURL()}),
		"anthropic": anthropic.New(anthropic.Config{APIKey: "pal-dev", BaseURL: fake.AnthropicBaseURL()}),
	}
	note := fmt.Sprintf("built-in fake provider at %s (set OPENAI_API_KEY or ANTHROPIC_API_KEY for real calls)", fake.URL())
	return reg, note, fake.Close, nil
}

// listenAddr turns PAL_NATS_URL into the embedded server's listen address;
// pal dev listens on loopback only.
func listenAddr(raw string) (string, int, error) {
	u, err := url.Parse(raw)
	if err != nil || u.Host == "" {
		return "", 0, badInput("PAL_NATS_URL=%q: not a URL like nats://127.0.0.1:4222", raw)
	}
	host, p := u.Hostname(), u.Port()
	if p == "" {
		p = "4222"
	}
	port, err := strconv.Atoi(p)
	if err != nil {
		return "", 0, badInput("PAL_NATS_URL=%q: bad port", raw)
	}
	if host == "localhost" {
		host = "127.0.0.1"
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return "", 0, badInput("PAL_NATS_URL=%q: pal dev listens on loopback only (use 127.0.0.1)", raw)
	}
	return host, port, nil
}

func sanitizeID(s string) string {
	out := make([]rune, 0, len(s))
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_':
			out = append(out, r)
		default:
			out = append(out, '-')
		}
	}
	if len(out) == 0 {
		return "local"
	}
	return string(out)
}
