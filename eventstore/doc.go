// Package eventstore is PAL's write side on NATS JetStream: the streams,
// the KV bucket and the consumers of docs/architecture.md §5, the fenced
// journal append, reading and watching a run, the per-run lease, the work
// queue and the timers.
//
// Layout (names are public interface):
//
//	PAL_EVENTS    stream  pal.events.<run_id>   the journal, one subject per run
//	PAL_WORK      stream  pal.work.<run_id>     work queue, at most one pending per run
//	PAL_CMDS      stream  pal.cmd.runs.>        durable commands
//	PAL_TIMERS    stream  pal.timer.>           scheduled wake-ups (approval timeouts)
//	PAL_LEASES    KV      <run_id> → owner      lease with a TTL; w.<token>: a worker's presence
//	PAL_INFLIGHT  KV      <run_id>              the runs not yet ended, for the sweep
//	pal.watch.<run_id>                          PAL_EVENTS' republished copies, for Watch
//	pal.presence.<token>                        a worker answers probes while connected
//
// Invariants:
//
//   - Every append states the stream sequence of the last message it saw on
//     the run's subject (ExpectLastSequencePerSubject) and carries
//     Nats-Msg-Id "<run_id>:<seq>". A writer whose view is stale gets a
//     *ConflictError and appends nothing. An append whose acknowledgement
//     was lost is recognised on retry: the server answers wrong-sequence
//     (10071, or 10164 on a cluster), the store reads the subject's first
//     message after the stated head, and if it is byte for byte ours (same
//     Nats-Msg-Id and body) the append landed.
//   - Append sets every event's prev to the Hash of the message before it
//     (Head.Hash), so a run's subject is a hash chain; Read, ReadAfter,
//     Pages and Watch pass every message through event.Chain and never
//     return what does not verify (Read returns *event.CorruptError with
//     the sound events and the head a Seal is appended after).
//   - Pages reads a run from a seq in bounded pages (PageMessages,
//     PageBytes): a reader holds a page, never the journal, and one that
//     starts at the head reads one message.
//   - Every method that takes a run id refuses one that is not a single
//     NATS subject token (event.ValidateRunID) before touching JetStream,
//     so no run id can widen a subject or a lease key.
//   - The run's first event (run_created) is appended with an expected
//     subject sequence of 0, so a run id is created at most once.
//   - A lease is a KV entry created with a per-key TTL and renewed by a
//     sequence-checked publish that carries a fresh TTL. A lease is never
//     assumed held past its TTL measured from before the last renewal was
//     sent.
package eventstore
