// Command natsnode is nats-server with PAL's raft timing (natsraft.Fast):
// it takes nats-server's flags and config files unchanged. The test
// clusters (testenv.NATSClusterProcesses with FastRaft) run it to measure
// failover on PAL's timing beside stock nats-server.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/palrun/pal/internal/natsraft"
)

func main() {
	if err := natsraft.Set(natsraft.Fast); err != nil {
		server.PrintAndDie(err.Error())
	}
	fs := flag.NewFlagSet("natsnode", flag.ExitOnError)
	opts, err := server.ConfigureOptions(fs, os.Args[1:], server.PrintServerAndExit, fs.Usage, server.PrintTLSHelpAndDie)
	if err != nil {
		server.PrintAndDie(fmt.Sprintf("natsnode: %s", err))
	}
	s, err := server.NewServer(opts)
	if err != nil {
		server.PrintAndDie(fmt.Sprintf("natsnode: %s", err))
	}
	s.ConfigureLogger()
	if err := server.Run(s); err != nil {
		server.PrintAndDie(err.Error())
	}
	s.WaitForShutdown()
}
