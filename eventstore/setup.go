package eventstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/event"
)

// Config shapes the streams and the lease bucket.
type Config struct {
	// Replicas is the stream replica count: 1 on one server, 3 in a cluster.
	Replicas int
	// LeaseTTL is the lease time-to-live (whole seconds, at least 1s). The
	// work consumer's AckWait follows it, so a crashed worker's runs are
	// redelivered when its leases expire.
	LeaseTTL time.Duration
	// MaxEventBytes caps one event message; 0 means 1 MiB.
	MaxEventBytes int32
	// Queues are the work queues whose consumers Setup makes besides the
	// default queue's (pal-workers): a worker's (--queues), so that it can
	// consume them (§5.3).
	Queues []string
}

// DefaultLeaseTTL is the lease TTL when none is configured.
const DefaultLeaseTTL = 3 * time.Second

// DefaultMaxEventBytes is the largest event message PAL writes by default.
const DefaultMaxEventBytes = 1 << 20

func (c Config) withDefaults() Config {
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	c.LeaseTTL = c.LeaseTTL.Round(time.Second)
	if c.LeaseTTL < time.Second {
		c.LeaseTTL = time.Second
	}
	if c.MaxEventBytes <= 0 {
		c.MaxEventBytes = DefaultMaxEventBytes
	}
	return c
}

// Setup creates or updates PAL's streams, the lease bucket and the work
// consumer. It is idempotent: running it again with the same config
// changes nothing.
//
// Only a caller that states a LeaseTTL (a worker) sets the work consumer's
// AckWait; other callers (the CLI, the projector, the API) create the
// consumer if it is missing and otherwise leave it as the workers set it.
func Setup(ctx context.Context, js jetstream.JetStream, cfg Config) error {
	ownsTTL := cfg.LeaseTTL > 0
	cfg = cfg.withDefaults()
	streams := []jetstream.StreamConfig{
		{
			Name:        EventsStream,
			Description: "PAL journal: one subject per run",
			Subjects:    []string{EventsPrefix + "*"},
			Retention:   jetstream.LimitsPolicy,
			Storage:     jetstream.FileStorage,
			Replicas:    cfg.Replicas,
			MaxMsgSize:  cfg.MaxEventBytes,
			Duplicates:  2 * time.Minute,
			AllowDirect: true,
			// No message of a journal can be deleted. A whole journal can be
			// purged: retention (PAL_RETENTION) removes finished runs' by
			// subject, and only the projector's role may (§5.6). A stream
			// made by an earlier PAL keeps DenyPurge (below).
			DenyDelete: true,
			// Strict mode commits appends in atomic batches (group.go).
			AllowAtomicPublish: true,
			// Watches take the stored messages from here (watch.go).
			RePublish: &jetstream.RePublish{Source: EventsPrefix + "*", Destination: WatchPrefix + "{{wildcard(1)}}"},
		},
		{
			Name:                 WorkStream,
			Description:          "PAL work queue: drive this run",
			Subjects:             []string{WorkPrefix + "*", WorkPrefix + "*.*", WorkPinSubject},
			Retention:            jetstream.WorkQueuePolicy,
			Storage:              jetstream.FileStorage,
			Replicas:             cfg.Replicas,
			MaxMsgsPerSubject:    1,
			Discard:              jetstream.DiscardNew,
			DiscardNewPerSubject: true,
			Duplicates:           time.Second,
			AllowDirect:          true,
		},
		{
			// Which runs name which blob (blobref.go): read from the leader,
			// so a release and a writer see each other's writes.
			Name:              BlobRefsStream,
			Description:       "PAL blob references: a message per run naming a PAL_BLOBS object, and release marks",
			Subjects:          []string{BlobRefPrefix + "*.*", BlobReclaimPrefix + "*"},
			Retention:         jetstream.LimitsPolicy,
			Storage:           jetstream.FileStorage,
			Replicas:          cfg.Replicas,
			MaxMsgsPerSubject: 1,
			MaxMsgSize:        1 << 10,
			AllowMsgTTL:       true,
		},
		threadStreamConfig(cfg),
		{
			Name:              TimersStream,
			Description:       "PAL timers: wake a run at a set time",
			Subjects:          []string{"pal.timer.>"},
			Retention:         jetstream.WorkQueuePolicy,
			Storage:           jetstream.FileStorage,
			Replicas:          cfg.Replicas,
			AllowMsgSchedules: true,
		},
		{
			Name:        CommandsStream,
			Description: "PAL durable commands",
			Subjects:    []string{CommandPrefix + ">"},
			Retention:   jetstream.WorkQueuePolicy,
			Storage:     jetstream.FileStorage,
			Replicas:    cfg.Replicas,
			MaxMsgSize:  cfg.MaxEventBytes,
			Duplicates:  2 * time.Minute,
		},
		{
			// LLM steps' text as it streams (deltas.go): memory, kept a
			// short while, for watchers that arrive mid-step.
			Name:              DeltasStream,
			Description:       "PAL deltas: LLM steps' text as it streams, for watchers (never the journal)",
			Subjects:          []string{DeltaPrefix + "*"},
			Retention:         jetstream.LimitsPolicy,
			Storage:           jetstream.MemoryStorage,
			Replicas:          cfg.Replicas,
			MaxAge:            DeltasMaxAge,
			MaxMsgsPerSubject: DeltasMaxPerRun,
			MaxBytes:          DeltasMaxBytes,
			MaxMsgSize:        deltaMaxMsg,
			Discard:           jetstream.DiscardOld,
			AllowDirect:       true,
		},
		{
			// Bounded so that a flood of bad messages cannot fill the
			// disk: the oldest dead letters go first.
			Name:        DeadStream,
			Description: "PAL dead letters: messages whose handling kept failing",
			Subjects:    []string{DeadPrefix + "*"},
			Retention:   jetstream.LimitsPolicy,
			Storage:     jetstream.FileStorage,
			Replicas:    cfg.Replicas,
			MaxMsgs:     DeadMaxMsgs,
			MaxBytes:    DeadMaxBytes,
			Discard:     jetstream.DiscardOld,
			Duplicates:  deadDuplicatesWindow,
			AllowDirect: true,
		},
	}
	for _, sc := range streams {
		// JetStream cannot lift DenyPurge: an update that tries is refused,
		// so a stream that has it keeps it (retention then refuses to start).
		if old, err := js.Stream(ctx, sc.Name); err == nil && old.CachedInfo().Config.DenyPurge {
			sc.DenyPurge = true
		}
		if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
			return fmt.Errorf("setting up stream %s: %w", sc.Name, err)
		}
	}
	_, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:         LeaseBucket,
		Description:    "PAL run leases: run id → owning worker",
		History:        1,
		Storage:        jetstream.FileStorage,
		Replicas:       cfg.Replicas,
		LimitMarkerTTL: time.Minute,
	})
	if err != nil {
		return fmt.Errorf("setting up KV bucket %s: %w", LeaseBucket, err)
	}
	// Receipts are kept like the journal they sign: no TTL, one value per
	// run (a create, never replaced).
	_, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:       ReceiptBucket,
		Description:  "PAL run receipts: run id → signed receipt",
		History:      1,
		Storage:      jetstream.FileStorage,
		Replicas:     cfg.Replicas,
		MaxValueSize: 16 << 10,
	})
	if err != nil {
		return fmt.Errorf("setting up KV bucket %s: %w", ReceiptBucket, err)
	}
	_, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      InflightBucket,
		Description: "PAL runs in flight: run id → nothing, from run_created to the run's end",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return fmt.Errorf("setting up KV bucket %s: %w", InflightBucket, err)
	}
	// Deployed workflows (workflows.go): a version is kept for good, as the
	// runs that name it keep its definition in their journals anyway.
	if _, err = js.CreateOrUpdateKeyValue(ctx, workflowSetup(cfg.Replicas)); err != nil {
		return fmt.Errorf("setting up KV bucket %s: %w", WorkflowBucket, err)
	}
	// Schedules (schedules.go): what starts runs on a clock, and where
	// each has got to.
	if _, err = js.CreateOrUpdateKeyValue(ctx, scheduleSetup(cfg.Replicas)); err != nil {
		return fmt.Errorf("setting up KV bucket %s: %w", ScheduleBucket, err)
	}
	// Big step values, by sha256 (blob.go): kept like the journal that
	// names them.
	_, err = js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket:      BlobBucket,
		Description: "PAL big step values: sha256 → the value's bytes",
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return fmt.Errorf("setting up object store %s: %w", BlobBucket, err)
	}
	// Snapshots of folded run states (snapshot.go): a cache, which the
	// journal can always rebuild, so one left behind by a run that ended
	// without removing it goes after a month.
	_, err = js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{
		Bucket:      SnapshotBucket,
		Description: "PAL run state snapshots: run id → the state folded at a journal head",
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		TTL:         30 * 24 * time.Hour,
	})
	if err != nil {
		return fmt.Errorf("setting up object store %s: %w", SnapshotBucket, err)
	}
	queues := []string{event.DefaultQueue}
	for _, q := range cfg.Queues {
		if err := event.ValidateQueue(q); err != nil {
			return fmt.Errorf("setting up: %w", err)
		}
		if !slices.Contains(queues, q) {
			queues = append(queues, q)
		}
	}
	for _, q := range queues {
		name := WorkConsumerName(q)
		if ownsTTL {
			_, err = js.CreateOrUpdateConsumer(ctx, WorkStream, workConsumerConfig(cfg, q))
		} else if _, err = js.Consumer(ctx, WorkStream, name); errors.Is(err, jetstream.ErrConsumerNotFound) {
			_, err = js.CreateConsumer(ctx, WorkStream, workConsumerConfig(cfg, q))
			if errors.Is(err, jetstream.ErrConsumerExists) {
				err = nil // created meanwhile by a worker
			}
		}
		if err != nil {
			return fmt.Errorf("setting up consumer %s: %w", name, err)
		}
	}
	_, err = js.CreateOrUpdateConsumer(ctx, TimersStream, jetstream.ConsumerConfig{
		Durable:       TimerConsumer,
		Description:   "PAL workers: wake runs whose timer fired",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second,
		MaxDeliver:    -1,
		FilterSubject: timerFirePrefix + "*",
	})
	if err != nil {
		return fmt.Errorf("setting up consumer %s: %w", TimerConsumer, err)
	}
	_, err = js.CreateOrUpdateConsumer(ctx, CommandsStream, jetstream.ConsumerConfig{
		Durable:       CommandConsumer,
		Description:   "PAL workers: carry out commands",
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second,
		MaxDeliver:    -1,
		MaxAckPending: 1000,
		FilterSubject: CommandPrefix + ">",
	})
	if err != nil {
		return fmt.Errorf("setting up consumer %s: %w", CommandConsumer, err)
	}
	return nil
}

// workConsumerConfig is the durable of queue q: its work subjects only,
// so the consumers of a work-queue stream never overlap.
func workConsumerConfig(cfg Config, q string) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Durable:       WorkConsumerName(q),
		Description:   "PAL workers: drive the runs of queue " + q,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cfg.LeaseTTL,
		MaxDeliver:    -1,
		MaxAckPending: 100_000,
		MaxWaiting:    4096,
		FilterSubject: WorkSubject(q, "*"),
	}
}

// IsMissing reports whether err means PAL's streams are not set up.
func IsMissing(err error) bool {
	return errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound) ||
		errors.Is(err, jetstream.ErrConsumerNotFound)
}
