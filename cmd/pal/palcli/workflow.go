package palcli

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/palrun/pal/runs"
)

// pal workflow deploy|list|get: the registry of deployed workflows
// (PAL_WORKFLOWS), through runs.Client as every transport goes. The CLI
// acts as itself (runs.AllRights): what it may do is what its NATS
// credentials let it write, and the client role cannot write the
// registry.

func (e *env) workflowCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "workflow",
		Short: "Deploy and inspect workflows",
		Long: `A run starts a deployed workflow by name: pal run start NAME (its latest
version) or NAME@VERSION. Deploying new content makes the next version;
deploying the latest version's content again changes nothing. A run keeps
the version it started with, however often the workflow is deployed again.`,
	}
	cmd.AddCommand(e.workflowDeployCmd(), e.workflowListCmd(), e.workflowGetCmd())
	return cmd
}

func (e *env) workflowDeployCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "deploy FILE [--json]",
		Short: "Deploy a workflow; prints NAME@VERSION",
		Long: `pal workflow deploy validates the workflow in FILE ('-' for stdin) and
deploys it under its name: the next version when its content is new, the
latest version when it is the same. It prints NAME@VERSION, and on stderr
whether the version is new; with --json {"name","version","sha256"}, as
PUT /v1/workflows/{name} answers.

Exit codes: 0 deployed, 2 invalid workflow or refused, 4 NATS unreachable.`,
		Args: cobra.ExactArgs(1),
		RunE: e.jsonErrors(e.withSettings(e.workflowDeploy)),
	}
	addJSONFlag(cmd, `print {"name","version","sha256"} instead of NAME@VERSION`)
	return cmd
}

func (e *env) workflowDeploy(cmd *cobra.Command, args []string, s *settings) error {
	var (
		def []byte
		err error
	)
	if args[0] == "-" {
		def, err = readArg("-", cmd.InOrStdin())
	} else {
		def, err = readFileLimited(args[0])
	}
	if err != nil {
		return badInput("reading workflow: %v", err)
	}
	client, closeNC, err := e.connectClient(cmd.Context(), s)
	if err != nil {
		return err
	}
	defer closeNC()
	res, err := client.Deploy(cmd.Context(), runs.DeployCommand{Workflow: def, By: "pal-cli", Rights: runs.AllRights})
	if err != nil {
		return err
	}
	if jsonFlag(cmd) {
		return printJSON(e.stdout, res)
	}
	fmt.Fprintln(e.stdout, res.Ref())
	if res.Created {
		fmt.Fprintf(e.stderr, "pal: deployed %s (sha256 %.12s)\n", res.Ref(), res.SHA256)
	} else {
		fmt.Fprintf(e.stderr, "pal: %s is unchanged: the latest version has this content\n", res.Ref())
	}
	return nil
}

func (e *env) workflowListCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "list [--json]",
		Short: "List the deployed workflows, each at its latest version",
		Args:  cobra.NoArgs,
		RunE:  e.jsonErrors(e.withSettings(e.workflowList)),
	}
	addJSONFlag(cmd, "print the list as GET /v1/workflows answers it")
	return cmd
}

func (e *env) workflowList(cmd *cobra.Command, _ []string, s *settings) error {
	client, closeNC, err := e.connectClient(cmd.Context(), s)
	if err != nil {
		return err
	}
	defer closeNC()
	list, err := client.Workflows(cmd.Context())
	if err != nil {
		return err
	}
	if jsonFlag(cmd) {
		return printJSON(e.stdout, list)
	}
	if len(list.Workflows) == 0 {
		fmt.Fprintln(e.stderr, "pal: no workflow is deployed (pal workflow deploy FILE)")
		return nil
	}
	width := len("NAME")
	for _, w := range list.Workflows {
		width = max(width, len(w.Name))
	}
	fmt.Fprintf(e.stdout, "%-*s  %7s  %-12s  %-20s  %s\n", width, "NAME", "VERSION", "SHA256", "DEPLOYED", "BY")
	for _, w := range list.Workflows {
		fmt.Fprintf(e.stdout, "%-*s  %7d  %.12s  %-20s  %s\n", width, w.Name, w.Version, w.SHA256, shortTime(w.DeployedAt), w.By)
	}
	return nil
}

func (e *env) workflowGetCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "get NAME[@VERSION] [--json]",
		Short: "Show a deployed workflow's definition (the latest version, or VERSION) and its versions",
		Long: `pal workflow get prints the definition of a deployed workflow (its latest
version, or NAME@VERSION) on stdout, and its versions on stderr; with
--json the whole answer of GET /v1/workflows/{name}.

Exit codes: 0 found, 2 a bad name, 3 not deployed, 4 NATS unreachable.`,
		Args: cobra.ExactArgs(1),
		RunE: e.jsonErrors(e.withSettings(e.workflowGet)),
	}
	addJSONFlag(cmd, "print the version, its definition and the versions as one JSON object")
	return cmd
}

func (e *env) workflowGet(cmd *cobra.Command, args []string, s *settings) error {
	ref, err := runs.ParseWorkflowRef("workflow", args[0])
	if err != nil {
		return err
	}
	client, closeNC, err := e.connectClient(cmd.Context(), s)
	if err != nil {
		return err
	}
	defer closeNC()
	view, err := client.Workflow(cmd.Context(), ref)
	if err != nil {
		return err
	}
	if jsonFlag(cmd) {
		return printJSON(e.stdout, view)
	}
	fmt.Fprintf(e.stdout, "%s\n", view.Workflow)
	var vs []string
	for _, v := range view.Versions {
		vs = append(vs, fmt.Sprintf("%d (%s)", v.Version, shortTime(v.DeployedAt)))
	}
	fmt.Fprintf(e.stderr, "%s@%d sha256 %s, deployed by %s at %s; versions: %s\n", view.Name, view.Version, view.SHA256,
		view.By, view.DeployedAt, strings.Join(vs, ", "))
	return nil
}

// shortTime cuts an RFC 3339 time to the second, for tables.
func shortTime(t string) string {
	if len(t) > len("2006-01-02T15:04:05") {
		return t[:len("2006-01-02T15:04:05")]
	}
	return t
}
