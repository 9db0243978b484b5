// Package palcli implements the pal command: pal dev, pal worker, pal run …,
// pal bench. cmd/pal/main.go only calls Main. The commands, settings and
// wire formats are in docs/architecture.md §9 and §14.
//
// Invariants:
//
//   - A setting is taken from its flag, else its environment variable,
//     else its default, and an invalid value fails the command before
//     anything is started, with a message naming the variable (only
//     PAL_RECOVERY_INTERVAL falls back to its default instead, so the
//     recovery sweep cannot be turned off).
//   - A command that connects to NATS parses the settings every part of
//     the process shares once (settings: NATS, the log, PAL_ANOMALY_*,
//     PAL_REPLY_PREFIX, PAL_NATS_USERS, PAL_LIMIT_*; and it loads
//     PAL_PRICES over the process's price table, which the runs it
//     creates journal their models' prices from) and passes them down.
//     Every runs.Client of the process is built from them in one place
//     (settings.client): a one-shot pal run command's, pal server's REST
//     API and NATS service's, a worker's command processor's, so a command
//     journals the same rules, and spends its caller's limits in the one
//     limiter of the process, whichever door it came in by.
//   - A long-running command (pal dev, pal worker, pal server, pal
//     projector) starts its parts in order on one service.Stack and stops
//     them in reverse, when it ends and as soon as one fails to start: a
//     process that cannot come up leaves nothing running.
//   - Every error leaves through one of the exit codes below.
//
// Exit codes (scripts may rely on them):
//
//	0  success
//	1  the run failed or was cancelled (pal run start --wait, pal run watch)
//	2  bad input or refused: invalid flags, workflow, run id or
//	   configuration; a conflict or held lease; credentials NATS refuses
//	3  not found: unknown run
//	4  unavailable: NATS (or Postgres) could not be reached
//	5  internal error, or a command interrupted
//	130  interrupted while it followed a run (pal run start --wait, pal
//	   run watch): the run goes on
package palcli
