package palcli

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/internal/limit"
	"github.com/palrun/pal/internal/service"
	"github.com/palrun/pal/internal/telemetry"
	"github.com/palrun/pal/projections"
	"github.com/palrun/pal/receipt"
	"github.com/palrun/pal/runs"
)

func (e *env) serverCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "server",
		Short: "Serve the REST API and the NATS service pal",
		Long: `pal server serves PAL's REST API on PAL_HTTP_ADDR (default 127.0.0.1:8080),
each route with the scope a token needs:

` + api.FormatRoutes(api.Routes(), "  ") + `
It serves the web UI on the same address and registers the NATS micro
service pal (pal.api.runs.*). It drives no runs: start pal worker for that.

Every /v1 request needs 'Authorization: Bearer <token>' with a token from
PAL_API_TOKENS: comma-separated tokens, each [name=]token[:scope+scope] (the
name, default "api", is who starts, approves or cancels; scopes read, start,
approve, cancel, admin; without scopes all but admin, which a token needs to
name another approver or canceller). Without tokens pal server still
serves, but every /v1 request answers 401 (health checks still answer);
--insecure-no-auth serves the API to anyone instead. With
PAL_METRICS_OPEN=1 /metrics needs no token.

Each token is held to limits, answered 429 with Retry-After (the NATS service
and durable commands apply the same to their callers): PAL_LIMIT_STARTS (runs
started, forked or retried; default 50/s:500, that is 50 a second and 500 at
once), PAL_LIMIT_COMMANDS (approve, cancel, budget, signal, resume; 100/s:1000),
PAL_LIMIT_STREAMS (event streams opened; 50/s:500), PAL_LIMIT_OPEN_STREAMS
(event streams open at once; 1000, 0 for no cap); "off" lifts a rate. Failed
web UI logins are bounded per client address and per token prefix
(PAL_LIMIT_LOGIN_FAILURES, default 10/m).

DATABASE_URL is optional: with it GET /v1/runs lists runs from the Postgres
projection and /readyz checks Postgres too.`,
		Args: cobra.NoArgs,
		RunE: e.withSettings(e.runServer),
	}
	addRESTFlags(cmd)
	addDatabaseFlag(cmd)
	return cmd
}

// addRESTFlags adds the REST API's flags (pal server, pal dev).
func addRESTFlags(cmd *cobra.Command) {
	cmd.Flags().String("http-addr", "", "REST API listen address (env PAL_HTTP_ADDR, default "+api.DefaultAddr+")")
	cmd.Flags().Bool("insecure-no-auth", false, "serve the REST API without authentication when PAL_API_TOKENS is unset (anyone who can reach the address controls your runs)")
}

// restConfig is a validated REST API configuration.
type restConfig struct {
	addr     string
	tokens   []api.Token
	insecure bool
	// generated is pal dev's own token, kept in its data directory,
	// because PAL_API_TOKENS was unset
	// (pal dev); print it.
	generated string
	// noTokens: PAL_API_TOKENS is unset and --insecure-no-auth was not
	// given, so every /v1 request is refused.
	noTokens bool
	// keys are the receipt signing keys GET /v1/keys serves (set by the
	// command: PAL_SIGNING_KEY is the worker's too).
	keys *receipt.Keys
	// metricsOpen: PAL_METRICS_OPEN=1, /metrics needs no token.
	metricsOpen bool
	// loginFailures bounds failed web UI logins per client address and
	// per token prefix (PAL_LIMIT_LOGIN_FAILURES).
	loginFailures limit.Rate
}

// restSettings reads --http-addr/PAL_HTTP_ADDR, PAL_API_TOKENS and
// --insecure-no-auth. With tokenFile set (pal dev) and no tokens, it uses
// the token kept there (devToken); without it (pal server) and without
// --insecure-no-auth it serves but refuses every /v1 request.
func (e *env) restSettings(cmd *cobra.Command, tokenFile string) (restConfig, error) {
	var rc restConfig
	var err error
	rc.addr = e.stringSetting(cmd, "http-addr", "PAL_HTTP_ADDR", api.DefaultAddr)
	host, port, err := net.SplitHostPort(rc.addr)
	if err != nil || port == "" {
		return rc, badInput("PAL_HTTP_ADDR=%q: want host:port, e.g. %s", rc.addr, api.DefaultAddr)
	}
	if host != "" && host != "localhost" && net.ParseIP(host) == nil {
		return rc, badInput("PAL_HTTP_ADDR=%q: the host must be an IP address or localhost", rc.addr)
	}
	if rc.metricsOpen, err = e.metricsOpen(); err != nil {
		return rc, err
	}
	rc.loginFailures = api.DefaultLoginFailures
	if v := e.getenv("PAL_LIMIT_LOGIN_FAILURES"); v != "" {
		if rc.loginFailures, err = limit.ParseRate(v); err != nil || rc.loginFailures.Off() {
			return rc, badInput("PAL_LIMIT_LOGIN_FAILURES=%q: want a rate of failures such as 10/m (it cannot be off)", v)
		}
	}
	if rc.tokens, err = api.ParseTokens(e.getenv("PAL_API_TOKENS")); err != nil {
		return rc, badInput("PAL_API_TOKENS: %v", err)
	}
	rc.insecure, _ = cmd.Flags().GetBool("insecure-no-auth")
	if len(rc.tokens) > 0 {
		rc.insecure = false
		return rc, nil
	}
	switch {
	case rc.insecure:
	case tokenFile != "":
		tok, err := devToken(tokenFile)
		if err != nil {
			return rc, err
		}
		// pal dev's own token may do everything, naming an approver too.
		rc.tokens, rc.generated = []api.Token{{Name: "dev", Secret: tok, Scopes: api.ScopeAdmin}}, tok
	default:
		// No tokens: serve, but refuse every /v1 request (401). Health
		// checks still answer.
		rc.noTokens = true
	}
	return rc, nil
}

// tokensEnv writes rc's tokens as PAL_API_TOKENS, scopes included.
func (rc restConfig) tokensEnv() string { return api.FormatTokens(rc.tokens) }

// restAPI is the REST API on rc.addr over client's store, not yet
// started; pool, when not nil, is the Postgres projection (GET /v1/runs
// and /readyz).
func restAPI(rc restConfig, client *runs.Client, pool *pgxpool.Pool, log *slog.Logger) *api.Server {
	hc := api.HandlerConfig{Store: client.Store(), NC: client.Conn(), Tokens: rc.tokens, Insecure: rc.insecure, Logger: log,
		Keys: rc.keys, MetricsOpen: rc.metricsOpen, Client: client, Limiter: client.Limiter(), LoginFailures: rc.loginFailures}
	if pool != nil {
		reader := projections.NewReader(pool)
		hc.Runs = reader
		telemetry.SetQueuedSource(reader.QueuedRuns)
		hc.Ready = func(ctx context.Context) error {
			if err := pool.Ping(ctx); err != nil {
				return &api.NotReadyError{What: "Postgres", Err: err}
			}
			return nil
		}
	}
	return api.NewServer(rc.addr, api.NewHandler(hc), log)
}

// startREST starts the REST API on st.
func startREST(ctx context.Context, st *service.Stack, rc restConfig, client *runs.Client, pool *pgxpool.Pool, log *slog.Logger) (*api.Server, error) {
	srv := restAPI(rc, client, pool, log)
	if err := st.Start(ctx, "the REST API", srv); err != nil {
		return nil, withCode(ExitUnavailable, fmt.Errorf("%w (set PAL_HTTP_ADDR to another address)", err))
	}
	return srv, nil
}

// printREST tells people where the REST API is and how to call it.
func printREST(w io.Writer, srv *api.Server, rc restConfig) {
	u := srv.URL()
	fmt.Fprintf(w, "  REST     %s/v1/runs   (events: %s/v1/runs/<run_id>/events; health: %s/healthz, %s/readyz)\n", u, u, u, u)
	fmt.Fprintf(w, "  web UI   %s/   (log in with an API token; runs at %s/runs/<run_id>)\n", u, u)
	switch {
	case rc.generated != "":
		fmt.Fprintf(w, "  token    %s   (scope admin; pal dev's own, kept in %s because PAL_API_TOKENS is unset)\n", rc.generated, devTokenName)
		fmt.Fprintf(w, "           curl -H 'Authorization: Bearer %s' %s/v1/runs\n", rc.generated, u)
	case rc.insecure:
		fmt.Fprintf(w, "  token    none: authentication is OFF (--insecure-no-auth)\n")
	default:
		names := make([]string, len(rc.tokens))
		for i, t := range rc.tokens {
			names[i] = t.Name
		}
		fmt.Fprintf(w, "  tokens   %s (from PAL_API_TOKENS)\n", strings.Join(names, ", "))
	}
}

func (e *env) runServer(cmd *cobra.Command, _ []string, s *settings) (err error) {
	ctx := cmd.Context()
	rc, err := e.restSettings(cmd, "")
	if err != nil {
		return err
	}
	if rc.keys, err = receipt.LoadKeys(e.getenv); err != nil {
		return badInput("%v", err)
	}
	dbURL := e.stringSetting(cmd, "database-url", "DATABASE_URL", "")
	var pgCfg *pgxpool.Config
	if dbURL != "" {
		if pgCfg, err = pgConfig(dbURL); err != nil {
			return err
		}
	}
	log := s.log
	if rc.insecure {
		log.Warn("serving the REST API WITHOUT AUTHENTICATION (--insecure-no-auth): anyone who can reach it can start and cancel runs", "addr", rc.addr)
	}
	if rc.noTokens {
		log.Warn("PAL_API_TOKENS is not set: every /v1 request will be refused (401). Set PAL_API_TOKENS=name=token " +
			"(e.g. PAL_API_TOKENS=ci=$(openssl rand -hex 32)), or pass --insecure-no-auth to serve the API to anyone who can reach it")
	}

	var st service.Stack
	defer stopStack(ctx, &st, &err)
	nc, err := connectDurable(s.nats, "pal-server", log)
	if err != nil {
		return withCode(ExitUnavailable, fmt.Errorf("connecting to NATS at %s: %w", s.nats, err))
	}
	st.Started("the NATS connection", service.Closer(nc.Close))
	store, err := openStoreWait(ctx, nc, eventstore.Config{}, log)
	if err != nil {
		return shutdownOr(ctx, err)
	}
	var pool *pgxpool.Pool
	if pgCfg != nil {
		// The pool connects lazily: the API serves runs from NATS while
		// Postgres is down, and /readyz says so.
		if pool, err = pgxpool.NewWithConfig(ctx, pgCfg); err != nil {
			return badInput("DATABASE_URL: %v", err)
		}
		st.Started("the Postgres pool", service.Closer(pool.Close))
	}
	client := s.client(store)
	if err := st.Start(ctx, "the NATS service", natsService(nc, client, pool, log)); err != nil {
		return err
	}
	srv, err := startREST(ctx, &st, rc, client, pool, log)
	if err != nil {
		return err
	}
	names := make([]string, len(rc.tokens))
	for i, t := range rc.tokens {
		names[i] = t.Name
	}
	log.Info("server ready", "url", srv.URL(), "nats", s.nats.String(), "auth", !rc.insecure, "tokens", strings.Join(names, ","),
		"postgres", pool != nil)
	<-ctx.Done()
	return nil
}

// openStoreWait opens the event store for a long-running process, waiting
// while NATS or JetStream is unavailable, and creating PAL's streams with
// cfg if this is the first use of the server (workers adjust them to their
// settings).
func openStoreWait(ctx context.Context, nc *nats.Conn, cfg eventstore.Config, log *slog.Logger) (*eventstore.Store, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	var store *eventstore.Store
	err = waitFor(ctx, log, "waiting for NATS JetStream", func() (err error) {
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		store, err = eventstore.Open(octx, js)
		if err != nil && eventstore.IsMissing(err) {
			if err = eventstore.Setup(octx, js, cfg); err == nil {
				store, err = eventstore.Open(octx, js)
			}
		}
		return natsReason(nc, err)
	})
	return store, err
}
