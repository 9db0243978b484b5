// Command pal is PAL's single binary: pal dev, pal worker, pal run …
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/palrun/pal/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Main(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}
