package palcli

import (
	"fmt"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/palrun/pal/event"
)

func (e *env) threadCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "thread",
		Short: "Inspect threads: conversations that runs continue",
	}
	cmd.AddCommand(e.threadGetCmd())
	return cmd
}

func (e *env) threadGetCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "get THREAD_ID [--json]",
		Short: "Show a thread's conversation: its turns, oldest first",
		Long: `pal thread get shows a thread (pal run start --thread ID): one line per
turn, oldest first, with the record's seq, the run and step that wrote it,
its role and its content; then the steps holding the thread now (a run's
thread step holds it from its first model call until its turns are in,
and a thread step of another run waits meanwhile). It reads the thread's
journal on NATS (PAL_THREADS), verified like a run's.

--json prints one JSON object, the same as GET /v1/threads/{id}:
{"thread","seq","bytes","turns":[{"seq","run_id","step_id","role","content"}],"holds":[…]}.

Exit codes: 0 found, 2 bad thread id, 3 unknown thread, 4 NATS unreachable.`,
		Args: cobra.ExactArgs(1),
		RunE: e.jsonErrors(e.withSettings(e.threadGet)),
	}
	addJSONFlag(cmd, "print the thread as one JSON object")
	return cmd
}

func (e *env) threadGet(cmd *cobra.Command, args []string, s *settings) error {
	ctx := cmd.Context()
	if err := event.ValidateThreadID(args[0]); err != nil {
		return withCode(ExitBadInput, err)
	}
	client, closeNC, err := e.connectClient(ctx, s)
	if err != nil {
		return err
	}
	defer closeNC()
	v, err := client.Thread(ctx, args[0])
	if err != nil {
		return err
	}
	if jsonFlag(cmd) {
		return printJSON(e.stdout, v)
	}
	fmt.Fprintf(e.stdout, "thread %s: %d turns, %d bytes\n", v.Thread, len(v.Turns), v.Bytes)
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tRUN ID\tSTEP\tROLE\tCONTENT")
	for _, t := range v.Turns {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\n", t.Seq, t.RunID, t.StepID, t.Role, strings.ReplaceAll(t.Content, "\n", " "))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, h := range v.Holds {
		fmt.Fprintf(e.stdout, "held by run %s, step %s (since seq %d)\n", h.RunID, h.StepID, h.Seq)
	}
	return nil
}
