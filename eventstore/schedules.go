package eventstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/event"
)

// ScheduleBucket holds PAL's schedules (docs/architecture.md §5.2, §10.11):
// key <name>, value the schedule's JSON (Schedule), its definition and how
// far its ticks have been fired (LastTick). The bucket is the truth; every
// change is a revision-checked update, so two workers that fire one tick
// move LastTick once, and a change made meanwhile is read again, never
// overwritten.
const ScheduleBucket = "PAL_SCHEDULES"

// ScheduleStream is the stream behind ScheduleBucket.
const ScheduleStream = "KV_" + ScheduleBucket

// Bounds of the bucket: a schedule's value is at most MaxScheduleValue
// bytes (its input at most MaxScheduleInput, checked before it is
// written), the bucket at most ScheduleBucketBytes.
const (
	MaxScheduleValue    = 128 << 10
	MaxScheduleInput    = 64 << 10
	ScheduleBucketBytes = 256 << 20
)

var (
	// ErrScheduleNotFound: no schedule has the name.
	ErrScheduleNotFound = errors.New("schedule not found")
	// ErrScheduleExists: a create found the name taken.
	ErrScheduleExists = errors.New("schedule already exists")
	// ErrScheduleChanged: an update's revision is no longer the latest
	// (another worker or command changed the schedule first).
	ErrScheduleChanged = errors.New("schedule changed meanwhile")
)

// Schedule is one schedule as PAL_SCHEDULES stores it. Exactly one of Cron
// and Every is set. Checking the fields is the front door's job (runs);
// the store keeps what it is given.
type Schedule struct {
	Name string `json:"name"`
	// Cron is a five-field cron expression or a descriptor (@daily…), read
	// in TZ (an IANA zone; empty: UTC).
	Cron string `json:"cron,omitempty"`
	TZ   string `json:"tz,omitempty"`
	// Every is a fixed interval (a Go duration, at least 1 s): the ticks
	// are Created + k·Every, k ≥ 1.
	Every string `json:"every,omitempty"`
	// Workflow names a deployed workflow (NAME or NAME@VERSION); Input is
	// each run's input.
	Workflow string          `json:"workflow"`
	Input    json.RawMessage `json:"input"`
	// Overlap is "skip" or "allow"; Catchup "none", "one" or "all".
	Overlap string `json:"overlap"`
	Catchup string `json:"catchup"`
	Paused  bool   `json:"paused,omitempty"`
	// By is who created it; Created when (UTC, whole seconds).
	By      string    `json:"by,omitempty"`
	Created time.Time `json:"created"`
	// LastTick is the last tick fired or passed over: the ticks after it
	// are due. Create and resume set it to their time, so a schedule
	// never fires for a time before it existed or while it was paused.
	LastTick time.Time `json:"last_tick"`
	// LastRun is the run of the last tick fired, or of the last trigger.
	LastRun string `json:"last_run,omitempty"`

	// Revision is the KV revision the schedule was read at (not stored).
	Revision uint64 `json:"-"`
}

// scheduleSetup is the bucket, as Setup creates it.
func scheduleSetup(replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket:       ScheduleBucket,
		Description:  "PAL schedules: <name> → the schedule and its last tick",
		History:      1,
		Storage:      jetstream.FileStorage,
		Replicas:     replicas,
		MaxValueSize: MaxScheduleValue,
		MaxBytes:     ScheduleBucketBytes,
	}
}

func (s *Store) scheduleKV(ctx context.Context) (jetstream.KeyValue, error) {
	kv, err := s.schedules.get(func() (jetstream.KeyValue, error) { return s.js.KeyValue(ctx, ScheduleBucket) })
	if err != nil {
		return nil, fmt.Errorf("opening KV bucket %s: %w", ScheduleBucket, err)
	}
	return kv, nil
}

func encodeSchedule(sc Schedule) ([]byte, error) {
	b, err := marshalExact(sc)
	if err != nil {
		return nil, fmt.Errorf("encoding schedule %s: %w", sc.Name, err)
	}
	if len(b) > MaxScheduleValue {
		return nil, fmt.Errorf("schedule %s: %w: %d bytes; a schedule takes at most %d", sc.Name, ErrPayloadTooLarge, len(b), MaxScheduleValue)
	}
	return b, nil
}

func decodeSchedule(e jetstream.KeyValueEntry) (Schedule, error) {
	var sc Schedule
	if err := json.Unmarshal(e.Value(), &sc); err != nil {
		return Schedule{}, fmt.Errorf("reading schedule %s: %w", e.Key(), err)
	}
	sc.Revision = e.Revision()
	return sc, nil
}

// CreateSchedule stores a new schedule (a KV create) and returns it with
// its revision.
//
// Errors: event.ErrInvalidWorkflowName for a name that is no key (the
// same alphabet as a workflow's); ErrScheduleExists; ErrPayloadTooLarge.
func (s *Store) CreateSchedule(ctx context.Context, sc Schedule) (Schedule, error) {
	if err := event.ValidateWorkflowName(sc.Name); err != nil {
		return Schedule{}, err
	}
	b, err := encodeSchedule(sc)
	if err != nil {
		return Schedule{}, err
	}
	kv, err := s.scheduleKV(ctx)
	if err != nil {
		return Schedule{}, err
	}
	rev, err := kv.Create(ctx, sc.Name, b)
	if errors.Is(err, jetstream.ErrKeyExists) {
		return Schedule{}, fmt.Errorf("creating schedule %s: %w", sc.Name, ErrScheduleExists)
	}
	if err != nil {
		return Schedule{}, fmt.Errorf("creating schedule %s: %w", sc.Name, err)
	}
	sc.Revision = rev
	return sc, nil
}

// GetSchedule reads one schedule.
//
// Errors: ErrScheduleNotFound (also for a name that is no key).
func (s *Store) GetSchedule(ctx context.Context, name string) (Schedule, error) {
	if event.ValidateWorkflowName(name) != nil {
		return Schedule{}, fmt.Errorf("schedule %q: %w", name, ErrScheduleNotFound)
	}
	kv, err := s.scheduleKV(ctx)
	if err != nil {
		return Schedule{}, err
	}
	return getSchedule(ctx, kv, name)
}

func getSchedule(ctx context.Context, kv jetstream.KeyValue, name string) (Schedule, error) {
	// A schedule just created may not be on the replica that answers yet.
	e, err := getAfterLag(ctx, kv, name)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Schedule{}, fmt.Errorf("schedule %s: %w", name, ErrScheduleNotFound)
	}
	if err != nil {
		return Schedule{}, fmt.Errorf("reading schedule %s: %w", name, err)
	}
	return decodeSchedule(e)
}

// UpdateSchedule replaces a schedule read at sc.Revision and returns it
// with its new revision.
//
// Errors: ErrScheduleChanged when the schedule is no longer at
// sc.Revision (changed or deleted meanwhile: read it again);
// ErrPayloadTooLarge.
func (s *Store) UpdateSchedule(ctx context.Context, sc Schedule) (Schedule, error) {
	b, err := encodeSchedule(sc)
	if err != nil {
		return Schedule{}, err
	}
	kv, err := s.scheduleKV(ctx)
	if err != nil {
		return Schedule{}, err
	}
	rev, err := kv.Update(ctx, sc.Name, b, sc.Revision)
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyNotFound) {
		return Schedule{}, fmt.Errorf("updating schedule %s: %w", sc.Name, ErrScheduleChanged)
	}
	if err != nil {
		return Schedule{}, fmt.Errorf("updating schedule %s: %w", sc.Name, err)
	}
	sc.Revision = rev
	return sc, nil
}

// DeleteSchedule removes a schedule (a purge: nothing of it is kept). The
// runs it started are not touched.
//
// Errors: ErrScheduleNotFound.
func (s *Store) DeleteSchedule(ctx context.Context, name string) error {
	if _, err := s.GetSchedule(ctx, name); err != nil {
		return err
	}
	kv, err := s.scheduleKV(ctx)
	if err != nil {
		return err
	}
	if err := kv.Purge(ctx, name); err != nil {
		return fmt.Errorf("deleting schedule %s: %w", name, err)
	}
	return nil
}

// Schedules lists every schedule, by name.
func (s *Store) Schedules(ctx context.Context) ([]Schedule, error) {
	var out []Schedule
	err := s.WatchSchedules(ctx, func(sc Schedule, deleted bool) bool {
		if !deleted {
			out = append(out, sc)
		}
		return true
	}, func() bool { return false })
	if err != nil {
		return nil, err
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// WatchSchedules calls fn with every schedule the bucket holds, then
// current() once, then with every change (deleted true for a schedule
// deleted, with only its Name set) until ctx ends or fn or current returns
// false. A value that does not decode is skipped. It returns nil when
// fn or current stopped it or ctx ended.
func (s *Store) WatchSchedules(ctx context.Context, fn func(sc Schedule, deleted bool) bool, current func() bool) error {
	kv, err := s.scheduleKV(ctx)
	if err != nil {
		return err
	}
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watching KV bucket %s: %w", ScheduleBucket, err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return nil
			}
			if e == nil {
				if !current() {
					return nil
				}
				continue
			}
			if e.Operation() != jetstream.KeyValuePut {
				if !fn(Schedule{Name: e.Key()}, true) {
					return nil
				}
				continue
			}
			sc, err := decodeSchedule(e)
			if err != nil {
				continue
			}
			if !fn(sc, false) {
				return nil
			}
		}
	}
}
