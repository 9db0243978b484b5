package eventstore

import (
	"context"
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/event"
)

// What group_test.go reaches inside the group commit.

var ErrGroupFailed = errGroupFailed

const GroupMinBatch = groupMinBatch

// GroupStats returns the atomic batches the store's group commit wrote
// and the appends in them; ok is false when the store has none.
func (s *Store) GroupStats() (batches, batched int64, ok bool) {
	if s.group == nil {
		return 0, 0, false
	}
	return s.group.batches.Load(), s.group.batched.Load(), true
}

// VersionKept reports whether the store keeps version v of name.
func (s *Store) VersionKept(name string, v uint64) bool {
	return s.versions.Contains(versionKey(name, v))
}

const MaxCachedDefinition = maxCachedDefinition

// GetScheduleVia is GetSchedule reading the bucket through kv.
func GetScheduleVia(ctx context.Context, kv jetstream.KeyValue, name string) (Schedule, error) {
	return getSchedule(ctx, kv, name)
}

// DeployedWorkflowVia is DeployedWorkflow reading the registry through kv.
func (s *Store) DeployedWorkflowVia(ctx context.Context, kv jetstream.KeyValue, name string, v uint64) (DeployedWorkflow, error) {
	return s.deployedWorkflow(ctx, kv, name, v)
}

// FirstAppend is the first message Append would publish for a run: one
// event at seq 1 on an empty subject.
type FirstAppend struct {
	Run  string
	Body []byte
	evs  []event.Event
	a    *groupAppend
}

func (s *Store) FirstAppends(runs ...string) ([]*FirstAppend, error) {
	var out []*FirstAppend
	for _, run := range runs {
		evs := []event.Event{{V: event.Version, RunID: run, Seq: 1, Kind: event.ApprovalReceived, WorkerID: "w1",
			TS: time.Now().UTC(), Data: json.RawMessage(`{"n":1}`)}}
		body, err := s.encode(run, evs)
		if err != nil {
			return nil, err
		}
		msg, msgID := journalMsg(run, evs, body, "")
		out = append(out, &FirstAppend{Run: run, Body: body, evs: evs,
			a: &groupAppend{msg: msg, msgID: msgID, done: make(chan struct{}), lead: make(chan struct{}, 1)}})
	}
	return out, nil
}

// CommitAsBatch writes apps as one atomic batch.
func (s *Store) CommitAsBatch(ctx context.Context, apps []*FirstAppend) {
	group := make([]*groupAppend, len(apps))
	for i, a := range apps {
		group[i] = a.a
	}
	s.group.commit(ctx, group)
}

// Result is what the batch answered the append: its stream sequence or
// an error.
func (a *FirstAppend) Result() (uint64, error) {
	if a.a.err != nil {
		return 0, a.a.err
	}
	return a.a.ack.Sequence, nil
}

// PublishAlone publishes the append as Append would (a retry).
func (s *Store) PublishAlone(ctx context.Context, a *FirstAppend) (Head, error) {
	return s.publish(ctx, a.Run, Head{}, a.evs, a.Body, "")
}

// PublishQueued queues the append in the group commit and waits for it.
func (s *Store) PublishQueued(ctx context.Context, a *FirstAppend) error {
	_, err := s.group.publish(ctx, a.a.msg, a.a.msgID, 0)
	return err
}

// HoldGroup makes the group commit act as if a group were being written,
// so appends queue; ReleaseGroup ends that write, as write does.
func (s *Store) HoldGroup() {
	s.group.mu.Lock()
	s.group.writing = true
	s.group.mu.Unlock()
}

func (s *Store) ReleaseGroup() {
	s.group.mu.Lock()
	s.group.handOff()
	s.group.mu.Unlock()
}

// GroupQueue returns how many appends wait and whether a group is being
// written.
func (s *Store) GroupQueue() (int, bool) {
	s.group.mu.Lock()
	defer s.group.mu.Unlock()
	return len(s.group.queue), s.group.writing
}
