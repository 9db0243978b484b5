// Package cli implements the pal command: pal dev, pal worker, pal run …,
// pal bench. cmd/pal/main.go only calls Main.
//
// Exit codes (scripts may rely on them):
//
//	0  success
//	1  the run failed or was cancelled (pal run start --wait, pal run watch)
//	2  bad input: invalid flags, workflow, run id or configuration
//	3  not found: unknown run
//	4  unavailable: NATS (or Postgres) could not be reached
//	5  internal error
package cli
