package palcli

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/palrun/pal/eventstore"
)

func (e *env) workersCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "workers [--json]",
		Short: "List the live workers and what each can do: queues, Go tools, MCP servers, programs",
		Long: `pal workers lists the workers whose presence entry is in PAL_LEASES and
that answer on their presence subject now (a worker killed a moment ago
is left out), each with what it announced: the work queues it takes runs
from, the Go tools registered on it, its MCP servers and the programs its
process steps may start (none listed: any). --json prints one object per
worker.

Exit codes: 0 listed (also when there is none), 4 NATS unreachable.`,
		Args: cobra.NoArgs,
		RunE: e.jsonErrors(e.withSettings(e.workersList)),
	}
	addJSONFlag(cmd, "print the workers as a JSON array")
	return cmd
}

// workerEntry is one line of pal workers.
type workerEntry struct {
	WorkerID string    `json:"worker_id"`
	Owner    string    `json:"owner"`
	Queues   []string  `json:"queues"`
	Tools    []string  `json:"tools"`
	MCP      []string  `json:"mcp"`
	Programs []string  `json:"programs"`
	Started  time.Time `json:"started,omitzero"`
}

// presenceProbeWait is how long pal workers waits for a worker to answer
// on its presence subject; a closed connection is answered at once.
const presenceProbeWait = 2 * time.Second

func (e *env) workersList(cmd *cobra.Command, _ []string, s *settings) error {
	client, closeNC, err := e.connectClient(cmd.Context(), s)
	if err != nil {
		return err
	}
	defer closeNC()
	js := client.Store().JetStream()
	leases, err := eventstore.OpenLeases(cmd.Context(), js, 0)
	if err != nil {
		return withCode(ExitUnavailable, err)
	}
	all, err := leases.Workers(cmd.Context())
	if err != nil {
		return withCode(ExitUnavailable, err)
	}
	live := make([]bool, len(all))
	var wg sync.WaitGroup
	for i, p := range all {
		wg.Go(func() { live[i] = answers(cmd.Context(), js.Conn(), p.Owner) })
	}
	wg.Wait()
	out := []workerEntry{}
	for i, p := range all {
		if !live[i] {
			continue
		}
		we := workerEntry{Owner: p.Owner, WorkerID: p.Owner, Queues: []string{}, Tools: []string{}, MCP: []string{}, Programs: []string{}}
		if id, _, ok := strings.Cut(p.Owner, "/"); ok {
			we.WorkerID = id
		}
		if c := p.Caps; c != nil {
			we.WorkerID, we.Started = c.WorkerID, c.Started
			we.Queues, we.Tools = orEmpty(c.Queues), orEmpty(c.Tools)
			we.MCP, we.Programs = orEmpty(c.MCP), orEmpty(c.Programs)
		}
		out = append(out, we)
	}
	slices.SortFunc(out, func(a, b workerEntry) int { return strings.Compare(a.WorkerID, b.WorkerID) })
	if jsonFlag(cmd) {
		return printJSON(e.stdout, out)
	}
	if len(out) == 0 {
		fmt.Fprintln(e.stderr, "pal: no worker is running (pal worker, or pal dev)")
		return nil
	}
	width := len("WORKER")
	for _, w := range out {
		width = max(width, len(w.WorkerID))
	}
	fmt.Fprintf(e.stdout, "%-*s  %-20s  %-20s  %-16s  %s\n", width, "WORKER", "QUEUES", "TOOLS", "MCP", "PROGRAMS")
	for _, w := range out {
		fmt.Fprintf(e.stdout, "%-*s  %-20s  %-20s  %-16s  %s\n", width, w.WorkerID, list(w.Queues), list(w.Tools), list(w.MCP), listOr(w.Programs, "any"))
	}
	return nil
}

// answers reports whether the worker owner answers on its presence
// subject: a closed connection gets "no responders" at once.
func answers(ctx context.Context, nc *nats.Conn, owner string) bool {
	ctx, cancel := context.WithTimeout(ctx, presenceProbeWait)
	defer cancel()
	_, err := nc.RequestWithContext(ctx, eventstore.PresenceSubject(owner), nil)
	return err == nil || !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, context.DeadlineExceeded)
}

func orEmpty(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

func list(s []string) string { return listOr(s, "-") }

func listOr(s []string, none string) string {
	if len(s) == 0 {
		return none
	}
	return strings.Join(s, ",")
}
