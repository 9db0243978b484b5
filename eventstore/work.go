package eventstore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/internal/retry"
)

// Enqueue asks the workers of queue q (the run's: run_created.queue,
// empty for the default queue) to drive a run. At most one work message
// is pending per run: if one is already pending, Enqueue does nothing.
// reason is recorded in a header for operators (start, sweep, approve …).
// A caller that does not know the run's queue asks QueueOf.
func (s *Store) Enqueue(ctx context.Context, q, runID, reason string) error {
	if err := checkWork(q, runID); err != nil {
		return fmt.Errorf("enqueueing: %w", err)
	}
	msg := workMsg(q, runID, reason)
	return retry.Do(ctx, jsRetry, func() error {
		pctx, cancel := context.WithTimeout(ctx, s.timeout)
		_, err := s.js.PublishMsg(pctx, msg, jetstream.WithExpectStream(WorkStream))
		cancel()
		if err == nil || alreadyPending(err) {
			return nil
		}
		err = fmt.Errorf("enqueueing run %s: %w", runID, err)
		if !transient(err) {
			return retry.Permanent(err)
		}
		return err
	})
}

// enqueueAsync is Enqueue without waiting for the server (AppendStart):
// it returns the wait for its answer. A first try that failed, or had no
// answer within the request timeout, is done again by Enqueue, with its
// retries (a message that landed meanwhile makes it a no-op).
func (s *Store) enqueueAsync(q, runID, reason string) func(context.Context) error {
	if err := checkWork(q, runID); err != nil {
		return func(context.Context) error { return fmt.Errorf("enqueueing: %w", err) }
	}
	ack, err := s.js.PublishMsgAsync(workMsg(q, runID, reason), jetstream.WithExpectStream(WorkStream))
	return func(ctx context.Context) error {
		if err == nil {
			err = awaitAck(ctx, ack, s.timeout)
			if err == nil {
				return nil
			}
			if ctx.Err() != nil {
				return fmt.Errorf("enqueueing run %s: %w", runID, err)
			}
		}
		if alreadyPending(err) {
			return nil
		}
		return s.Enqueue(ctx, q, runID, reason)
	}
}

// errNoAck: an async publish had no answer within its wait.
var errNoAck = errors.New("no ack in time")

// awaitAck waits for an async publish's answer: nil, the server's error,
// errNoAck after timeout (0: no limit), or ctx's error.
func awaitAck(ctx context.Context, ack jetstream.PubAckFuture, timeout time.Duration) error {
	var expired <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expired = t.C
	}
	select {
	case <-ack.Ok():
		return nil
	case err := <-ack.Err():
		return err
	case <-expired:
		return errNoAck
	case <-ctx.Done():
		return ctx.Err()
	}
}

// checkWork checks a work message's run id and queue (empty: default).
func checkWork(q, runID string) error {
	if err := checkRunID(runID); err != nil {
		return err
	}
	if q != "" {
		return event.ValidateQueue(q)
	}
	return nil
}

// QueueOf returns the queue of a run (its run_created's, DefaultQueue when
// it names none), read with one Get: for the callers that wake a run they
// know only by id (a fired timer, a takeover, a child's end waking its
// parent). ErrRunNotFound when the run has no journal.
func (s *Store) QueueOf(ctx context.Context, runID string) (string, error) {
	ev, err := s.FirstEvent(ctx, runID)
	if err != nil {
		return "", err
	}
	var d struct {
		Queue string `json:"queue"`
	}
	if ev.Kind != event.RunCreated || json.Unmarshal(ev.Data, &d) != nil {
		return "", fmt.Errorf("reading the queue of run %s: its first event is no run_created", runID)
	}
	return event.QueueOr(d.Queue), nil
}

func workMsg(q, runID, reason string) *nats.Msg {
	msg := &nats.Msg{Subject: WorkSubject(q, runID), Header: nats.Header{}}
	msg.Header.Set(reasonHeader, reason)
	return msg
}

// WorkReason is the reason Enqueue gave work message msg ("start" for a
// run's first).
func WorkReason(msg jetstream.Msg) string { return msg.Headers().Get(reasonHeader) }

// Requeue puts a fresh work message for the run at the head of the
// queue: a pending one (waiting out a redelivery delay, or held by a
// worker that is frozen) is deleted first, so a worker takes the run at
// once. A worker that still holds the deleted message loses nothing: its
// ack or nak of a message that is gone is a no-op, and the lease and the
// fencing token decide who drives. The presence watch calls it after
// taking a departed worker's lease (Leases.Revoke); pal run resume calls it
// for a run no live worker drives.
func (s *Store) Requeue(ctx context.Context, q, runID, reason string) error {
	if err := checkWork(q, runID); err != nil {
		return fmt.Errorf("requeueing: %w", err)
	}
	m, err := s.work.GetLastMsgForSubject(ctx, WorkSubject(q, runID))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
	case err != nil:
		return fmt.Errorf("requeueing run %s: %w", runID, err)
	default:
		if err := s.work.DeleteMsg(ctx, m.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) &&
			!errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) {
			return fmt.Errorf("requeueing run %s: deleting its pending work: %w", runID, err)
		}
	}
	return s.Enqueue(ctx, q, runID, reason)
}

// WorkPending reports whether a work message for the run is in PAL_WORK
// on queue q (waiting or being worked on).
func (s *Store) WorkPending(ctx context.Context, q, runID string) (bool, error) {
	if err := checkWork(q, runID); err != nil {
		return false, fmt.Errorf("checking work: %w", err)
	}
	_, err := s.work.GetLastMsgForSubject(ctx, WorkSubject(q, runID))
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("checking work of run %s: %w", runID, err)
	}
	return true, nil
}

// WorkConsumer returns the durable pull consumer workers take queue q's
// work from (Setup makes it, for the queues of its Config).
func (s *Store) WorkConsumer(ctx context.Context, q string) (jetstream.Consumer, error) {
	c, err := s.js.Consumer(ctx, WorkStream, WorkConsumerName(q))
	if err != nil {
		return nil, fmt.Errorf("opening consumer %s: %w", WorkConsumerName(q), err)
	}
	return c, nil
}

// RunIDFromWork extracts the run id and queue from a work message
// subject: pal.work.<run_id> (the default queue) or
// pal.work.<queue>.<run_id>.
func RunIDFromWork(subject string) (runID, queue string, ok bool) {
	rest, ok := strings.CutPrefix(subject, WorkPrefix)
	if !ok {
		return "", "", false
	}
	queue = event.DefaultQueue
	if q, id, two := strings.Cut(rest, "."); two {
		if event.ValidateQueue(q) != nil {
			return "", "", false
		}
		queue, rest = q, id
	}
	return rest, queue, checkRunID(rest) == nil
}

// alreadyPending reports the per-subject discard-new refusal of a second
// work message for the same run.
func alreadyPending(err error) bool {
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return strings.Contains(strings.ToLower(apiErr.Description), "maximum messages per subject")
	}
	return false
}

// pinLag is how far PAL_WORK may move past its pin before the pin is
// written again.
const pinLag = 1000

// PinWork keeps a message no consumer takes (on WorkPinSubject) near the
// end of PAL_WORK, and returns its stream sequence. Without one, the ack
// of the only pending work message empties the stream's last file block,
// and the server replaces that block with a new file on every workflow (a
// file create and a tombstone, under the stream's lock: ~20% of the CPU of
// runs started one after another). The pin keeps the last block from
// emptying; once the stream has moved pinLag past it (the block may have
// rolled over), it is deleted and written again. Workers call it now and
// then; concurrent calls are harmless (at most one pin is kept: the
// subject takes one message).
func (s *Store) PinWork(ctx context.Context) (uint64, error) {
	info, err := s.work.Info(ctx)
	if err != nil {
		return 0, fmt.Errorf("pinning %s: %w", WorkStream, err)
	}
	m, err := s.work.GetLastMsgForSubject(ctx, WorkPinSubject)
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
	case err != nil:
		return 0, fmt.Errorf("pinning %s: %w", WorkStream, err)
	case info.State.LastSeq-m.Sequence < pinLag:
		return m.Sequence, nil
	default:
		if err := s.work.DeleteMsg(ctx, m.Sequence); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) &&
			!errors.Is(err, jetstream.ErrMsgDeleteUnsuccessful) {
			return 0, fmt.Errorf("pinning %s: %w", WorkStream, err)
		}
	}
	ack, err := s.js.PublishMsg(ctx, &nats.Msg{Subject: WorkPinSubject}, jetstream.WithExpectStream(WorkStream))
	if alreadyPending(err) {
		return 0, nil // another worker pinned it meanwhile
	}
	if err != nil {
		return 0, fmt.Errorf("pinning %s: %w", WorkStream, err)
	}
	return ack.Sequence, nil
}
