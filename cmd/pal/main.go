// Command pal is PAL's single binary: pal dev, pal worker, pal run …
//
// main owns only the signal context (SIGINT and SIGTERM cancel it, so every
// component stops through its ctx) and the exit code; every command lives
// in cmd/pal/palcli (docs/architecture.md §9.5). First, the binary may be
// one of a process step's sandbox processes (sandbox.Init).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/palrun/pal/cmd/pal/palcli"
	"github.com/palrun/pal/internal/sandbox"
)

func main() {
	sandbox.Init()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := palcli.Main(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}
