package palcli

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/palrun/pal/runs"
)

// pal schedule create|list|get|pause|resume|delete|trigger: schedules
// (PAL_SCHEDULES, docs/architecture.md §10.11), through runs.Client as
// every transport goes. The CLI acts as itself (runs.AllRights), bounded
// by its NATS credentials.

func (e *env) scheduleCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "schedule",
		Short: "Start a deployed workflow on a clock",
		Long: `A schedule starts a deployed workflow at each tick of a cron expression
(--cron, read in --tz) or of a fixed interval (--every). Every worker fires
the ticks; each tick is one run, whose id is derived from the schedule and
the tick, so a tick two workers fire, or one fires again after a crash, is
still one run. Its run_created names the schedule and the tick:
pal run list --schedule NAME lists them.`,
	}
	cmd.AddCommand(e.scheduleCreateCmd(), e.scheduleListCmd(), e.scheduleGetCmd(),
		e.scheduleNameCmd("pause", "Pause a schedule: no tick is fired until it is resumed, and none is caught up"),
		e.scheduleNameCmd("resume", "Resume a paused schedule: its next tick is the first after now"),
		e.scheduleNameCmd("delete", "Delete a schedule (the runs it started stay)"),
		e.scheduleNameCmd("trigger", "Start the schedule's workflow now (a run whose tick is now), paused or not"))
	return cmd
}

func (e *env) scheduleCreateCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use: `create NAME (--cron "0 3 * * *" [--tz Europe/Berlin] | --every 2s) --workflow NAME ` +
			`[--input JSON] [--overlap skip|allow] [--catchup none|one|all] [--json]`,
		Short: "Create a schedule",
		Long: `pal schedule create stores a schedule; the workers fire its ticks from the
first after now.

--cron is five fields (minute hour day-of-month month day-of-week) or
@hourly, @daily, @weekly, @monthly, @yearly, read in --tz (an IANA zone,
default UTC); --every is a fixed interval from 1s ("2s", "15m", "24h"),
its ticks counted from the schedule's creation. --workflow names a
deployed workflow (NAME: its latest version at each tick, or
NAME@VERSION); --input is each run's input (JSON, at most 64 KiB).

--overlap skip (default) passes over a tick while the schedule's last run
has not ended; allow starts it anyway. --catchup says what a worker does
with ticks no worker fired in time (all workers down): none fires none of
them, one (default) fires one run for them all (the latest), all fires
each, at most the latest 100.

Exit codes: 0 created, 2 a bad flag (named) or the name taken, 3 the
workflow is not deployed, 4 NATS unreachable.`,
		Args: cobra.ExactArgs(1),
		RunE: e.jsonErrors(e.withSettings(e.scheduleCreate)),
	}
	addJSONFlag(cmd, "print the schedule as POST /v1/schedules answers it")
	cmd.Flags().String("cron", "", `a cron expression: "0 3 * * *", @daily`)
	cmd.Flags().String("tz", "", "the time zone --cron is read in (IANA, e.g. Europe/Berlin; default UTC)")
	cmd.Flags().String("every", "", "a fixed interval instead of --cron: 2s, 15m, 24h")
	cmd.Flags().String("workflow", "", "the deployed workflow each tick starts: NAME or NAME@VERSION")
	cmd.Flags().String("input", "", "each run's input, JSON (default {})")
	cmd.Flags().String("overlap", runs.OverlapSkip, "skip or allow a tick while the last run has not ended")
	cmd.Flags().String("catchup", runs.CatchupOne, "ticks missed while no worker ran: none, one or all")
	return cmd
}

func (e *env) scheduleCreate(cmd *cobra.Command, args []string, s *settings) error {
	str := func(name string) string { v, _ := cmd.Flags().GetString(name); return v }
	sc := runs.ScheduleCommand{Name: args[0], Cron: str("cron"), TZ: str("tz"), Every: str("every"),
		Workflow: str("workflow"), Overlap: str("overlap"), Catchup: str("catchup"), By: "pal-cli", Rights: runs.AllRights}
	if in := str("input"); in != "" {
		if !json.Valid([]byte(in)) {
			return badInput("--input: not JSON")
		}
		sc.Input = json.RawMessage(in)
	}
	client, closeNC, err := e.connectClient(cmd.Context(), s)
	if err != nil {
		return err
	}
	defer closeNC()
	view, err := client.CreateSchedule(cmd.Context(), sc)
	if err != nil {
		return flagError(err)
	}
	if jsonFlag(cmd) {
		return printJSON(e.stdout, view)
	}
	fmt.Fprintln(e.stdout, view.Name)
	if view.Next != nil {
		fmt.Fprintf(e.stderr, "pal: schedule %s created; its first tick is %s\n", view.Name, view.Next.Format(time.RFC3339))
	}
	return nil
}

// flagError words a refused schedule's field as its flag.
func flagError(err error) error {
	if ie, ok := err.(*runs.InputError); ok && ie.Field != "" {
		return badInput("--%s: %s", ie.Field, ie.Msg)
	}
	return err
}

func (e *env) scheduleListCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "list [--json]",
		Short: "List the schedules",
		Args:  cobra.NoArgs,
		RunE:  e.jsonErrors(e.withSettings(e.scheduleList)),
	}
	addJSONFlag(cmd, "print the list as GET /v1/schedules answers it")
	return cmd
}

func (e *env) scheduleList(cmd *cobra.Command, _ []string, s *settings) error {
	client, closeNC, err := e.connectClient(cmd.Context(), s)
	if err != nil {
		return err
	}
	defer closeNC()
	list, err := client.Schedules(cmd.Context())
	if err != nil {
		return err
	}
	if jsonFlag(cmd) {
		return printJSON(e.stdout, list)
	}
	if len(list.Schedules) == 0 {
		fmt.Fprintln(e.stderr, "pal: no schedule (pal schedule create)")
		return nil
	}
	width := len("NAME")
	for _, v := range list.Schedules {
		width = max(width, len(v.Name))
	}
	fmt.Fprintf(e.stdout, "%-*s  %-22s  %-20s  %-7s  %-20s  %s\n", width, "NAME", "WHEN", "WORKFLOW", "STATE", "NEXT", "LAST RUN")
	for _, v := range list.Schedules {
		fmt.Fprintf(e.stdout, "%-*s  %-22s  %-20s  %-7s  %-20s  %s\n", width, v.Name, when(v), v.Workflow, stateOf(v), nextOf(v), orDash(v.LastRun))
	}
	return nil
}

func when(v runs.ScheduleView) string {
	if v.Every != "" {
		return "every " + v.Every
	}
	if v.TZ != "" {
		return v.Cron + " " + v.TZ
	}
	return v.Cron
}

func stateOf(v runs.ScheduleView) string {
	if v.Paused {
		return "paused"
	}
	return "active"
}

func nextOf(v runs.ScheduleView) string {
	if v.Next == nil {
		return "-"
	}
	return v.Next.UTC().Format("2006-01-02T15:04:05")
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (e *env) scheduleGetCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "get NAME",
		Short: "Show a schedule as JSON (GET /v1/schedules/{name})",
		Long:  "Exit codes: 0 found, 3 no such schedule, 4 NATS unreachable.",
		Args:  cobra.ExactArgs(1),
		RunE: e.jsonErrors(e.withSettings(func(cmd *cobra.Command, args []string, s *settings) error {
			client, closeNC, err := e.connectClient(cmd.Context(), s)
			if err != nil {
				return err
			}
			defer closeNC()
			v, err := client.GetSchedule(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			return printJSON(e.stdout, v)
		})),
	}
	addJSONFlag(cmd, "print JSON (the default)")
	return cmd
}

// scheduleNameCmd is pause, resume, delete or trigger NAME.
func (e *env) scheduleNameCmd(verb, short string) *cobra.Command {
	cmd := &cobra.Command{
		Use:   verb + " NAME [--json]",
		Short: short,
		Long:  "Exit codes: 0 done, 3 no such schedule, 4 NATS unreachable.",
		Args:  cobra.ExactArgs(1),
		RunE: e.jsonErrors(e.withSettings(func(cmd *cobra.Command, args []string, s *settings) error {
			client, closeNC, err := e.connectClient(cmd.Context(), s)
			if err != nil {
				return err
			}
			defer closeNC()
			nc := runs.ScheduleNameCommand{Name: args[0], By: "pal-cli", Rights: runs.AllRights}
			var out any
			switch verb {
			case "pause":
				out, err = client.PauseSchedule(cmd.Context(), nc)
			case "resume":
				out, err = client.ResumeSchedule(cmd.Context(), nc)
			case "delete":
				err = client.DeleteSchedule(cmd.Context(), nc)
				out = map[string]string{"deleted": args[0]}
			case "trigger":
				var res runs.TriggerResult
				res, err = client.TriggerSchedule(cmd.Context(), nc)
				if err == nil && !jsonFlag(cmd) {
					fmt.Fprintln(e.stdout, res.RunID)
					return nil
				}
				out = res
			}
			if err != nil {
				return err
			}
			if jsonFlag(cmd) {
				return printJSON(e.stdout, out)
			}
			fmt.Fprintf(e.stderr, "pal: schedule %s: %sd\n", args[0], trimE(verb))
			return nil
		})),
	}
	addJSONFlag(cmd, "print the answer of the REST route as JSON")
	return cmd
}

// trimE makes "pause" "paus", so that +"d" is its past tense.
func trimE(verb string) string {
	if verb[len(verb)-1] == 'e' {
		return verb[:len(verb)-1]
	}
	return verb
}
