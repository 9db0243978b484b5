// Package runs is the front door to PAL's runs: the one command path and
// the one read model.
//
// Every transport decodes its request into a command struct
// (StartCommand, ApproveCommand, CancelCommand, SignalCommand,
// ResumeCommand, ForkCommand, RetryCommand) that
// validates itself, and calls the same Client method: REST (package api),
// the NATS micro service pal.api.runs.*, the durable commands of
// PAL_CMDS (CommandProcessor, consumer pal-commands) and the pal CLI.
// Errors are typed (*InputError, ErrInvalidRunID, ErrRunNotFound,
// ErrRunFinished, ErrNotWaiting, ErrRunExists) and Classify maps them to
// answer codes with errors.Is and errors.As.
//
// Invariants:
//
//   - A command writes only inputs to a run's journal (run_created,
//     approval_received, signal_received, run_cancelled), each with one
//     fenced append after folding the journal (Client.appendInput); a
//     refused command writes nothing. Step and run events are the
//     workers' alone. A fork or retry only reads its source and starts a
//     new run; a resume writes no event (it replaces the work message, and
//     with force breaks the lease; fencing does the rest).
//   - With WithLimiter, every command spends one of its caller's starts
//     (start, fork, retry) or commands (the others) before anything is
//     read: over the rate it is refused (*limit.Error, code rate_limited)
//     whichever door it came in by. The caller is the identity the
//     transport authenticated (WithCaller), else the one the command
//     journals.
//   - Replies go only under "_INBOX." or a configured prefix
//     (Client.CheckReply); a command naming any other reply subject is
//     refused whole and nothing is published there.
//   - RunView renders a run the same from the journal (ViewOf) and from
//     the Postgres projection (ViewOfDetail): both go through
//     readmodel.RowsOf-shaped rows and one render function.
//
// This package does not drive runs; package workers does, and nothing
// here imports it. See docs/architecture.md.
package runs
