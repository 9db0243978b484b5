package projections

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/internal/retry"
	"github.com/palrun/pal/internal/telemetry"
)

// DefaultName names the projector: its durable consumer on PAL_EVENTS and
// its row in projection_checkpoints.
const DefaultName = "pal-projector"

// Defaults of Config.
const (
	DefaultBatchSize = 1000
	DefaultCacheSize = 10_000
)

// Config configures a Projector.
type Config struct {
	// Name is the durable consumer and checkpoint name (DefaultName).
	Name string
	// BatchSize caps the messages written in one transaction
	// (DefaultBatchSize). A batch holds whatever has arrived when the
	// previous one committed, so batches are small when events trickle in
	// and full when the projector is catching up.
	BatchSize int
	// CacheSize is how many runs' folded states are kept (DefaultCacheSize).
	// A run that falls out is folded again from JetStream when its next
	// event arrives.
	CacheSize int
	// Logger receives the projector's logs (default slog.Default()).
	Logger *slog.Logger
	// Retention, when set (PAL_RETENTION, ParseRetention), removes the
	// journals of runs that ended longer ago than it and keeps their rows
	// (RemoveExpired); zero keeps journals forever.
	Retention time.Duration
}

func (c Config) withDefaults() Config {
	if c.Name == "" {
		c.Name = DefaultName
	}
	if c.BatchSize <= 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.CacheSize <= 0 {
		c.CacheSize = DefaultCacheSize
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Stats are a projector's counters since it was created.
type Stats struct {
	// Events counts journal events written (a redelivered one again).
	Events uint64
	// Batches counts committed transactions.
	Batches uint64
	// Checkpoint is the last committed PAL_EVENTS stream sequence.
	Checkpoint uint64
	// FoldErrors counts runs whose journal did not fold: they keep their
	// journal rows and get no more derived rows (each is logged).
	FoldErrors uint64
	// Malformed counts messages that are not sound journal messages: not
	// PAL events, or refused by their run's event.Chain (logged, skipped,
	// never folded).
	Malformed uint64
	// WriteRetries counts batch writes that failed and were retried
	// (Postgres down or refusing).
	WriteRetries uint64
	// Loads counts runs folded afresh from JetStream (cache misses).
	Loads uint64
}

var errProjectorStopped = errors.New("projector stopped")

// CheckpointAheadError reports a database whose checkpoint is past the end
// of PAL_EVENTS: it holds the projection of another (or an older) stream.
type CheckpointAheadError struct {
	Projector  string
	Checkpoint uint64
	StreamLast uint64
}

func (e *CheckpointAheadError) Error() string {
	return fmt.Sprintf("projector %s: the checkpoint in Postgres (stream seq %d) is past the end of %s (last seq %d): "+
		"this database projects another stream; run 'pal projections rebuild' to project this one",
		e.Projector, e.Checkpoint, eventstore.EventsStream, e.StreamLast)
}

// Projector folds PAL_EVENTS into the Postgres tables. It reads the stream
// with a durable pull consumer, writes each batch of messages and its
// checkpoint in one transaction, and acknowledges the batch after the
// commit. Run one projector per database.
type Projector struct {
	cfg   Config
	pool  *pgxpool.Pool
	store *eventstore.Store
	w     *writer
	f     *folder
	log   *slog.Logger
	stats counters

	startMu    sync.Mutex // serialises Start
	mu         sync.Mutex
	initCancel context.CancelFunc
	started    bool
	stopped    bool
	cancel     context.CancelFunc
	done       chan struct{}

	ckMu      sync.Mutex
	ckChanged chan struct{}
}

// New returns a projector writing to the tables pool finds (apply Migrate
// first) from the journal in store.
func New(pool *pgxpool.Pool, store *eventstore.Store, cfg Config) *Projector {
	cfg = cfg.withDefaults()
	p := &Projector{
		cfg:       cfg,
		pool:      pool,
		store:     store,
		w:         newWriter(""),
		log:       cfg.Logger.With("projector", cfg.Name),
		ckChanged: make(chan struct{}),
	}
	p.f = &folder{cache: newStateCache(cfg.CacheSize), scan: store.ScanStamped, earlier: store.Earlier, resolve: store.ResolveBlobs, log: p.log, stats: &p.stats}
	return p
}

// Open opens the event store on js and returns a projector over it.
// Errors: those of eventstore.Open (PAL's streams must exist).
func Open(ctx context.Context, pool *pgxpool.Pool, js jetstream.JetStream, cfg Config) (*Projector, error) {
	store, err := eventstore.Open(ctx, js)
	if err != nil {
		return nil, err
	}
	return New(pool, store, cfg), nil
}

// Start positions the durable consumer at the checkpoint stored in Postgres
// and begins projecting in the background; Stop ends it. While Postgres or
// NATS is unreachable Start keeps trying until ctx ends. With Retention it
// also removes expired journals every tenth of it (RemoveExpired). Errors:
// ctx's; *CheckpointAheadError; a missing table (run Migrate first); with
// Retention, one below MinRetention or eventstore.ErrPurgeDenied.
func (p *Projector) Start(ctx context.Context) error {
	p.startMu.Lock()
	defer p.startMu.Unlock()
	ictx, cancelInit := context.WithCancel(ctx)
	defer cancelInit()
	p.mu.Lock()
	started, stopped := p.started, p.stopped
	p.initCancel = cancelInit
	p.mu.Unlock()
	switch {
	case started:
		return errors.New("projector already started")
	case stopped:
		return errProjectorStopped
	}
	if r := p.cfg.Retention; r != 0 && r < minRetention {
		return fmt.Errorf("projector: retention %s is below the minimum %s", r, minRetention)
	}
	// Not under mu: this may wait for Postgres or NATS; Stop cancels it.
	cons, cp, err := p.initConsumer(ictx)
	if err != nil {
		if ctx.Err() == nil && ictx.Err() != nil {
			return errProjectorStopped
		}
		return err
	}
	if p.cfg.Retention > 0 {
		if err := p.store.CheckPurgeable(ictx); err != nil {
			return fmt.Errorf("projector: PAL_RETENTION: %w", err)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return errProjectorStopped
	}
	p.started = true
	p.setCheckpoint(cp)
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	p.cancel = cancel
	p.done = make(chan struct{})
	in := make(chan jetstream.Msg, p.cfg.BatchSize)
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); p.read(runCtx, cons, in) }()
	go func() { defer wg.Done(); p.project(runCtx, in) }()
	go func() { defer wg.Done(); p.projectReceipts(runCtx) }()
	if p.cfg.Retention > 0 {
		wg.Add(1)
		go func() { defer wg.Done(); p.retain(runCtx) }()
	}
	unwatch := telemetry.WatchConsumer(p.store.JetStream(), eventstore.EventsStream, p.cfg.Name)
	go func() { wg.Wait(); unwatch(); close(p.done) }()
	p.log.Info("projector started", "checkpoint", cp, "batch_size", p.cfg.BatchSize)
	return nil
}

// Stop stops projecting and waits for the projector's goroutines, or for
// ctx to end. A batch in flight is abandoned unacknowledged; the next start
// writes it again, which changes nothing. Stop is idempotent.
func (p *Projector) Stop(ctx context.Context) error {
	p.mu.Lock()
	if !p.started || p.stopped {
		p.stopped = true
		if p.initCancel != nil {
			p.initCancel() // a Start still waiting gives up
		}
		p.mu.Unlock()
		return nil
	}
	p.stopped = true
	p.cancel()
	done := p.done
	p.mu.Unlock()
	select {
	case <-done:
		p.log.Info("projector stopped", "checkpoint", p.stats.checkpoint.Load())
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Stats returns the projector's counters.
func (p *Projector) Stats() Stats {
	return Stats{
		Events:       p.stats.events.Load(),
		Batches:      p.stats.batches.Load(),
		Checkpoint:   p.stats.checkpoint.Load(),
		FoldErrors:   p.stats.foldErrors.Load(),
		Malformed:    p.stats.malformed.Load(),
		WriteRetries: p.stats.retries.Load(),
		Loads:        p.stats.loads.Load(),
	}
}

// WaitFor waits until the projector has committed every message up to
// PAL_EVENTS stream sequence seq, or ctx ends.
func (p *Projector) WaitFor(ctx context.Context, seq uint64) error {
	for {
		p.ckMu.Lock()
		cur, changed := p.stats.checkpoint.Load(), p.ckChanged
		p.ckMu.Unlock()
		if cur >= seq {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return fmt.Errorf("waiting for projector %s to reach stream seq %d (at %d): %w", p.cfg.Name, seq, cur, ctx.Err())
		}
	}
}

// WaitCaughtUp waits until every event in PAL_EVENTS when it is called has
// been projected, or ctx ends.
func (p *Projector) WaitCaughtUp(ctx context.Context) error {
	last, err := streamLastSeq(ctx, p.store.JetStream())
	if err != nil {
		return err
	}
	return p.WaitFor(ctx, last)
}

func (p *Projector) setCheckpoint(seq uint64) {
	p.ckMu.Lock()
	defer p.ckMu.Unlock()
	if seq <= p.stats.checkpoint.Load() {
		return
	}
	p.stats.checkpoint.Store(seq)
	close(p.ckChanged)
	p.ckChanged = make(chan struct{})
}

// initConsumer reads the checkpoint and positions the durable consumer
// right after it, retrying while Postgres or NATS is unreachable.
func (p *Projector) initConsumer(ctx context.Context) (jetstream.Consumer, uint64, error) {
	type opened struct {
		cons jetstream.Consumer
		cp   uint64
	}
	o, err := retry.Value(ctx, retryPolicy, func() (opened, error) {
		cons, cp, err := p.openConsumer(ctx, true)
		if err == nil {
			return opened{cons, cp}, nil
		}
		var ahead *CheckpointAheadError
		var pgErr *pgconn.PgError
		switch {
		case ctx.Err() != nil:
			return opened{}, retry.Permanent(ctx.Err())
		case errors.As(err, &ahead):
			return opened{}, retry.Permanent(err)
		case errors.As(err, &pgErr) && pgErr.Code == "42P01":
			return opened{}, retry.Permanent(fmt.Errorf("projector %s: %w (apply the migrations first: pal migrate)", p.cfg.Name, err))
		}
		return opened{}, err
	}, retry.OnRetry(func(err error, attempt int, _ time.Duration) {
		if attempt == 1 || attempt%10 == 0 {
			p.log.Warn("waiting for Postgres and NATS to start the projector", "attempt", attempt, "err", err)
		}
	}))
	return o.cons, o.cp, err
}

// openConsumer returns the durable consumer positioned after the
// checkpoint, and the checkpoint (0 when it was not read). With verify,
// an existing consumer that is not exactly at the checkpoint with nothing
// in flight (a projector died mid-batch, an ack was lost, the database was
// replaced) is deleted and created again at the checkpoint: Postgres, not
// the consumer, knows what has been written. Without verify an existing
// consumer is used as it is, and Postgres is not asked.
func (p *Projector) openConsumer(ctx context.Context, verify bool) (jetstream.Consumer, uint64, error) {
	stream, err := p.store.JetStream().Stream(ctx, eventstore.EventsStream)
	if err != nil {
		return nil, 0, fmt.Errorf("opening stream %s: %w", eventstore.EventsStream, err)
	}
	cons, err := stream.Consumer(ctx, p.cfg.Name)
	if err == nil && !verify {
		return cons, 0, nil
	}
	if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, 0, fmt.Errorf("looking up consumer %s: %w", p.cfg.Name, err)
	}
	cp, cerr := readCheckpoint(ctx, p.pool, p.cfg.Name)
	if cerr != nil {
		return nil, 0, cerr
	}
	if last := stream.CachedInfo().State.LastSeq; cp > last {
		return nil, 0, &CheckpointAheadError{Projector: p.cfg.Name, Checkpoint: cp, StreamLast: last}
	}
	if err == nil {
		ci := cons.CachedInfo()
		if ci.AckFloor.Stream == cp && ci.Delivered.Stream == cp && ci.NumAckPending == 0 &&
			ci.Config.AckPolicy == jetstream.AckAllPolicy {
			return cons, cp, nil
		}
		p.log.Info("repositioning the consumer at the checkpoint", "checkpoint", cp,
			"consumer_ack_floor", ci.AckFloor.Stream, "consumer_delivered", ci.Delivered.Stream, "in_flight", ci.NumAckPending)
		if err := stream.DeleteConsumer(ctx, p.cfg.Name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return nil, 0, fmt.Errorf("deleting consumer %s: %w", p.cfg.Name, err)
		}
	}
	cons, err = stream.CreateConsumer(ctx, p.consumerConfig(cp))
	if err != nil {
		return nil, 0, fmt.Errorf("creating consumer %s: %w", p.cfg.Name, err)
	}
	return cons, cp, nil
}

func (p *Projector) consumerConfig(checkpoint uint64) jetstream.ConsumerConfig {
	cfg := jetstream.ConsumerConfig{
		Durable:     p.cfg.Name,
		Description: "PAL projector: PAL_EVENTS into Postgres",
		// Batches commit in stream order, so acknowledging a batch's last
		// message acknowledges the batch.
		AckPolicy:     jetstream.AckAllPolicy,
		AckWait:       time.Minute,
		MaxDeliver:    -1,
		MaxAckPending: max(8*p.cfg.BatchSize, 10_000),
		FilterSubject: eventstore.EventsPrefix + "*",
		DeliverPolicy: jetstream.DeliverAllPolicy,
	}
	if checkpoint > 0 {
		cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cfg.OptStartSeq = checkpoint + 1
	}
	return cfg
}

// read feeds messages from the consumer into in until ctx ends. When the
// consumer's iterator fails (the consumer was deleted, the connection
// closed) it looks the consumer up again, or creates it at the checkpoint.
func (p *Projector) read(ctx context.Context, cons jetstream.Consumer, in chan<- jetstream.Msg) {
	delivered := false
	_ = retry.Do(ctx, retryPolicy, func() error {
		delivered = false
		if cons == nil {
			c, _, err := p.openConsumer(ctx, false)
			if err != nil {
				if ctx.Err() != nil {
					return retry.Permanent(ctx.Err())
				}
				p.log.Warn("reopening the consumer", "err", err)
				return err
			}
			cons = c
		}
		it, err := cons.Messages(jetstream.PullMaxMessages(2 * p.cfg.BatchSize))
		if err != nil {
			p.log.Warn("reading "+eventstore.EventsStream, "err", err)
			cons = nil
			return err
		}
		defer it.Stop()
		for {
			m, err := it.Next(jetstream.NextContext(ctx))
			if err != nil {
				if ctx.Err() != nil {
					return retry.Permanent(ctx.Err())
				}
				p.log.Warn("reading "+eventstore.EventsStream, "err", err)
				cons = nil
				return err
			}
			delivered = true
			select {
			case in <- m:
			case <-ctx.Done():
				return retry.Permanent(ctx.Err())
			}
		}
	}, retry.Restart(func() bool { return delivered })) // ends only with ctx
}

// handoff is a batch ready to be written, with the message to
// acknowledge once it commits.
type handoff struct {
	b    *batch
	last jetstream.Msg
}

// project forms batches from what arrives on in and hands each to the
// writer goroutine when it is free. While the writer commits one batch the
// next one grows (up to BatchSize messages), so batches are small when
// events trickle in, keeping the lag low, and full when the projector is
// behind; folding overlaps writing.
func (p *Projector) project(ctx context.Context, in <-chan jetstream.Msg) {
	idle := make(chan struct{})
	work := make(chan handoff)
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.writeLoop(ctx, idle, work)
	}()
	defer func() { <-done }()

	pb := newPending()
	var last jetstream.Msg
	absorb := func(first jetstream.Msg) error {
		msgs := []jetstream.Msg{first}
	drain:
		for pb.msgs+len(msgs) < p.cfg.BatchSize {
			select {
			case m := <-in:
				msgs = append(msgs, m)
			default:
				break drain
			}
		}
		dec := make([]decoded, 0, len(msgs))
		for _, m := range msgs {
			if d, ok := p.decode(m); ok {
				dec = append(dec, d)
			}
		}
		pb.msgs += len(msgs)
		last = msgs[len(msgs)-1]
		return p.f.fold(ctx, pb, dec)
	}
	for {
		// Take what has arrived before handing anything off.
		select {
		case m := <-in:
			if pb.msgs < p.cfg.BatchSize {
				if err := absorb(m); err != nil {
					return
				}
				continue
			}
			// Full: keep m for the next batch.
			if !p.handOff(ctx, idle, work, pb, last) {
				return
			}
			pb, last = newPending(), nil
			if err := absorb(m); err != nil {
				return
			}
			continue
		default:
		}
		if pb.msgs == 0 {
			select {
			case m := <-in:
				if err := absorb(m); err != nil {
					return
				}
			case <-ctx.Done():
				return
			}
			continue
		}
		var more <-chan jetstream.Msg
		if pb.msgs < p.cfg.BatchSize {
			more = in
		}
		select {
		case <-idle:
			select {
			case work <- handoff{b: p.f.rows(pb), last: last}:
			case <-ctx.Done():
				return
			}
			pb, last = newPending(), nil
		case m := <-more:
			if err := absorb(m); err != nil {
				return
			}
		case <-ctx.Done():
			return
		}
	}
}

// handOff waits for the writer to be free and gives it pb.
func (p *Projector) handOff(ctx context.Context, idle <-chan struct{}, work chan<- handoff, pb *pending, last jetstream.Msg) bool {
	select {
	case <-idle:
	case <-ctx.Done():
		return false
	}
	select {
	case work <- handoff{b: p.f.rows(pb), last: last}:
		return true
	case <-ctx.Done():
		return false
	}
}

// writeLoop commits the batches project hands it, one at a time, in order:
// each in one transaction with its checkpoint (retrying while Postgres
// refuses), then acknowledges it.
func (p *Projector) writeLoop(ctx context.Context, idle chan<- struct{}, work <-chan handoff) {
	for {
		select {
		case idle <- struct{}{}:
		case <-ctx.Done():
			return
		}
		var h handoff
		select {
		case h = <-work:
		case <-ctx.Done():
			return
		}
		if err := p.writeRetrying(ctx, h.b); err != nil {
			return // ctx ended
		}
		if err := h.last.Ack(); err != nil {
			// Harmless: the messages come again and change nothing.
			p.log.Debug("acknowledging a batch", "err", err)
		}
		if md, err := h.last.Metadata(); err == nil {
			telemetry.ProjectorCommitted(p.cfg.Name, time.Since(md.Timestamp), md.NumPending)
		}
		p.stats.events.Add(uint64(len(h.b.journal)))
		p.stats.batches.Add(1)
		p.setCheckpoint(h.b.lastStreamSeq)
	}
}

// decode reads a message's stream sequence and run (the folder verifies
// and decodes its bytes). A message without JetStream metadata or off the
// runs' subjects is logged, counted and skipped.
func (p *Projector) decode(m jetstream.Msg) (decoded, bool) {
	md, err := m.Metadata()
	if err != nil {
		p.stats.malformed.Add(1)
		p.log.Error("skipping a message without JetStream metadata", "subject", m.Subject(), "err", err)
		return decoded{}, false
	}
	d, ok := decodedOf(md.Sequence.Stream, m.Subject(), m.Data(), m.Headers())
	if !ok {
		p.stats.malformed.Add(1)
		p.log.Error("skipping a message off the runs' subjects", "stream_seq", md.Sequence.Stream, "subject", m.Subject())
		return decoded{streamSeq: md.Sequence.Stream}, true
	}
	return d, true
}

// writeRetrying writes b, retrying with backoff until it commits or ctx
// ends. Nothing is acknowledged meanwhile, so a Postgres outage only
// delays the projection.
func (p *Projector) writeRetrying(ctx context.Context, b *batch) error {
	opts := writeOpts{projector: p.cfg.Name, lock: true, notify: true}
	attempts := 0
	err := retry.Do(ctx, retryPolicy, func() error {
		attempts++
		err := p.w.write(ctx, p.pool, b, opts)
		if err != nil && ctx.Err() != nil {
			return retry.Permanent(ctx.Err())
		}
		return err
	}, retry.OnRetry(func(err error, attempt int, _ time.Duration) {
		p.stats.retries.Add(1)
		p.log.Warn("writing a batch to Postgres failed; retrying", "attempt", attempt, "events", len(b.journal),
			"stream_seq", b.lastStreamSeq, "err", err)
	}))
	if err == nil && attempts > 1 {
		p.log.Info("batch written after retries", "attempts", attempts, "checkpoint", b.lastStreamSeq)
	}
	return err
}

// readCheckpoint returns a projector's checkpoint, 0 when it has none.
func readCheckpoint(ctx context.Context, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, name string) (uint64, error) {
	var seq int64
	err := db.QueryRow(ctx, "SELECT stream_seq FROM projection_checkpoints WHERE projector = $1", name).Scan(&seq)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("reading the checkpoint of %s: %w", name, err)
	}
	return uint64(seq), nil
}

// streamLastSeq returns the last sequence of PAL_EVENTS.
func streamLastSeq(ctx context.Context, js jetstream.JetStream) (uint64, error) {
	s, err := js.Stream(ctx, eventstore.EventsStream)
	if err != nil {
		return 0, fmt.Errorf("reading stream %s: %w", eventstore.EventsStream, err)
	}
	return s.CachedInfo().State.LastSeq, nil
}

// retryPolicy paces the projector's retries while Postgres or NATS is
// unreachable: opening its consumer, reading, writing a batch.
var retryPolicy = retry.Policy{Initial: 50 * time.Millisecond, Max: 2 * time.Second, Multiplier: 1.5, Jitter: 0.5}
