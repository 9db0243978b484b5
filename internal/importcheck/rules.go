package main

// The import rule of PAL. Paths are relative to the module; "x/..." stands
// for x and every package under it.

// layers lists PAL's packages from the top layer down. A package may import
// packages of its own layer and of the layers below, never above.
var layers = [][]string{
	{"cmd/...", "examples/..."},
	{"internal/cli"},
	{"api", "runs", "workers", "projections", "internal/bench", "internal/paltest"},
	{"engine", "workflow", "eventstore", "receipt", "provider/...", "connector/...", "internal/testenv", "internal/natsauth"},
	{"event", "schemas", "proto/...", "internal/pgcluster", "internal/importcheck", "internal/retry", "internal/registry", "internal/egress", "internal/redact", "internal/telemetry", "internal/natsraft/...", "api/ui"},
	// sdk is linked into the programs PAL runs as process steps: it
	// imports nothing of PAL.
	{"sdk"},
}

// testOnly packages set up tests. Only test files, and other test-only
// packages, import them.
var testOnly = []string{"internal/testenv", "internal/paltest"}

// bans are dependencies that the layers allow but PAL does not. They are
// checked over the whole dependency graph, not just direct imports: runs is
// the front door every command goes through, and it must not need the drive.
var bans = []ban{
	{from: "api", to: "workers"},
	{from: "runs", to: "workers"},
}

// fileRules limit which files of a package may import another package.
// In internal/cli only the commands that run a worker process (pal worker,
// pal dev) import workers.
var fileRules = []fileRule{
	{pkg: "internal/cli", to: "workers", files: []string{"worker.go", "dev.go"}},
}
