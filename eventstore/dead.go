package eventstore

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// MaxDeliveries is how many times a message whose handling keeps failing
// (a handler panics on it) is delivered: on that delivery it goes to
// PAL_DEAD instead of back to its stream. A failure known to be passing
// (NATS or Postgres unavailable, a lease held elsewhere) is not counted
// against it: those messages are retried for as long as it takes.
const MaxDeliveries = 5

// PAL_DEAD's limits: past either, the oldest dead letters are discarded.
const (
	DeadMaxMsgs  = 100_000
	DeadMaxBytes = 256 << 20
)

// Sources of dead letters: the last token of pal.dead.<source>.
const (
	DeadCommands = "cmds"
	DeadWork     = "work"
	DeadTimers   = "timers"
)

// Headers of a dead letter; the body is the original message's, and its
// other headers (but JetStream's Nats-*) are kept.
// Pal-Dead-Msg-Id is the original's Nats-Msg-Id, when it had one.
const (
	DeadStreamHeader     = "Pal-Dead-Stream"
	DeadSubjectHeader    = "Pal-Dead-Subject"
	DeadSeqHeader        = "Pal-Dead-Seq"
	DeadDeliveredHeader  = "Pal-Dead-Delivered"
	DeadReasonHeader     = "Pal-Dead-Reason"
	DeadMsgIDHeader      = "Pal-Dead-Msg-Id"
	maxDeadReason        = 1024
	deadDuplicatesWindow = 2 * time.Minute
)

// DeadSubject is the PAL_DEAD subject of a source.
func DeadSubject(source string) string { return DeadPrefix + source }

// DeadLetter copies msg to PAL_DEAD on pal.dead.<source>, with headers
// naming its stream, subject, stream sequence, delivery count and reason
// (one line, at most 1 KiB). It does not settle msg. The copy's
// Nats-Msg-Id is the original's stream and sequence, so a copy made
// again (the term after it was lost) is stored once.
// Errors: msg has no JetStream metadata; the publish's.
func (s *Store) DeadLetter(ctx context.Context, source string, msg jetstream.Msg, reason string) error {
	md, err := msg.Metadata()
	if err != nil {
		return fmt.Errorf("dead-lettering a message on %s: %w", msg.Subject(), err)
	}
	out := nats.NewMsg(DeadSubject(source))
	out.Data = msg.Data()
	for k, vs := range msg.Headers() {
		if strings.HasPrefix(k, "Nats-") {
			continue // JetStream's: an expected-sequence header would refuse the copy
		}
		out.Header[k] = vs
	}
	if id := msg.Headers().Get(jetstream.MsgIDHeader); id != "" {
		out.Header.Set(DeadMsgIDHeader, id)
	}
	out.Header.Set(DeadStreamHeader, md.Stream)
	out.Header.Set(DeadSubjectHeader, msg.Subject())
	out.Header.Set(DeadSeqHeader, strconv.FormatUint(md.Sequence.Stream, 10))
	out.Header.Set(DeadDeliveredHeader, strconv.FormatUint(md.NumDelivered, 10))
	out.Header.Set(DeadReasonHeader, DeadReason(reason))
	out.Header.Set(jetstream.MsgIDHeader, md.Stream+":"+strconv.FormatUint(md.Sequence.Stream, 10))
	pctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if _, err := s.js.PublishMsg(pctx, out); err != nil {
		return fmt.Errorf("dead-lettering %s seq %d: %w", md.Stream, md.Sequence.Stream, err)
	}
	return nil
}

// DeadReason makes reason fit a header: one line, at most 1 KiB.
func DeadReason(reason string) string {
	reason = strings.Join(strings.Fields(reason), " ")
	if len(reason) > maxDeadReason {
		reason = strings.ToValidUTF8(reason[:maxDeadReason], "") + "…"
	}
	return reason
}

// Retry settles a message whose handling failed for a reason that may not
// pass (a panic): it is redelivered after delay until its MaxDeliveries-th
// delivery, which goes to PAL_DEAD (Dead). dead reports that it went
// there; err, that it could be neither copied nor handed back cleanly (a
// message that could not be copied is handed back, so nothing is dropped
// while NATS is unavailable).
func (s *Store) Retry(ctx context.Context, source string, msg jetstream.Msg, reason string, delay time.Duration) (dead bool, err error) {
	md, err := msg.Metadata()
	if err != nil || md.NumDelivered < MaxDeliveries {
		return false, msg.NakWithDelay(delay)
	}
	if err := s.Dead(ctx, source, msg, reason); err != nil {
		return false, err
	}
	return true, nil
}

// Dead copies msg to PAL_DEAD (DeadLetter) and terminates it, for a
// message whose handling failed for good or too often. A message that
// could not be copied is handed back for redelivery instead.
// Errors: DeadLetter's; the term's (redelivered, the message is copied
// again under the same Nats-Msg-Id, and stored once).
func (s *Store) Dead(ctx context.Context, source string, msg jetstream.Msg, reason string) error {
	if err := s.DeadLetter(ctx, source, msg, reason); err != nil {
		_ = msg.NakWithDelay(time.Second)
		return err
	}
	if err := msg.TermWithReason("dead-lettered to " + DeadStream); err != nil {
		return fmt.Errorf("terminating a dead-lettered message: %w", err)
	}
	return nil
}
