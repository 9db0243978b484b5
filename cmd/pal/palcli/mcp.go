package palcli

import (
	"errors"
	"io"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/palrun/pal/api"
)

func (e *env) mcpCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Serve PAL over MCP on stdio",
		Long: `pal mcp serves PAL as an MCP server (the Model Context Protocol) on its
standard input and output, for an MCP client that starts it (a desktop
assistant, an agent framework). Its tools start and steer durable runs
through the front door, as the CLI's run commands do:

  start_run       start a run of a deployed workflow (name or name@version)
  get_run         a run: status, output or error, steps
  list_approvals  the approval steps that wait, in the runs in flight
  approve         decide one: decision approve (default) or reject
  signal          send a signal to a run
  cancel_run      cancel a run

It connects to NATS as the other commands do (PAL_NATS_URL, PAL_NATS_CREDS,
or pal dev's dev.env) and acts as itself: its NATS credentials bound what
it may do, and --as names it in the journal (approver, starter, canceller).
Logs go to stderr; stdout carries MCP only. The same tools are served on
streamable HTTP at POST /mcp of the API address (pal server, pal dev),
with the REST tokens and their scopes.`,
		Args: cobra.NoArgs,
		RunE: e.withSettings(func(cmd *cobra.Command, _ []string, s *settings) error {
			as, _ := cmd.Flags().GetString("as")
			if as == "" {
				return badInput("--as: a name is required")
			}
			client, closeNC, err := e.connectClient(cmd.Context(), s)
			if err != nil {
				return err
			}
			defer closeNC()
			srv := api.NewMCPServer(client, api.MCPCaller{Name: as, Scopes: api.DefaultScopes})
			err = srv.Run(cmd.Context(), &mcp.StdioTransport{})
			if err == nil || errors.Is(err, io.EOF) || cmd.Context().Err() != nil {
				return nil // the client closed the connection, or a signal
			}
			return err
		}),
	}
	cmd.Flags().String("as", "pal-mcp", "the name the MCP client acts as in the journal")
	return cmd
}
