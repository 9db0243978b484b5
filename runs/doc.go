// Package runs is the front door to PAL's runs: the one command path and
// the one read model.
//
// Every transport decodes its request into a command struct
// (StartCommand, ApproveCommand, CancelCommand, SignalCommand,
// ResumeCommand, ForkCommand, RetryCommand, DeployCommand) that
// validates itself, and calls the same Client method: REST (package api),
// the NATS micro service pal.api.runs.*, pal.api.workflows.* and
// pal.api.schedules.*, the
// durable commands of PAL_CMDS (CommandProcessor, consumer pal-commands)
// and the pal CLI. Errors are typed (*InputError, *ForbiddenError,
// ErrInvalidRunID, ErrRunNotFound, ErrWorkflowNotFound, ErrRunFinished,
// ErrNotWaiting, ErrRunExists, ErrScheduleNotFound, ErrScheduleExists)
// and Classify maps them to answer codes
// with errors.Is and errors.As.
//
// What runs is what was deployed (deploy.go): a start names a workflow
// of the registry PAL_WORKFLOWS ("triage", its latest version, or
// "triage@3"), and run_created journals that version's definition and
// names it (deployed), so a run never changes under a redeploy. A start
// or fork that brings its own definition deploys it first.
//
// Schedules (schedule.go, scheduler.go; docs/architecture.md §10.11):
// ScheduleCommand and ScheduleNameCommand create, pause, resume, delete
// and trigger the schedules of PAL_SCHEDULES, and every worker process
// runs a Scheduler that fires their due ticks through Client.Start. A
// tick's run id is event.ScheduleRunID(name, tick), so a tick two
// workers fire, or one fires again after a crash, is one run; a
// schedule's last tick moves only by a revision-checked update, after
// its runs are started, so a tick is fired again rather than lost.
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
//   - Over NATS a caller is who the server says (Caller): a durable
//     command on pal.cmd.runs.<kind>.<user> is that client user's (the
//     server lets a user publish only under its own name), one on
//     pal.cmd.runs.<kind> PAL's own account's; a service request's caller
//     is named in the server's Nats-Request-Info (Client.Requester). Its
//     scopes must allow the kind, a forced resume needs admin, and a
//     body's by or approver may only repeat the caller's name unless it
//     has admin; else *ForbiddenError. A user PAL does not know
//     (WithUsers, PAL_NATS_USERS) is refused.
//   - What a caller may run travels on the command (Rights), set by the
//     transport: REST from the token's scopes, NATS from the caller's
//     (Caller.Rights: a client user's scopes; PAL's own account may do
//     all), the CLI AllRights (its NATS credentials bound it). The Client
//     checks them, so one rule holds on every path: a deployed workflow
//     needs RightStart, a definition (an inline start, a plain-LLM start,
//     a fork with another workflow, a deploy) also RightDeploy. The zero
//     value may do nothing. A refusal is a *ForbiddenError, and nothing
//     is written or deployed.
//   - With WithLimiter, every command spends one of its caller's starts
//     (start, fork, retry) or commands (the others) before anything is
//     read: over the rate it is refused (*limit.Error, code rate_limited)
//     whichever door it came in by. The caller is the identity the
//     transport authenticated (WithCaller), else the one the command
//     journals.
//   - Replies go only under "_INBOX." or a configured prefix
//     (Client.CheckReply); a command naming any other reply subject is
//     refused whole and nothing is published there.
//   - A start, a fork and a retry build run_created with
//     engine.RunCreated: the effective budget, anomaly rules and the prices
//     of the workflow's models (from the client's table, WithPrices:
//     the process's, PAL_PRICES) are decided there, once, and journaled.
//     The run is put in PAL_INFLIGHT just before (eventstore.MarkInflight),
//     as a worker puts a child run. A start's labels are checked
//     (event.CheckLabels) before anything is written; a fork or retry
//     carries its source's. So is a start's thread (event.ValidateThreadID),
//     which a fork, retry or child does not carry; Client.Thread reads a
//     thread back (GET /v1/threads/{id}, pal thread get).
//   - ParseRunFilter is the one reading of a listing's filters: GET
//     /v1/runs's query, and pal run list's flags made into that query.
//   - RunView renders a run the same from the journal (ViewOf) and from
//     the Postgres projection (ViewOfDetail): both go through
//     readmodel.RowsOf-shaped rows and one render function.
//
// This package does not drive runs; package workers does, and nothing
// here imports it. See docs/architecture.md.
package runs
