// Package workers drives runs: it is where PAL's I/O happens.
//
// A Worker pulls "drive this run" messages from the PAL_WORK consumer
// pal-workers, takes the run's lease in PAL_LEASES, folds the run's journal
// (engine.Fold), appends run_resumed as the fencing token and then loops:
// engine.Frontier says which steps may go on, the worker starts them (an
// LLM call, a tool, a webhook delivery), several at once, and appends the
// resulting events with a fenced append.
// A background keeper renews the lease and keeps the work message alive
// (InProgress); if either fails, or the lease's TTL runs out without a
// successful renewal, the drive's context is cancelled at once and nothing
// more is appended.
//
// The drive, one job per file: drive.go (the drive's state, emit and the
// fenced flush), lease.go (taking the lease, the speculative lease of a
// fresh run's first drive, withLease), keeper.go (renewing it), load.go
// (reading and folding the journal: a kept state, folded.go, or a
// snapshot, snapshot.go, and what came after), resume.go (run_resumed,
// the fencing token), loop.go (engine.Frontier and its actions),
// flight.go (the steps in flight at once: branches, their results, the
// interruption of a failed run's siblings), call.go (a step's executors,
// run in its branch; mcp.go the connections to MCP servers, mcp_call.go their tools as steps, mcp_config.go
// PAL_MCP_CONFIG, docs/architecture.md §10.4), execute.go (a step's journaling: started, pure, a
// wait, its outcome), subagent.go (a child run), outcome.go (how a drive ended and what that does with the
// work message and the lease), end.go (the end of a drive: the receipt,
// the state kept, whoever must look again), startlag.go (a start's
// work that comes before its run_created) and thread.go (a thread step:
// waiting for the thread, its turns before the step's own, its turns
// appended once its step_completed is durable, docs/architecture.md
// §7.3.1).
//
// Every drive, top-level or a child driven inline in its parent's drive,
// runs inside withLease (acquire, keeper, drive, release). How it ended is
// classified once (classifyDrive) into a driveOutcome, and the dispositions
// table maps each outcome to the work message's fate and whether the lease
// is given up: the message is acked when the run ends or parks (a journal
// that does not verify is sealed, failing the run with journal_corrupt, and
// so ends it), termed when its journal does not fold, handed back (nak) at once on a graceful
// stop, handed back after a lease TTL when another worker holds the lease or
// the drive failed otherwise, and left to the new owner when the lease or
// the journal was lost.
//
// Steps in flight at once: a drive starts the steps Frontier gives it, in
// order, up to the run's limit (the workflow's policy.concurrency, default
// 8, capped by Config.RunConcurrency, PAL_RUN_CONCURRENCY, default 32),
// each in a goroutine of its own; the drive's goroutine stays the run's one
// writer: every step_started of a set goes out in one flush before any
// step acts, a branch hands what it must journal (a claim, a child's
// creation, its outcome) to the drive's goroutine, which batches it into
// its next flush. A run parks only when nothing is in flight. A step that
// fails the run interrupts its siblings in flight: their calls are
// cancelled and each is journaled as step_failed class interrupted before
// run_failed. A process step runs alone, on the drive's goroutine.
//
// Invariant: only the holder of a run's lease appends the run's
// run_resumed, step and side-effect events and its run_succeeded or
// run_failed (other writers append only run_created, inputs and cancels).
// A drive appends no step event before its run_resumed, fences every append
// on the head it last saw, and appends nothing once the lease may have
// expired (docs/architecture.md §10).
//
// The worker reads the time from Config.Clock for everything a replay must
// decide the same way: the now it gives engine.Next (which decides whether
// an approval timed out), the deadline a new wait journals, when a retry
// may start, and the ts of its events.
//
// Crash safety (docs/architecture.md §11):
//
//   - step_started is durable before a step acts; step_completed carries
//     the full output, so a re-drive skips completed steps.
//   - Every external call carries the idempotency key
//     hex(sha256("runID|stepID|attempt")); a re-drive keeps the attempt.
//   - A webhook delivery is claimed (side_effect_claimed, durable) before it
//     is sent and confirmed (side_effect_delivered) after; a re-drive that
//     finds a claim without a confirmation does not send again and completes
//     the step with delivery "unconfirmed".
//   - A run whose drives keep crashing with no step completing in between
//     fails with code crash_loop after Config.MaxCrashes drives.
//   - A process step runs its program in a sandbox (package
//     internal/sandbox, Config.Sandbox): every process of it dies with the
//     worker, even by kill -9, and with the step; a drive that ends early
//     stops it (SIGTERM, then SIGKILL after ProcessGrace). The program
//     reports its sub-steps over a Unix socket only it sees (ReportPath,
//     SubstepsPath; PAL_REPORT_SOCKET), and the drive journals them with
//     its own fenced writer (see process.go, runtime.go). A worker
//     without a usable sandbox fails process steps, unless
//     PAL_PROCESS_SANDBOX=off (unsafe).
//
// Graceful stop (Stop, SIGTERM in pal worker): the worker stops fetching,
// cancels its drives (an in-flight webhook delivery is allowed to finish),
// releases their leases and naks their work so another worker resumes them
// at once.
//
// A subagent step creates its child run as a start creates a run: the
// child is put in PAL_INFLIGHT before its run_created is appended
// (subagent.go), so every run, top-level or child, is in the index from
// before its run_created to its end. A child whose parent's drive died is
// then found by the sweep with NATS alone, as any run is; one it finds
// while the parent is about to drive it is driven by whoever takes its
// lease first, and the parent waits for it (reason child) as for a child
// another worker drives. Its run_created comes from engine.ChildRunCreated,
// priced as its parent, and every call of a run is charged at the run's
// journaled prices (engine.RunState.UsageOf), never at the worker's own
// table.
//
// An LLM step's call streams (llm.go): its answer's text goes to the
// run's watchers as the provider writes it (deltas.go), never into the
// journal, which keeps the whole answer in step_completed. An answer
// checked against the node's responseSchema that does not match fails
// the attempt (class llm) with the usage it spent; a node with a model
// list moves on to the next model once the policy is spent on one, or at
// once on an outage (journalOutcome, engine.NextModel).
//
// A drive that sees its run end signs the run's receipt (Config.Receipts)
// from its tally of the journal it read and appended and the chain head
// it holds (receipt.Tally), without reading the journal again.
//
// The recovery sweep (Sweeper) lives here too: a safety net that re-enqueues
// runs the read side shows running or queued with no lease and no pending
// work.
package workers
