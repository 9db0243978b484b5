package workers

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/connector"
	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/internal/egress"
	"github.com/palrun/pal/internal/retry"
	"github.com/palrun/pal/internal/sandbox"
	"github.com/palrun/pal/internal/telemetry"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/receipt"
	"github.com/palrun/pal/workflow"
)

// Config configures a Worker.
type Config struct {
	// ID names the worker in leases and events (worker_id). Default:
	// hostname-pid.
	ID string
	// Concurrency is how many runs the worker drives at once (default 64).
	Concurrency int
	// Queues are the work queues the worker takes runs from (PAL_QUEUES,
	// --queues; default: the default queue only). Their consumers must
	// exist (eventstore.Setup with the same queues). A child run on a
	// queue not among them is left to that queue's workers, never driven
	// inline (§10.7).
	Queues []string
	// RunConcurrency caps how many steps of one run are in flight at once
	// (PAL_RUN_CONCURRENCY, default DefaultRunConcurrency): a run's
	// workflow asks for policy.concurrency (default 8), and gets at most
	// this many.
	RunConcurrency int
	// MaxCrashes is how many consecutive crashed drives without progress a
	// run survives before it fails with code crash_loop (default 5).
	MaxCrashes int
	// Logger receives the worker's logs (default slog.Default()).
	Logger *slog.Logger
	// HTTPClient is used by the built-in http tool (default: 30s timeout).
	// The worker uses a copy made to pass Egress (see egress.Policy.Secure).
	HTTPClient *http.Client
	// Egress is what the built-in http tool may call. Nil refuses loopback,
	// link-local, private and the other non-public addresses.
	Egress *egress.Policy
	// Secrets resolves {{secrets.NAME}} in the url and headers of the http
	// tool and of connectors (default: the variable PAL_SECRET_NAME).
	Secrets func(name string) (string, bool)
	// SecretHosts returns the hosts secret NAME may be sent to, as
	// PAL_SECRET_NAME_HOSTS lists them (ParseSecretHosts); default: that
	// variable. A secret with none bound is sent nowhere.
	SecretHosts func(name string) (string, bool)
	// Clock tells the time for every decision a replay must repeat: the
	// now given to engine.Next (an approval's deadline), the deadline a
	// new wait journals, when a retry may start, and the ts of the events
	// the worker writes. Default: time.Now. Lease renewal and the
	// durable wake-up timers keep the real clock: they are agreed with
	// NATS.
	Clock func() time.Time
	// Receipts and SigningKey, both set, make the worker sign the receipt
	// of each run it ends (package receipt). The recovery sweep signs the
	// ones a crash left unsigned.
	Receipts   *receipt.Store
	SigningKey *receipt.Key
	// AnomalyDefaults are the settings' anomaly rules (PAL_ANOMALY_*, as
	// the CLI parses them) recorded in the run_created of the child runs
	// this worker starts. Nil: the built-in defaults.
	AnomalyDefaults map[string]event.AnomalyRule
	// RetryAfterMax caps the wait a provider may ask for before a retry
	// (Retry-After, rate-limit reset headers); default 60s.
	RetryAfterMax time.Duration
	// ProviderConcurrency limits the model calls in flight at once in this
	// worker, by provider ("openai") or provider and model
	// ("openai/gpt-4o"); see ParseProviderConcurrency. A call takes a slot
	// of each limit that names it. Nil: no limit.
	ProviderConcurrency map[string]int
	// Sandbox runs the programs of process steps (PAL_PROCESS_SANDBOX,
	// PAL_PROCESS_PROGRAMS, PAL_PROCESS_MOUNTS). Nil: one with the
	// defaults, made at the first process step; bubblewrap is required.
	Sandbox *sandbox.Runner
	// MCP are the MCP servers the worker's tools may call
	// (PAL_MCP_CONFIG, LoadMCPConfig; mcp.go). Nil: none.
	MCP *MCPConfig
	// ThreadLimits bound each thread this worker appends to
	// (PAL_THREAD_MAX_TURNS, PAL_THREAD_MAX_BYTES; zero: the defaults,
	// event.DefaultThreadMaxTurns and event.DefaultThreadMaxBytes).
	ThreadLimits eventstore.ThreadLimits
}

func (c Config) withDefaults() Config {
	if c.ID == "" {
		host, _ := os.Hostname()
		if host == "" {
			host = "worker"
		}
		c.ID = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 64
	}
	if c.RunConcurrency <= 0 {
		c.RunConcurrency = DefaultRunConcurrency
	}
	if len(c.Queues) == 0 {
		c.Queues = []string{event.DefaultQueue}
	}
	if c.MaxCrashes <= 0 {
		c.MaxCrashes = 5
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	client := &http.Client{Timeout: 30 * time.Second}
	if c.HTTPClient != nil {
		cp := *c.HTTPClient
		client = &cp
	}
	c.HTTPClient = c.Egress.Secure(client)
	if c.Secrets == nil {
		c.Secrets = envSecret
	}
	if c.SecretHosts == nil {
		c.SecretHosts = envSecretHosts
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	if c.RetryAfterMax <= 0 {
		c.RetryAfterMax = DefaultRetryAfterMax
	}
	return c
}

// Worker drives runs taken from the work queue.
type Worker struct {
	cfg        Config
	owner      string // lease value: id plus a per-process nonce
	store      *eventstore.Store
	leases     *eventstore.Leases
	providers  provider.Registry
	connectors connector.Registry
	tools      map[string]Tool
	log        *slog.Logger
	slots      *slots

	activeMu  sync.Mutex
	active    map[string]map[*context.CancelCauseFunc]struct{} // run id → its drives
	cancelSub *nats.Subscription
	timers    jetstream.ConsumeContext
	unwatch   []func() // the consumers /metrics reports
	presence  *presence

	mu      sync.Mutex
	started bool
	// startedAt is when Start was called (announced with the presence).
	startedAt time.Time
	stopped   bool
	cancel    context.CancelCauseFunc
	done      chan struct{}
	drives    sync.WaitGroup

	// sb runs process steps (Config.Sandbox, or one made on first use).
	sbOnce sync.Once
	sb     *sandbox.Runner
	sbErr  error

	// mcp are the connections to the MCP servers (mcp.go).
	mcp *mcpClients

	// folded keeps the states of runs this worker parked (folded.go).
	folded *foldedCache
	snaps  snapshots

	// beforeDrive, when set (tests), runs at the start of each drive.
	beforeDrive atomic.Pointer[func(runID string)]
	// probeByHand (tests, set before Start): presence probes the peers
	// only when the test says (ProbeByHand), not every presenceProbeEvery.
	probeByHand bool
}

// New returns a worker. providers and connectors may be nil for a worker
// that only runs tools.
func New(cfg Config, store *eventstore.Store, leases *eventstore.Leases, providers provider.Registry, connectors connector.Registry) *Worker {
	cfg = cfg.withDefaults()
	nonce := make([]byte, 4)
	_, _ = rand.Read(nonce)
	w := &Worker{
		cfg:        cfg,
		owner:      cfg.ID + "/" + hex.EncodeToString(nonce),
		store:      store,
		leases:     leases,
		providers:  providers,
		connectors: connectors,
		tools:      map[string]Tool{},
		log:        cfg.Logger.With("worker", cfg.ID),
		active:     map[string]map[*context.CancelCauseFunc]struct{}{},
		slots:      newSlots(cfg.ProviderConcurrency),
		folded:     newFoldedCache(foldedMax, foldedTTL),
	}
	w.mcp = newMCPClients(w, cfg.MCP)
	w.tools[workflow.HTTPToolName] = httpTool(secretRedirects(cfg.HTTPClient))
	w.tools["echo"] = echoTool
	w.tools["sleep"] = sleepTool
	return w
}

// now is the worker's clock (Config.Clock), in UTC.
func (w *Worker) now() time.Time { return w.cfg.Clock().UTC() }

// ID returns the worker id.
func (w *Worker) ID() string { return w.cfg.ID }

// serves reports whether the worker takes the runs of queue q (empty: the
// default queue).
func (w *Worker) serves(q string) bool { return slices.Contains(w.cfg.Queues, event.QueueOr(q)) }

// RegisterTool makes fn callable from tool nodes as name. Register tools
// before Start.
func (w *Worker) RegisterTool(name string, fn Tool) {
	w.tools[name] = fn
}

// Start begins taking work. It returns at once; Stop ends it.
func (w *Worker) Start(ctx context.Context) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.started {
		return errors.New("worker already started")
	}
	w.startedAt = time.Now().UTC()
	var cons []jetstream.Consumer
	for _, q := range w.cfg.Queues {
		if err := event.ValidateQueue(q); err != nil {
			return err
		}
		c, err := w.store.WorkConsumer(ctx, q)
		if err != nil {
			return err
		}
		cons = append(cons, c)
	}
	// A cancel is announced on core NATS after run_cancelled is in the
	// journal: stop that run's drive (and its in-flight call) at once.
	sub, err := w.store.JetStream().Conn().Subscribe(eventstore.CancelPrefix+"*", func(m *nats.Msg) {
		// A JetStream push consumer may deliver here (its deliver subject
		// is its creator's choice); such a copy keeps its stream subject,
		// never under CancelPrefix, and is ignored.
		runID, ok := strings.CutPrefix(m.Subject, eventstore.CancelPrefix)
		if !ok {
			return
		}
		w.cancelDrives(runID, errRunEnded)
	})
	if err != nil {
		return fmt.Errorf("subscribing to cancel notices: %w", err)
	}
	w.cancelSub = sub
	// Fired timers (approval timeouts) wake their run.
	tcons, err := w.store.TimerConsumer(ctx)
	if err != nil {
		_ = sub.Unsubscribe()
		return err
	}
	w.timers, err = tcons.Consume(w.handleTimer)
	if err != nil {
		_ = sub.Unsubscribe()
		return fmt.Errorf("consuming timers: %w", err)
	}
	wctx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	// Peers learn of this worker, and it of them, before it takes work:
	// a run it leases is then taken over the moment it dies.
	w.presence, err = w.startPresence(wctx)
	if err != nil {
		cancel(err)
		w.timers.Stop()
		_ = sub.Unsubscribe()
		return fmt.Errorf("announcing presence: %w", err)
	}
	w.started = true
	js := w.store.JetStream()
	w.unwatch = []func(){telemetry.WatchConsumer(js, eventstore.TimersStream, eventstore.TimerConsumer)}
	for _, q := range w.cfg.Queues {
		w.unwatch = append(w.unwatch, telemetry.WatchConsumer(js, eventstore.WorkStream, eventstore.WorkConsumerName(q)))
	}
	ctx, w.cancel = wctx, cancel
	w.done = make(chan struct{})
	slots := make(chan struct{}, w.cfg.Concurrency)
	var loops sync.WaitGroup
	for _, c := range cons {
		loops.Go(func() { w.fetchLoop(ctx, c, slots, len(cons)) })
	}
	go func() {
		defer close(w.done)
		loops.Wait()
	}()
	w.drives.Add(1)
	go func() {
		defer w.drives.Done()
		w.keepWorkPinned(ctx)
	}()
	w.log.Info("worker started", "concurrency", w.cfg.Concurrency, "lease_ttl", w.leases.TTL(), "queues", strings.Join(w.cfg.Queues, ","))
	return nil
}

// Stop stops taking work, cancels the running drives, releases their
// leases and hands their work back so other workers resume them at once.
// It waits for the drives to wind down or ctx to end. Stop is idempotent.
func (w *Worker) Stop(ctx context.Context) error {
	w.mu.Lock()
	if !w.started || w.stopped {
		w.mu.Unlock()
		return nil
	}
	w.stopped = true
	for _, f := range w.unwatch {
		f()
	}
	_ = w.cancelSub.Unsubscribe()
	w.timers.Drain()
	w.cancel(errShutdown)
	done := w.done
	w.mu.Unlock()
	select {
	case <-done:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-w.timers.Closed():
	case <-ctx.Done():
		return ctx.Err()
	}
	wait := make(chan struct{})
	go func() { w.drives.Wait(); close(wait) }()
	select {
	case <-wait:
	case <-ctx.Done():
		return ctx.Err()
	}
	w.mcp.close() // no drive calls a server any more
	// Last, so peers do not take over runs this worker is handing back.
	w.presence.stop(ctx)
	w.log.Info("worker stopped")
	return nil
}

// fetchLoop pulls work from one queue's consumer while slots are free and
// starts a drive for each message. The slots are the worker's, shared by
// the loops of its queues (one of queues): each fetches at most its share
// of the free ones, so no message waits long unattended while its ack
// wait runs.
func (w *Worker) fetchLoop(ctx context.Context, cons jetstream.Consumer, slots chan struct{}, queues int) {
	warn := retry.OnRetry(func(err error, _ int, wait time.Duration) {
		// While a JetStream cluster elects its leaders (a few seconds
		// after its nodes start) a fetch times out: say so in full.
		w.log.Warn("fetching work from "+eventstore.WorkStream+" failed; trying again (normal for a few seconds while a NATS cluster elects its leaders)",
			"err", err, "retry_in", wait.Round(time.Millisecond))
	})
	for ctx.Err() == nil {
		// A fetch that fails is retried with backoff; one that succeeds
		// starts the backoff afresh.
		_ = retry.Do(ctx, fetchRetry, func() error { return w.fetch(ctx, cons, slots, queues) }, warn)
	}
}

// fetchRetry paces fetches after NATS failed to answer one.
var fetchRetry = retry.Policy{Initial: 50 * time.Millisecond, Max: 2 * time.Second}

// fetch waits for a free slot, fetches at most as many messages as there
// are free slots and starts their drives.
func (w *Worker) fetch(ctx context.Context, cons jetstream.Consumer, slots chan struct{}, queues int) error {
	if len(slots) == cap(slots) {
		select { // wait for a slot
		case slots <- struct{}{}:
			<-slots
		case <-ctx.Done():
			return retry.Permanent(ctx.Err())
		}
	}
	free := cap(slots) - len(slots)
	batch, err := cons.Fetch(max(1, (free+queues-1)/queues), jetstream.FetchMaxWait(time.Second))
	if err != nil {
		if ctx.Err() != nil {
			return retry.Permanent(ctx.Err())
		}
		return err
	}
	for msg := range batch.Messages() {
		slots <- struct{}{}
		w.drives.Add(1)
		go func() {
			defer w.drives.Done()
			defer func() { <-slots }()
			defer w.recoverWork(msg)
			w.handle(ctx, msg)
		}()
	}
	if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && ctx.Err() == nil {
		return err
	}
	return nil
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// cancelDrives cancels every drive of runID this worker holds, outside
// the lock, as a cancel notice always did.
func (w *Worker) cancelDrives(runID string, cause error) {
	w.activeMu.Lock()
	cancels := make([]context.CancelCauseFunc, 0, len(w.active[runID]))
	for cancel := range w.active[runID] {
		cancels = append(cancels, *cancel)
	}
	w.activeMu.Unlock()
	for _, cancel := range cancels {
		cancel(cause)
	}
}

// track registers a drive so a cancel notice can reach it. One worker
// may hold two drives of a run for a while: a drive whose lease ran out
// (a renewal too late) goes on until it sees the loss, and its run's work
// may reach this worker again meanwhile. Each is registered on its own, so
// the first one's end does not take the second off, and a cancel reaches
// both.
func (w *Worker) track(runID string, cancel context.CancelCauseFunc) func() {
	key := &cancel
	w.activeMu.Lock()
	if w.active[runID] == nil {
		w.active[runID] = map[*context.CancelCauseFunc]struct{}{}
	}
	w.active[runID][key] = struct{}{}
	w.activeMu.Unlock()
	return func() {
		w.activeMu.Lock()
		delete(w.active[runID], key)
		if len(w.active[runID]) == 0 {
			delete(w.active, runID)
		}
		w.activeMu.Unlock()
	}
}

// workPinEvery is how often a worker checks PAL_WORK's pin.
const workPinEvery = 5 * time.Second

// keepWorkPinned keeps PAL_WORK's last file block from emptying on every
// ack (eventstore.Store.PinWork) until ctx ends.
func (w *Worker) keepWorkPinned(ctx context.Context) {
	for ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if _, err := w.store.PinWork(pctx); err != nil && ctx.Err() == nil {
			w.log.Debug("pinning the work queue", "err", err)
		}
		cancel()
		sleep(ctx, workPinEvery)
	}
}
