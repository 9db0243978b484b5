// Package eventstore is PAL's write side on NATS JetStream: the streams,
// KV buckets, object stores and consumers of docs/architecture.md §5, the fenced
// journal append, reading and watching a run, the per-run lease, the work
// queue and the timers.
//
// Layout (names are public interface; Setup creates all of it, and
// TestDocLayoutIsSetup compares this table with what Setup made):
//
//	PAL_EVENTS     stream    pal.events.<run_id>            the journal, one subject per run
//	PAL_WORK       stream    pal.work.<run_id> pal.work.<queue>.<run_id> pal.workpin
//	                                                        work queues (the default queue's, another's), at most one
//	                                                        pending per run; the pin (work.go)
//	PAL_CMDS       stream    pal.cmd.runs.>                 durable commands
//	PAL_TIMERS     stream    pal.timer.>                    scheduled wake-ups (approval and wait timeouts)
//	PAL_DEAD       stream    pal.dead.<source>              dead letters: messages whose handling kept failing
//	PAL_BLOB_REFS  stream    pal.blobref.<sha256>.<run_id> pal.blobreclaim.<sha256>
//	                                                        which runs name which PAL_BLOBS object; a release's mark
//	PAL_DELTAS     stream    pal.deltas.<run_id>            LLM steps' text as it streams, memory, 10 min (deltas.go)
//	PAL_THREADS    stream    pal.threads.<thread_id>        threads: conversations runs continue, chained like a journal (thread.go)
//	PAL_LEASES     KV        <run_id> → owner               lease with a TTL; w.<token>: a worker's presence (capabilities)
//	PAL_RECEIPTS   KV        <run_id> → receipt             signed run receipts, written once
//	PAL_INFLIGHT   KV        <run_id> → queue               the runs not yet ended, for the sweep
//	PAL_WORKFLOWS  KV        <name> <name>.<version>        deployed workflows: the latest version; each version, written once
//	PAL_SCHEDULES  KV        <name> → schedule              schedules and their last tick, revision-checked updates (schedules.go)
//	PAL_BLOBS      objects   <sha256>                       big step values, put once, content-addressed
//	PAL_SNAPSHOTS  objects   <run_id>                       folded run states at a journal head: a cache
//	pal-workers    consumer  PAL_WORK                       workers take runs of the default queue to drive
//	                                                        (pal-workers-<queue>: another queue's, made by Setup
//	                                                        for the queues of its Config)
//	pal-timers     consumer  PAL_TIMERS                     workers take fired timers (pal.timer.fire.<run_id>)
//	pal-commands   consumer  PAL_CMDS                       workers carry out durable commands
//
// The projector's consumer on PAL_EVENTS (pal-projector) is made by package
// projections. Core NATS subjects, stored nowhere:
//
//	pal.watch.<run_id>       PAL_EVENTS' republished copies, for Watch
//	pal.presence.<token>     a worker answers probes while connected
//	pal.ctl.cancel.<run_id>  a cancel notice to the driving worker
//	pal.cmd.rejected         refused durable commands, with the reason
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
//   - A message PAL did not write is not sound, however sound its bytes:
//     every reader (Read, Watch, Scan's callers: the projector and the
//     receipt signer) checks its stamp (StampOf, event.Chain.NextStamped):
//     Nats-Msg-Id "<run_id>:<first seq>" and Pal-Kind must be its events',
//     and it must carry no Nats-Stream, Nats-Subject or Nats-Sequence of
//     its own (a server's answer stored in the journal). Where a read
//     stands is the server's own header, the last (served).
//   - Every method that takes a run id refuses one that is not a single
//     NATS subject token (event.ValidateRunID) before touching JetStream,
//     so no run id can widen a subject or a lease key.
//   - A thread (thread.go) is journaled as a run is: one subject, records
//     chained by event.Link, each appended fenced on the subject's last
//     sequence with Nats-Msg-Id "<thread>:<kind>:<run_id>:<step_id>", so a
//     record is written at most once per (kind, run, step); ReadThread
//     verifies chain and stamps and returns an error wrapping
//     event.ErrThreadCorrupt for what does not verify.
//   - The run's first event (run_created) is appended with an expected
//     subject sequence of 0, so a run id is created at most once.
//   - A lease is a KV entry created with a per-key TTL and renewed by a
//     sequence-checked publish that carries a fresh TTL. A lease is never
//     assumed held past its TTL measured from before the last renewal was
//     sent. A value on a lease key that PAL did not write (no TTL, not an
//     owner string, a stored answer) is broken by the next Acquire and
//     logged, never honoured.
package eventstore
