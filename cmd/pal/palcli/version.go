package palcli

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"

	"github.com/palrun/pal/runs"
)

func (e *env) versionCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "version",
		Short: "Print pal's version, commit and Go version",
		Long: `pal version prints the module version ("(devel)" for a build from a
checkout), the commit and its time when the build recorded them, and the Go
version it was built with.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			v := buildVersion()
			if jsonFlag(cmd) {
				return printJSON(e.stdout, v)
			}
			fmt.Fprintf(e.stdout, "pal %s", v.Version)
			if v.Revision != "" {
				fmt.Fprintf(e.stdout, " commit %s", v.Revision)
				if v.Modified {
					fmt.Fprint(e.stdout, " (modified)")
				}
			}
			if v.Time != "" {
				fmt.Fprintf(e.stdout, " of %s", v.Time)
			}
			fmt.Fprintf(e.stdout, ", %s\n", v.Go)
			return nil
		},
	}
	addJSONFlag(cmd, "print the version as JSON")
	return cmd
}

// versionInfo is what pal version prints.
type versionInfo struct {
	Version  string `json:"version"`
	Revision string `json:"revision,omitempty"`
	Time     string `json:"time,omitempty"`
	Modified bool   `json:"modified,omitempty"`
	Go       string `json:"go"`
}

// buildVersion reads the version the Go toolchain stamped into the binary.
func buildVersion() versionInfo {
	v := versionInfo{Version: "(devel)", Go: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	if bi.Main.Version != "" {
		v.Version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.time":
			v.Time = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	return v
}

func (e *env) runIDCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "id --key KEY",
		Short: "Print the run id a start with this idempotency key gets",
		Long: `pal run id prints the id of the run that a start with idempotency key KEY
creates (or created): "run_k" and the hex of the first 13 bytes of
SHA-256("start|" + KEY). It needs no connection. A durable start (a client
user's on pal.cmd.runs.start.<user>) takes its key from the body's
idempotency_key, else from the Nats-Msg-Id header, so:

  nats pub pal.cmd.runs.start.client -H Nats-Msg-Id:order-42 …
  pal run get $(pal run id --key order-42)

A start with an explicit run_id keeps that id instead.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			key, _ := cmd.Flags().GetString("key")
			if key == "" {
				return badInput("--key is empty")
			}
			fmt.Fprintln(e.stdout, runs.RunIDForKey(key))
			return nil
		},
	}
	cmd.Flags().String("key", "", "the start's idempotency key (idempotency_key, Nats-Msg-Id or Idempotency-Key)")
	_ = cmd.MarkFlagRequired("key")
	return cmd
}
