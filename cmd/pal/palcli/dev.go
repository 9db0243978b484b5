package palcli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/eventstore/natsauth"
	"github.com/palrun/pal/internal/egress"
	"github.com/palrun/pal/internal/pgcluster"
	"github.com/palrun/pal/internal/service"
	"github.com/palrun/pal/projections"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/receipt"
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
unset it serves a token of its own and prints it. With --no-worker it drives no runs
itself: start pal worker processes for that (to watch one crash, say).

The embedded NATS server requires authentication, with PAL's two accounts:
PAL's processes as their roles (worker, projector, api, admin) in one, and
people, scripts and services as client users in another, which reaches PAL
only through its imports. Each has an nkey seed in ./.pal, readable by you
only: nats-<role>.nk, nats-client.nk for pal dev's own client user
("client": read+start+approve+cancel, so it starts deployed workflows
and deploys none) and nats-user-<name>.nk for the others. pal dev
prints the nats context save line for its client user, for the nats CLI.
To add client users, list them in PAL_NATS_USERS as name:scope+scope,…
(scopes read, start, approve, cancel, deploy, admin; none written: all
but admin), e.g. PAL_NATS_USERS=ana:read+approve,bot:read+start;
a user may do only what its scopes allow, and acts as itself: a durable
command goes to pal.cmd.runs.<kind>.<name>.

While it runs, pal dev writes how to reach it (PAL_NATS_URL, PAL_NATS_CREDS
(the worker role's seed), PAL_NATS_USERS (the client users and their
nkeys), DATABASE_URL,
PAL_API_TOKENS and PAL_API_TOKEN, PAL_HTTP_ADDR, PAL_DURABILITY,
PAL_LEASE_TTL, PAL_EGRESS_ALLOW (with loopback, which pal dev allows) and,
with the fake provider, OPENAI_*, ANTHROPIC_* and PAL_DEV_FAKE=1) to dev.env in its data
directory, readable by you only. Every other pal command run in this
directory or below it (or anywhere, with PAL_HOME naming the data
directory; PAL_DATA_DIR is its earlier name) uses those values for the
variables its environment does not set, so pal run list and a second pal
worker need no copying. pal dev's own API token is kept in dev-token
there, so a restart keeps it: the PAL_API_TOKEN of other shells stays
valid, and the browser, which a restart logs out (sessions live in
memory), logs in again with the same token. The file is replaced on every
start and removed on stop; in a shell, '. .pal/dev.env' sets the same
variables.

When neither OPENAI_API_KEY nor ANTHROPIC_API_KEY is set, LLM steps go to a
built-in fake provider that answers "echo: <prompt>" and, offered tools,
first calls each of them once (arguments made from its schema), then
answers with their results. An ai-step's or agent's "fake" block scripts
it: its turns (tool calls, text or json) and a failure (HTTP status, how
many times); workers send the block only with PAL_DEV_FAKE=1 and only to a
provider on loopback.`,
		Args: cobra.NoArgs,
		RunE: e.withSettings(e.runDev),
	}
	addWorkerFlags(cmd)
	cmd.Flags().Lookup("worker-id").Usage = "the worker's id in leases and events (env PAL_WORKER_ID, default dev-<host>; --cluster's two workers add -1 and -2)"
	addRESTFlags(cmd)
	cmd.Flags().String("data-dir", "", "where pal dev keeps its data (env PAL_HOME, default ./.pal)")
	cmd.Flags().Bool("no-worker", false, "drive no runs in this process: leave them to pal worker processes")
	cmd.Flags().Int("cluster", 0, "run NATS as a JetStream cluster of N node processes (N >= 3; client ports from PAL_NATS_URL's on) with PAL_REPLICAS=3, and two pal worker processes, to try failover")
	return cmd
}

// devConfig is pal dev's configuration: a worker's and the REST API's,
// and its own flags.
type devConfig struct {
	wc        workerConfig
	rc        restConfig
	retention time.Duration
	dataDir   string
	// dbURL is DATABASE_URL; empty, pal dev runs a local PostgreSQL.
	dbURL    string
	noWorker bool
	// cluster is the number of NATS nodes (--cluster), 0 for one server in
	// this process.
	cluster int
	// host and port are where NATS listens (PAL_NATS_URL's).
	host string
	port int
	// users are the client users to make besides natsauth.DefaultUser
	// (PAL_NATS_USERS, their nkeys ignored).
	users natsauth.Users
}

// devConfigOf reads pal dev's flags and settings; nothing is started.
func (e *env) devConfigOf(cmd *cobra.Command, s *settings) (devConfig, error) {
	var d devConfig
	var err error
	if d.wc, err = e.workerConfig(cmd); err != nil {
		return d, err
	}
	d.wc.egress = d.wc.egress.With(egress.Loopback...) // the tour calls local receivers
	d.dataDir = e.dataDir(cmd)
	if d.rc, err = e.restSettings(cmd, filepath.Join(d.dataDir, devTokenName)); err != nil {
		return d, err
	}
	if d.retention, err = projections.ParseRetention(e.getenv("PAL_RETENTION")); err != nil {
		return d, badInput("%v", err)
	}
	d.dbURL = e.getenv("DATABASE_URL")
	d.noWorker, _ = cmd.Flags().GetBool("no-worker")
	d.cluster, _ = cmd.Flags().GetInt("cluster")
	if d.cluster != 0 && d.cluster < 3 {
		return d, badInput("--cluster %d: a JetStream cluster needs 3 nodes or more", d.cluster)
	}
	if d.cluster > 0 {
		d.wc.replicas = 3
	}
	if d.host, d.port, err = listenAddr(s.nats.url); err != nil {
		return d, err
	}
	if e.getenv(natsauth.EnvUsers) != "" {
		d.users = s.users
	}
	return d, nil
}

// devUsers loads or makes, in dataDir, the nkeys of PAL's roles, of
// natsauth.DefaultUser and of users: pal dev's and its cluster nodes'.
func devUsers(dataDir string, users natsauth.Users) (*natsauth.Keys, natsauth.Users, error) {
	keys, all, err := natsauth.LoadUsers(dataDir, users)
	if err != nil {
		return nil, nil, badInput("the NATS credentials in %s: %v", dataDir, err)
	}
	return keys, all, nil
}

func (e *env) runDev(cmd *cobra.Command, _ []string, s *settings) (err error) {
	ctx := cmd.Context()
	d, err := e.devConfigOf(cmd, s)
	if err != nil {
		return err
	}
	log := s.log
	var st service.Stack
	defer stopStack(ctx, &st, &err)
	if err := e.startTracing(ctx, &st, "pal-dev", log); err != nil {
		return err
	}
	if err := os.MkdirAll(d.dataDir, 0o755); err != nil {
		return badInput("creating %s: %v", d.dataDir, err)
	}
	_ = os.Chmod(d.dataDir, 0o755) // PostgreSQL's own user must be able to reach ./.pal/pg
	// What an earlier pal dev wrote is stale now: remove it before anything
	// can fail, so no command reads it while this one starts.
	envPath := filepath.Join(d.dataDir, devEnvName)
	if err := os.Remove(envPath); err != nil && !errors.Is(err, os.ErrNotExist) {
		return badInput("removing the stale %s: %v", envPath, err)
	}
	if err := devSigningKey(d.dataDir, &d.wc, log); err != nil {
		return err
	}
	d.rc.keys = d.wc.keys

	n, err := startDevNATS(ctx, &st, d, log)
	if err != nil {
		return err
	}
	s.users = n.users // the service and the command processor know them
	workerNC, err := n.connect(&st, natsauth.Worker)
	if err != nil {
		return err
	}
	if n.cluster != nil {
		if err := waitJetStream(ctx, workerNC, log); err != nil {
			return shutdownOr(ctx, err)
		}
	}
	dbURL, pgNote, pool, err := startDevPostgres(ctx, &st, d, n.cluster != nil, log)
	if err != nil {
		return err
	}
	providers, llmNote, llmVars, closeFake, err := e.devProviders()
	if err != nil {
		return err
	}
	st.Started("the fake LLM provider", service.Closer(closeFake))
	if d.wc.id == "" {
		hostname, _ := os.Hostname()
		d.wc.id = "dev-" + sanitizeID(hostname)
	}

	// The write side (unless --no-worker), the projector and the REST API.
	workerNote, err := startDevWorkers(ctx, &st, s, d, n, workerNC, pool, providers, dbURL, llmVars)
	if err != nil {
		return err
	}
	projNC, err := n.connect(&st, natsauth.Projector)
	if err != nil {
		return err
	}
	projStore, err := devStore(ctx, projNC, d.wc)
	if err != nil {
		return err
	}
	proj := projections.New(pool, projStore, projections.Config{Logger: log, Retention: d.retention})
	if err := st.Start(ctx, "the projector", proj); err != nil {
		return withCode(ExitUnavailable, err)
	}
	apiNC, err := n.connect(&st, natsauth.API)
	if err != nil {
		return err
	}
	apiStore, err := devStore(ctx, apiNC, d.wc)
	if err != nil {
		return err
	}
	rest, err := startREST(ctx, &st, d.rc, s.client(apiStore), pool, log)
	if err != nil {
		return err
	}

	abs, _ := filepath.Abs(d.dataDir)
	if err := writeDevEnv(envPath, devEnvKeys, e.devVars(d, abs, n, dbURL, rest, llmVars)); err != nil {
		return fmt.Errorf("writing %s: %w", envPath, err)
	}
	st.Started(envPath, func(context.Context) error {
		if err := os.Remove(envPath); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	})

	e.printDev(d, abs, n, dbURL, pgNote, workerNote, llmNote, rest)
	<-ctx.Done()
	fmt.Fprintln(e.stderr, "PAL dev is stopping…")
	return nil
}

// startDevWorkers starts what drives pal dev's runs: the write side in
// this process, two pal worker processes beside a cluster, or nothing
// (--no-worker, once PAL's streams are set up). It returns what the
// banner says of them.
func startDevWorkers(ctx context.Context, st *service.Stack, s *settings, d devConfig, n *devNATS, workerNC *nats.Conn,
	pool *pgxpool.Pool, providers provider.Registry, dbURL string, llmVars map[string]string) (string, error) {
	switch {
	case n.cluster != nil && !d.noWorker:
		// Two worker processes, so one can be killed to watch the other
		// take its runs.
		if err := devSetup(ctx, workerNC, d.wc); err != nil {
			return "", err
		}
		for _, id := range []string{d.wc.id + "-1", d.wc.id + "-2"} {
			if err := n.cluster.startWorker(id, devWorkerEnv(d, n, dbURL, id, llmVars)); err != nil {
				return "", err
			}
		}
		return fmt.Sprintf("%s   (durability %s, lease TTL %s, logs in %s/<worker>.log)",
			n.cluster.pids(n.cluster.workers), d.wc.durability, d.wc.leaseTTL, d.dataDir), nil
	case d.noWorker:
		if err := devSetup(ctx, workerNC, d.wc); err != nil {
			return "", err
		}
		return fmt.Sprintf("none (--no-worker): start pal worker here to drive runs (durability %s, lease TTL %s)", d.wc.durability, d.wc.leaseTTL), nil
	default:
		if err := startWriteSide(ctx, st, s, d.wc, workerNC, providers, pool); err != nil {
			return "", err
		}
		return fmt.Sprintf("%s   (durability %s, lease TTL %s)", d.wc.id, d.wc.durability, d.wc.leaseTTL), nil
	}
}

// printDev prints pal dev's banner: where everything is and what to try.
func (e *env) printDev(d devConfig, abs string, n *devNATS, dbURL, pgNote, workerNote, llmNote string, rest *api.Server) {
	fmt.Fprintf(e.stderr, `
PAL dev is running.
  NATS       %s   (JetStream store: %s; accounts on, nkey seeds %s/nats-*.nk)
  Postgres   %s   (%s)
  worker     %s
  LLM        %s
`, n.url, natsStoreNote(abs, n.cluster), abs, redactDSN(dbURL), pgNote, workerNote, llmNote)
	fmt.Fprintf(e.stderr, "  clients    %s   (NATS users of the client account; PAL_NATS_USERS=name:scope+… adds more)\n", clientsNote(n.users))
	if n.cluster != nil {
		fmt.Fprintf(e.stderr, "  cluster    %s   (PAL_REPLICAS=3; kill -9 one to watch a failover: pal dev starts it again after 2 s)\n",
			n.cluster.pids(n.cluster.nodes))
	}
	printREST(e.stderr, rest, d.rc)
	settingsNote, tryNote := devEnvNotes(abs)
	fmt.Fprintf(e.stderr, `  settings   %s   (%s)

Try it (%s):
  pal run start --workflow examples/hello.json --input '{"text":"PAL journals every step"}' --wait
  pal run events <run_id>
  pal run list
  %s
    (--select makes pal-dev your default nats context: to keep yours, leave it out and give each nats command --context pal-dev)
  nats sub --stream PAL_EVENTS --all -T 'pal.events.<run_id>'

Press Ctrl-C to stop.
`, filepath.Join(abs, devEnvName), settingsNote, tryNote, natsContextLine(n.url, filepath.Join(abs, natsauth.SeedFile(natsauth.Client))))
}

// clientsNote lists the client users for the banner: name, scopes, seed.
func clientsNote(users natsauth.Users) string {
	parts := make([]string, len(users))
	for i, u := range users {
		parts[i] = fmt.Sprintf("%s (%s, %s)", u.Name, u.Scopes, natsauth.UserSeedFile(u.Name))
	}
	return strings.Join(parts, ", ")
}

// devNATS is pal dev's NATS: one server in this process, or a cluster of
// node processes.
type devNATS struct {
	url     string
	cluster *devCluster // nil: one server in this process
	// users are the client users, with their nkeys.
	users natsauth.Users
	// dial connects as role.
	dial func(role natsauth.Role) (*nats.Conn, error)
}

// connect connects as role, the connection closed when st stops.
func (n *devNATS) connect(st *service.Stack, role natsauth.Role) (*nats.Conn, error) {
	nc, err := n.dial(role)
	if err != nil {
		return nil, err
	}
	st.Started("the "+string(role)+" role's NATS connection", service.Closer(nc.Close))
	return nc, nil
}

// startDevNATS starts pal dev's NATS on st, with PAL's roles: one nkey
// user per role, its seed kept in the data directory.
func startDevNATS(ctx context.Context, st *service.Stack, d devConfig, log *slog.Logger) (*devNATS, error) {
	storeDir := filepath.Join(d.dataDir, "nats")
	if err := os.MkdirAll(storeDir, 0o755); err != nil {
		return nil, badInput("creating %s: %v", storeDir, err)
	}
	keys, users, err := devUsers(d.dataDir, d.users)
	if err != nil {
		return nil, err
	}
	strict := d.wc.durability == DurabilityStrict
	if d.cluster > 0 {
		cluster, err := startDevCluster(ctx, d.cluster, d.dataDir, d.host, d.port, strict, log)
		if err != nil {
			return nil, withCode(ExitUnavailable, fmt.Errorf("starting the NATS cluster: %w (is another pal dev or NATS server running on ports %d-%d? set PAL_NATS_URL=nats://127.0.0.1:4333 to use others)", err, d.port, d.port+d.cluster-1))
		}
		st.Started("the NATS cluster", service.Closer(cluster.stop))
		return &devNATS{url: cluster.URL(), cluster: cluster, users: users,
			dial: func(role natsauth.Role) (*nats.Conn, error) { return cluster.connect(keys, role, log) }}, nil
	}
	opts, err := keys.ServerOptions(users)
	if err != nil {
		return nil, badInput("configuring the embedded NATS server: %v", err)
	}
	opts.ServerName, opts.JetStream, opts.StoreDir, opts.Host, opts.Port = "pal-dev", true, storeDir, d.host, d.port
	opts.NoSigs, opts.NoLog, opts.SyncAlways = true, true, strict
	srv, err := server.NewServer(opts)
	if err != nil {
		return nil, badInput("configuring the embedded NATS server: %v", err)
	}
	go srv.Start()
	st.Started("the embedded NATS server", service.Closer(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	}))
	if !srv.ReadyForConnections(10 * time.Second) {
		return nil, withCode(ExitUnavailable, fmt.Errorf("the embedded NATS server could not listen on %s:%d (is another pal dev or NATS server running? set PAL_NATS_URL=nats://127.0.0.1:4333 to use another port)", d.host, d.port))
	}
	// Each part connects with its own role, as it would as its own process.
	return &devNATS{url: fmt.Sprintf("nats://%s:%d", d.host, d.port), users: users, dial: func(role natsauth.Role) (*nats.Conn, error) {
		nc, err := nats.Connect("", nats.InProcessServer(srv), nats.Name("pal-dev-"+string(role)), keys.Option(role),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				log.Error("NATS error", "role", role, "err", err)
			}))
		if err != nil {
			return nil, fmt.Errorf("connecting to the embedded NATS server as %s: %w", role, err)
		}
		return nc, nil
	}}, nil
}

// waitJetStream waits until JetStream answers on nc: a cluster's, once
// its nodes have elected a meta leader.
func waitJetStream(ctx context.Context, nc *nats.Conn, log *slog.Logger) error {
	return waitFor(ctx, log, "the NATS cluster's JetStream", func() error {
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err = js.AccountInfo(actx)
		return err
	})
}

// startDevPostgres returns pal dev's Postgres, migrated: DATABASE_URL, or
// a local cluster under the data directory started on st. The pool closes
// when st stops.
func startDevPostgres(ctx context.Context, st *service.Stack, d devConfig, cluster bool, log *slog.Logger) (dbURL, note string, pool *pgxpool.Pool, err error) {
	dbURL, note = d.dbURL, "DATABASE_URL"
	if dbURL == "" {
		pg, err := pgcluster.Dev(ctx, filepath.Join(d.dataDir, "pg"), log)
		if err != nil {
			return "", "", nil, withCode(ExitUnavailable, fmt.Errorf("starting the local PostgreSQL: %w", err))
		}
		st.Started("the local PostgreSQL", func(ctx context.Context) error { return pg.Stop(ctx, pgcluster.StopFast) })
		db := pgcluster.DevDatabase
		if cluster {
			// The cluster's JetStream (.pal/nats-<i>) is not the single
			// server's (.pal/nats): a projection of one would be past the
			// end of the other, so each projects into its own database.
			db = devClusterDatabase
			if err := pg.CreateDatabase(ctx, db); err != nil {
				return "", "", nil, withCode(ExitUnavailable, fmt.Errorf("the local PostgreSQL: %w", err))
			}
		}
		dbURL, note = pg.DSN(db), "local, data in "+pg.DataDir()
	}
	if pool, err = connectPGDurable(ctx, dbURL, log); err != nil {
		return "", "", nil, shutdownOr(ctx, err)
	}
	st.Started("the Postgres pool", service.Closer(pool.Close))
	if err := waitFor(ctx, log, "applying the migrations", func() error {
		_, err := projections.Migrate(ctx, pool)
		return err
	}); err != nil {
		return "", "", nil, shutdownOr(ctx, err)
	}
	return dbURL, note, pool, nil
}

// devWorkerEnv is the environment of a pal worker process of pal dev
// --cluster, id its worker id.
func devWorkerEnv(d devConfig, n *devNATS, dbURL, id string, llmVars map[string]string) []string {
	env := []string{"PAL_NATS_URL=" + n.url, "PAL_WORKER_ID=" + id, "DATABASE_URL=" + dbURL,
		natsauth.EnvUsers + "=" + n.users.String(),
		"PAL_NATS_CREDS=" + filepath.Join(d.dataDir, natsauth.SeedFile(natsauth.Worker)),
		"PAL_REPLICAS=" + strconv.Itoa(d.wc.replicas), "PAL_DURABILITY=" + d.wc.durability,
		"PAL_LEASE_TTL=" + d.wc.leaseTTL.String(), "PAL_EGRESS_ALLOW=" + d.wc.egress.String(),
		"PAL_BLOB_THRESHOLD=" + strconv.Itoa(d.wc.blobThreshold)}
	for k, v := range llmVars {
		env = append(env, k+"="+v)
	}
	return env
}

// devVars are what pal dev writes to dev.env: how the other pal commands
// run here reach it. abs is the data directory's absolute path.
func (e *env) devVars(d devConfig, abs string, n *devNATS, dbURL string, rest *api.Server, llmVars map[string]string) map[string]string {
	vars := map[string]string{
		"PAL_NATS_URL": n.url,
		// A second pal worker, and the pal commands, act as the worker.
		"PAL_NATS_CREDS": filepath.Join(abs, natsauth.SeedFile(natsauth.Worker)),
		// and know the client users as pal dev does.
		natsauth.EnvUsers: n.users.String(),
		"DATABASE_URL":    dbURL,
		"PAL_HTTP_ADDR":   strings.TrimPrefix(rest.URL(), "http://"),
		"PAL_DURABILITY":  d.wc.durability,
		"PAL_LEASE_TTL":   d.wc.leaseTTL.String(),
		"PAL_REPLICAS":    strconv.Itoa(d.wc.replicas),
		// The pal worker processes beside pal dev --no-worker call the
		// tour's local receivers too.
		egress.EnvAllow: d.wc.egress.String(),
	}
	if v := e.getenv(receipt.EnvSigningKey); v != "" {
		vars[receipt.EnvSigningKey] = v
	} else {
		vars[receipt.EnvSigningKey] = filepath.Join(abs, devKeyName)
	}
	if len(d.rc.tokens) > 0 {
		vars["PAL_API_TOKENS"], vars["PAL_API_TOKEN"] = d.rc.tokensEnv(), d.rc.tokens[0].Secret
	}
	maps.Copy(vars, llmVars)
	return vars
}

// devEnvNotes say who reads dev.env in the data directory abs: the pal
// commands run here (and below) when it is the default ./.pal, else only
// those whose PAL_HOME names it.
func devEnvNotes(abs string) (settings, try string) {
	if def, err := filepath.Abs(defaultDataDir); err == nil && def == abs {
		return "pal commands run here use them", "in another terminal, in this directory"
	}
	q := shellQuote(abs)
	return "pal commands use them with PAL_HOME=" + q + " set",
		"in another terminal, after export PAL_HOME=" + q
}

// natsStoreNote says where the JetStream store is: one directory, or one
// per cluster node.
func natsStoreNote(abs string, cluster *devCluster) string {
	if cluster == nil {
		return filepath.Join(abs, "nats")
	}
	return filepath.Join(abs, "nats-<node>")
}

// devClusterDatabase is the database pal dev --cluster projects into in
// its local PostgreSQL, beside pgcluster.DevDatabase of the single server.
const devClusterDatabase = "pal_cluster"

// devEnvKeys are the variables pal dev writes to dev.env, in order.
var devEnvKeys = []string{"PAL_NATS_URL", "PAL_NATS_CREDS", natsauth.EnvUsers, "DATABASE_URL", "PAL_HTTP_ADDR", "PAL_API_TOKENS", "PAL_API_TOKEN",
	"PAL_DURABILITY", "PAL_LEASE_TTL", "PAL_REPLICAS", egress.EnvAllow, "PAL_SIGNING_KEY", "OPENAI_BASE_URL", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY", envDevFake}

// devSetup sets up PAL's streams as a worker with wc would, for pal dev
// --no-worker (the workers come later). nc is the worker role's.
func devSetup(ctx context.Context, nc *nats.Conn, wc workerConfig) error {
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if err := eventstore.Setup(ctx, js, eventstore.Config{Replicas: wc.replicas, LeaseTTL: wc.leaseTTL, Queues: wc.queues}); err != nil {
		return withCode(ExitUnavailable, fmt.Errorf("setting up PAL's streams: %w", err))
	}
	return nil
}

// natsContextLine is the nats CLI command that saves, and selects, a
// context for the client role, so the README's nats commands work as
// they are written.
func natsContextLine(natsURL, seedPath string) string {
	return fmt.Sprintf("nats context save pal-dev --server %s --nkey %s --select", natsURL, shellQuote(seedPath))
}

// devStore opens the event store on nc (set up already), for the
// projector's and the API's connections.
func devStore(ctx context.Context, nc *nats.Conn, wc workerConfig) (*eventstore.Store, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	store, err := eventstore.Open(ctx, js, eventstore.WithPacking(wc.durability == DurabilityStrict), eventstore.WithBlobThreshold(wc.blobThreshold))
	if err != nil {
		return nil, withCode(ExitUnavailable, err)
	}
	return store, nil
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

// envDevStreamPace names the pace of the fake provider's streamed answers.
const envDevStreamPace = "PAL_DEV_STREAM_PACE"

// defaultDevStreamPace spaces the fake provider's words so that a watcher
// sees an answer being written.
const defaultDevStreamPace = 30 * time.Millisecond

// devProviders returns real providers when API keys are set, else the
// built-in fake provider (streaming a word every PAL_DEV_STREAM_PACE) and
// the variables that point a worker at it.
func (e *env) devProviders() (provider.Registry, string, map[string]string, func(), error) {
	if e.getenv("OPENAI_API_KEY") != "" || e.getenv("ANTHROPIC_API_KEY") != "" {
		providers, err := e.providersFromEnv()
		if err != nil {
			return nil, "", nil, nil, err
		}
		return providers, "OpenAI / Anthropic from OPENAI_* and ANTHROPIC_* variables", nil, func() {}, nil
	}
	pace := defaultDevStreamPace
	if v := e.getenv(envDevStreamPace); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 || d > time.Minute {
			return nil, "", nil, nil, badInput("%s=%q: want a duration from 0 to 1m, like 30ms", envDevStreamPace, v)
		}
		pace = d
	}
	fake, err := providertest.Start("127.0.0.1:0")
	if err != nil {
		return nil, "", nil, nil, fmt.Errorf("starting the fake LLM provider: %w", err)
	}
	fake.Dedup(true)
	fake.SetPace(pace)
	// An agent on the fake calls the tools it is offered, so the tour
	// shows a tool loop with no key.
	fake.SetResponder(providertest.ToolUser)
	vars := map[string]string{
		"OPENAI_BASE_URL": fake.OpenAIBaseURL(), "OPENAI_API_KEY": "pal-dev",
		"ANTHROPIC_BASE_URL": fake.AnthropicBaseURL(), "ANTHROPIC_API_KEY": "pal-dev",
		// The workers send the nodes' fake blocks to it.
		envDevFake: "1",
	}
	note := fmt.Sprintf("built-in fake provider at %s (set OPENAI_API_KEY or ANTHROPIC_API_KEY for real calls)", fake.URL())
	providers, err := providersOf(func(k string) string { return vars[k] })
	if err != nil {
		fake.Close()
		return nil, "", nil, nil, err
	}
	return providers, note, vars, fake.Close, nil
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

// devKeyName is the receipt signing key pal dev makes in its data
// directory (the public key is next to it, pal.pub).
const devKeyName = "pal.key"

// devSigningKey gives pal dev a receipt signing key when PAL_SIGNING_KEY
// names none: dataDir/pal.key, made on the first start and kept.
func devSigningKey(dataDir string, wc *workerConfig, log *slog.Logger) error {
	if wc.keys != nil {
		return nil
	}
	path := filepath.Join(dataDir, devKeyName)
	k, err := receipt.LoadKey(path)
	if errors.Is(err, os.ErrNotExist) {
		if k, err = receipt.WriteKey(path); err == nil {
			log.Info("made a receipt signing key", "key", path, "public_key", receipt.PublicPath(path), "key_id", k.ID)
		}
	}
	if err != nil {
		return badInput("the receipt signing key %s: %v", path, err)
	}
	wc.keys = &receipt.Keys{Current: k}
	return nil
}

// devTokenName is the file in pal dev's data directory that keeps its own
// API token, so a restart keeps the token other shells read from dev.env
// and the browser logs in with (its session, held in memory, ends).
const devTokenName = "dev-token"

// devToken returns the token kept at path, making it (readable by its
// owner only) the first time.
func devToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err == nil {
		tok := strings.TrimSpace(string(b))
		if strings.HasPrefix(tok, "pal_") && len(tok) > len("pal_")+16 && !strings.ContainsAny(tok, " \t\n,:=") {
			return tok, nil
		}
		return "", badInput("%s does not hold a token pal dev made; remove it and pal dev makes a new one", path)
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", badInput("reading pal dev's token %s: %v", path, err)
	}
	tok, err := api.GenerateToken()
	if err != nil {
		return "", err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", badInput("creating %s: %v", filepath.Dir(path), err)
	}
	if err := os.WriteFile(path, []byte(tok+"\n"), 0o600); err != nil {
		return "", badInput("keeping pal dev's token in %s: %v", path, err)
	}
	return tok, nil
}
