package main

// The import rule of PAL. Paths are relative to the module; "x/..." stands
// for x and every package under it.

// layers lists PAL's packages from the top layer down. A package may import
// packages of its own layer and of the layers below, never above.
var layers = [][]string{
	// The binary's main and the developer tools (internal/cmd/...).
	{"cmd/pal", "examples/...", "internal/cmd/..."},
	// The pal commands: settings, composition, exit codes.
	{"cmd/pal/palcli"},
	// What drives runs and answers for them, and the kits that compose it.
	{"api", "runs", "workers", "projections", "cmd/pal/palbench", "paltest"},
	// The core: the pure engine, workflows, the read model's rows, the
	// event store and its NATS roles, and the seams to the outside.
	{"engine", "workflow", "readmodel", "eventstore", "eventstore/natsauth", "receipt", "provider/...", "connector/...", "paltest/testenv"},
	// The vocabulary and ground-floor machinery.
	{"event", "schemas", "proto/...", "internal/pgcluster", "internal/retry", "internal/service", "internal/registry", "internal/egress", "internal/redact", "internal/telemetry", "internal/natsraft", "internal/sandbox", "internal/limit", "api/ui"},
	// sdk is linked into the programs PAL runs as process steps: it
	// imports nothing of PAL. sdk/python is the Python SDK, whose Go
	// package only holds its test (in test files, which may import
	// anything).
	{"sdk/..."},
}

// testOnly packages set up tests. Only test files, and other test-only
// packages, import them.
var testOnly = []string{"paltest/testenv", "paltest"}

// bans are dependencies that the layers allow but PAL does not. They are
// checked over the whole dependency graph, not just direct imports: runs is
// the front door every command goes through, and it must not need the drive.
var bans = []ban{
	{from: "api", to: "workers"},
	{from: "runs", to: "workers"},
}

// fileRules limit which files of a package may import another package.
// In cmd/pal/palcli only the commands that run a worker process (pal worker,
// pal dev) import workers.
var fileRules = []fileRule{
	{pkg: "cmd/pal/palcli", to: "workers", files: []string{"worker.go", "dev.go"}},
}
