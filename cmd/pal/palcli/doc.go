// Package palcli implements the pal command: pal dev, pal worker, pal run …,
// pal bench. cmd/pal/main.go only calls Main. The commands, settings and
// wire formats are in docs/architecture.md §9 and §14.
//
// Invariant: a setting is taken from its flag, else its environment
// variable, else its default, and an invalid value fails the command before
// anything is started, with a message naming the variable (only
// PAL_RECOVERY_INTERVAL falls back to its default instead, so the recovery
// sweep cannot be turned off). Every error leaves through one of the exit
// codes below.
//
// Exit codes (scripts may rely on them):
//
//	0  success
//	1  the run failed or was cancelled (pal run start --wait, pal run watch)
//	2  bad input or refused: invalid flags, workflow, run id or
//	   configuration; a conflict or held lease; credentials NATS refuses
//	3  not found: unknown run
//	4  unavailable: NATS (or Postgres) could not be reached
//	5  internal error
package palcli
