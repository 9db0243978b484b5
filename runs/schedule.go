package runs

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
	_ "time/tzdata" // a schedule's tz resolves without the host's zoneinfo

	"github.com/robfig/cron/v3"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/eventstore"
)

// Schedule commands (pal_commands_refused_total's command label).
const (
	CmdSchedule = "schedule"
	CmdTrigger  = "trigger"
)

// A schedule's settings (docs/architecture.md §10.11).
const (
	OverlapSkip  = "skip"
	OverlapAllow = "allow"
	CatchupNone  = "none"
	CatchupOne   = "one"
	CatchupAll   = "all"

	// MaxCatchup bounds --catchup all: after downtime at most this many
	// missed ticks are fired (the latest of them), the rest are passed
	// over.
	MaxCatchup = 100
	// MinEvery and MaxEvery bound --every.
	MinEvery = time.Second
	MaxEvery = 366 * 24 * time.Hour
	// catchupGrace is how late a tick may be fired under --catchup none:
	// at most this, and at most half the time to the tick after it.
	catchupGrace = 5 * time.Second
	// maxCronSteps bounds the ticks a cron schedule's catch-up walks
	// (a year of minutes is 525,600): a walk that reaches it fires the
	// latest tick it got to, not the one it did not.
	maxCronSteps = 1 << 20
	maxTZLen     = 64
	maxSpecLen   = 256
)

// ScheduleCommand creates a schedule (POST /v1/schedules, pal.api.schedules.create,
// pal schedule create). Exactly one of Cron and Every.
type ScheduleCommand struct {
	Name string `json:"name"`
	// Cron is a standard five-field cron expression (minute hour
	// day-of-month month day-of-week) or a descriptor (@hourly, @daily,
	// @weekly, @monthly, @yearly), read in TZ (an IANA zone; default
	// UTC).
	Cron string `json:"cron,omitempty"`
	TZ   string `json:"tz,omitempty"`
	// Every is a fixed interval, a Go duration between MinEvery and
	// MaxEvery ("2s", "15m").
	Every string `json:"every,omitempty"`
	// Workflow names a deployed workflow: NAME (its latest version when
	// each tick fires) or NAME@VERSION.
	Workflow string `json:"workflow"`
	// Input is each run's input (JSON, at most eventstore.MaxScheduleInput
	// bytes; {} when empty).
	Input json.RawMessage `json:"input,omitempty"`
	// Overlap is skip (default: a tick is passed over while the
	// schedule's last run has not ended) or allow.
	Overlap string `json:"overlap,omitempty"`
	// Catchup is none, one (default) or all: what a worker does with the
	// ticks no worker fired in time (§10.11).
	Catchup string `json:"catchup,omitempty"`

	// By names who creates it; Rights is what the caller may do
	// (RightDeploy: a schedule starts runs for as long as it lives).
	By     string `json:"-"`
	Rights Rights `json:"-"`
}

// ScheduleNameCommand names a schedule: get, pause, resume, delete,
// trigger.
type ScheduleNameCommand struct {
	Name string `json:"name"`
	// By and Rights as ScheduleCommand's: pause, resume and delete need
	// RightDeploy, trigger RightStart.
	By     string `json:"-"`
	Rights Rights `json:"-"`
}

// ScheduleView is a schedule as the front door shows it: what is stored
// (eventstore.Schedule) and its next tick (absent while paused).
type ScheduleView struct {
	eventstore.Schedule
	Next *time.Time `json:"next,omitempty"`
}

// ScheduleList answers a listing.
type ScheduleList struct {
	Schedules []ScheduleView `json:"schedules"`
}

// TriggerResult answers a trigger: the run it started and its tick.
type TriggerResult struct {
	RunID string    `json:"run_id"`
	Tick  time.Time `json:"tick"`
}

// clock is when a schedule's ticks are due.
type clock struct {
	cron   cron.Schedule
	every  time.Duration
	anchor time.Time
}

var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// parseClock reads a schedule's cron (in tz) or every; the errors name
// the field.
func parseClock(cronSpec, tz, every string, anchor time.Time) (clock, error) {
	switch {
	case cronSpec == "" && every == "":
		return clock{}, &InputError{Field: "cron", Msg: "a schedule needs cron or every"}
	case cronSpec != "" && every != "":
		return clock{}, &InputError{Field: "every", Msg: "give cron or every, not both"}
	case every != "":
		if tz != "" {
			return clock{}, &InputError{Field: "tz", Msg: "tz reads a cron expression; every is a plain interval"}
		}
		d, err := time.ParseDuration(every)
		if err != nil || len(every) > maxSpecLen {
			return clock{}, &InputError{Field: "every", Msg: fmt.Sprintf("%q is not a duration (want e.g. 2s, 15m, 24h)", truncate(every, 40))}
		}
		if d < MinEvery || d > MaxEvery {
			return clock{}, &InputError{Field: "every", Msg: fmt.Sprintf("%s is out of range (%s to %s)", d, MinEvery, MaxEvery)}
		}
		return clock{every: d, anchor: anchor}, nil
	}
	if len(cronSpec) > maxSpecLen {
		return clock{}, &InputError{Field: "cron", Msg: fmt.Sprintf("%d bytes; the limit is %d", len(cronSpec), maxSpecLen)}
	}
	if strings.HasPrefix(cronSpec, "@every") || strings.Contains(cronSpec, "TZ=") {
		return clock{}, &InputError{Field: "cron", Msg: "use every for an interval and tz for a time zone"}
	}
	loc := time.UTC
	if tz != "" {
		var err error
		if len(tz) > maxTZLen || tz == "Local" {
			err = errors.New("not an IANA zone")
		} else {
			loc, err = time.LoadLocation(tz)
		}
		if err != nil {
			return clock{}, &InputError{Field: "tz", Msg: fmt.Sprintf("%q is not a time zone (want an IANA name such as Europe/Berlin)", truncate(tz, 40))}
		}
	}
	sch, err := cronParser.Parse(cronSpec)
	if err != nil {
		return clock{}, &InputError{Field: "cron", Msg: fmt.Sprintf("%q: %v (want five fields: minute hour day-of-month month day-of-week, or @daily…)", truncate(cronSpec, 80), err)}
	}
	spec, ok := sch.(*cron.SpecSchedule)
	if !ok {
		return clock{}, &InputError{Field: "cron", Msg: "use every for an interval"}
	}
	spec.Location = loc
	return clock{cron: spec}, nil
}

func clockOf(sc eventstore.Schedule) (clock, error) {
	return parseClock(sc.Cron, sc.TZ, sc.Every, sc.Created)
}

// next is the first tick after t.
func (k clock) next(t time.Time) time.Time {
	if k.cron != nil {
		return k.cron.Next(t).UTC()
	}
	if t.Before(k.anchor) {
		return k.anchor.Add(k.every)
	}
	n := t.Sub(k.anchor) / k.every
	return k.anchor.Add((n + 1) * k.every)
}

// due returns the ticks in (after, now], ascending: the latest max of
// them.
func (k clock) due(after, now time.Time, max int) []time.Time {
	if k.cron == nil {
		// An interval's ticks are arithmetic: start max ticks before now.
		if from := now.Add(-time.Duration(max+1) * k.every); from.After(after) {
			after = from
		}
	}
	var out []time.Time
	for t, steps := k.next(after), 0; !t.After(now) && steps < maxCronSteps; t, steps = k.next(t), steps+1 {
		if len(out) == max {
			out = append(out[:0], out[1:]...)
		}
		out = append(out, t)
	}
	return out
}

// CreateSchedule checks a schedule and stores it in PAL_SCHEDULES; its
// first tick is the first after now.
//
// Errors: *ForbiddenError without RightDeploy; *InputError naming the
// field (name, cron, tz, every, workflow, input, overlap, catchup);
// ErrWorkflowNotFound for a workflow not deployed; ErrScheduleExists.
func (c *Client) CreateSchedule(ctx context.Context, cmd ScheduleCommand) (_ ScheduleView, err error) {
	defer observeRefusal(CmdSchedule, &err)
	if err := need(cmd.Rights, RightDeploy, "schedule", "creating a schedule (it starts runs for as long as it lives)"); err != nil {
		return ScheduleView{}, err
	}
	if err := event.ValidateWorkflowName(cmd.Name); err != nil {
		return ScheduleView{}, &InputError{Field: "name", Msg: strings.Replace(err.Error(), "workflow name", "schedule name", 1), Err: err}
	}
	now := time.Now().UTC().Truncate(time.Second)
	if _, err := parseClock(cmd.Cron, cmd.TZ, cmd.Every, now); err != nil {
		return ScheduleView{}, err
	}
	if cmd.Overlap == "" {
		cmd.Overlap = OverlapSkip
	}
	if cmd.Overlap != OverlapSkip && cmd.Overlap != OverlapAllow {
		return ScheduleView{}, &InputError{Field: "overlap", Msg: fmt.Sprintf("%q (want skip or allow)", truncate(cmd.Overlap, 40))}
	}
	if cmd.Catchup == "" {
		cmd.Catchup = CatchupOne
	}
	if cmd.Catchup != CatchupNone && cmd.Catchup != CatchupOne && cmd.Catchup != CatchupAll {
		return ScheduleView{}, &InputError{Field: "catchup", Msg: fmt.Sprintf("%q (want none, one or all)", truncate(cmd.Catchup, 40))}
	}
	input := bytes.TrimSpace(cmd.Input)
	if len(input) == 0 {
		input = []byte("{}")
	}
	if len(input) > eventstore.MaxScheduleInput {
		return ScheduleView{}, &InputError{Field: "input", Msg: fmt.Sprintf("%d bytes; a schedule's input is at most %d", len(input), eventstore.MaxScheduleInput)}
	}
	if !json.Valid(input) {
		return ScheduleView{}, &InputError{Field: "input", Msg: "not JSON"}
	}
	ref, err := ParseWorkflowRef("workflow", cmd.Workflow)
	if err != nil {
		return ScheduleView{}, err
	}
	if _, _, err := c.resolve(ctx, ref); err != nil {
		return ScheduleView{}, err
	}
	by := cmd.By
	if by == "" {
		by = "pal"
	}
	sc, err := c.store.CreateSchedule(ctx, eventstore.Schedule{Name: cmd.Name, Cron: cmd.Cron, TZ: cmd.TZ, Every: cmd.Every,
		Workflow: ref.String(), Input: input, Overlap: cmd.Overlap, Catchup: cmd.Catchup, By: by, Created: now, LastTick: now})
	if err != nil {
		return ScheduleView{}, err
	}
	return viewOf(sc), nil
}

func viewOf(sc eventstore.Schedule) ScheduleView {
	v := ScheduleView{Schedule: sc}
	if k, err := clockOf(sc); err == nil && !sc.Paused {
		n := k.next(sc.LastTick)
		v.Next = &n
	}
	return v
}

// GetSchedule reads one schedule. Errors: ErrScheduleNotFound.
func (c *Client) GetSchedule(ctx context.Context, name string) (ScheduleView, error) {
	sc, err := c.store.GetSchedule(ctx, name)
	if err != nil {
		return ScheduleView{}, err
	}
	return viewOf(sc), nil
}

// Schedules lists every schedule, by name.
func (c *Client) Schedules(ctx context.Context) (*ScheduleList, error) {
	all, err := c.store.Schedules(ctx)
	if err != nil {
		return nil, err
	}
	out := &ScheduleList{Schedules: make([]ScheduleView, 0, len(all))}
	for _, sc := range all {
		out.Schedules = append(out.Schedules, viewOf(sc))
	}
	return out, nil
}

// PauseSchedule stops a schedule's ticks; a paused schedule's ticks are
// never fired, not even by a catch-up after ResumeSchedule. Pausing a
// paused schedule changes nothing.
//
// Errors: *ForbiddenError without RightDeploy; ErrScheduleNotFound.
func (c *Client) PauseSchedule(ctx context.Context, cmd ScheduleNameCommand) (ScheduleView, error) {
	return c.changeSchedule(ctx, cmd, "pausing a schedule", func(sc *eventstore.Schedule, _ time.Time) { sc.Paused = true })
}

// ResumeSchedule starts a paused schedule's ticks again from now: the
// first it fires is the first after now.
//
// Errors: *ForbiddenError without RightDeploy; ErrScheduleNotFound.
func (c *Client) ResumeSchedule(ctx context.Context, cmd ScheduleNameCommand) (ScheduleView, error) {
	return c.changeSchedule(ctx, cmd, "resuming a schedule", func(sc *eventstore.Schedule, now time.Time) {
		if sc.Paused && now.After(sc.LastTick) {
			sc.LastTick = now
		}
		sc.Paused = false
	})
}

// changeSchedule applies change to the schedule, again on a schedule a
// worker moved meanwhile.
func (c *Client) changeSchedule(ctx context.Context, cmd ScheduleNameCommand, what string, change func(*eventstore.Schedule, time.Time)) (_ ScheduleView, err error) {
	defer observeRefusal(CmdSchedule, &err)
	if err := need(cmd.Rights, RightDeploy, "name", what); err != nil {
		return ScheduleView{}, err
	}
	sc, err := c.store.GetSchedule(ctx, cmd.Name)
	for try := 0; err == nil; try++ {
		change(&sc, time.Now().UTC())
		var out eventstore.Schedule
		if out, err = c.store.UpdateSchedule(ctx, sc); err == nil {
			return viewOf(out), nil
		}
		if !errors.Is(err, eventstore.ErrScheduleChanged) || try == 10 {
			break
		}
		sc, err = c.store.GetSchedule(ctx, cmd.Name)
	}
	return ScheduleView{}, err
}

// DeleteSchedule removes a schedule; the runs it started stay.
//
// Errors: *ForbiddenError without RightDeploy; ErrScheduleNotFound.
func (c *Client) DeleteSchedule(ctx context.Context, cmd ScheduleNameCommand) (err error) {
	defer observeRefusal(CmdSchedule, &err)
	if err := need(cmd.Rights, RightDeploy, "name", "deleting a schedule"); err != nil {
		return err
	}
	return c.store.DeleteSchedule(ctx, cmd.Name)
}

// TriggerSchedule starts the schedule's workflow now, paused or not and
// whatever its overlap: a run whose tick is now (to the nanosecond), so
// its id is the schedule's too.
//
// Errors: *ForbiddenError without RightStart; ErrScheduleNotFound; those
// of Start.
func (c *Client) TriggerSchedule(ctx context.Context, cmd ScheduleNameCommand) (_ TriggerResult, err error) {
	defer observeRefusal(CmdTrigger, &err)
	if err := need(cmd.Rights, RightStart, "name", "triggering a schedule"); err != nil {
		return TriggerResult{}, err
	}
	sc, err := c.store.GetSchedule(ctx, cmd.Name)
	if err != nil {
		return TriggerResult{}, err
	}
	tick := time.Now().UTC().Truncate(time.Microsecond) // as Postgres keeps it
	by := cmd.By
	if by == "" {
		by = sc.By
	}
	id, err := c.startTick(ctx, sc, tick, by)
	if err != nil {
		return TriggerResult{}, err
	}
	c.noteRun(ctx, sc.Name, id)
	return TriggerResult{RunID: id, Tick: tick}, nil
}

// startTick starts sc's run for tick, by by. A tick whose run exists
// (another worker fired it, or this one before a crash) answers that
// run: one tick, one run (the run id is event.ScheduleRunID's, and
// run_created is appended once).
func (c *Client) startTick(ctx context.Context, sc eventstore.Schedule, tick time.Time, by string) (string, error) {
	id := event.ScheduleRunID(sc.Name, tick)
	if _, h, err := c.store.LastEvent(ctx, id); err == nil && h.Seq > 0 {
		return id, nil // fired already: no second start, no stray in-flight entry
	}
	ref, err := json.Marshal(sc.Workflow)
	if err != nil {
		return "", err
	}
	_, err = c.Start(ctx, StartCommand{Workflow: ref, Input: sc.Input, RunID: id, By: by, Rights: RightStart,
		schedule: sc.Name, tick: event.FormatTick(tick)})
	if errors.Is(err, ErrRunExists) {
		return id, nil
	}
	return id, err
}

// noteRun records runID as the schedule's last run, for overlap skip; a
// schedule gone or moved on meanwhile is left alone.
func (c *Client) noteRun(ctx context.Context, name, runID string) {
	for range 5 {
		sc, err := c.store.GetSchedule(ctx, name)
		if err != nil {
			return
		}
		sc.LastRun = runID
		if _, err := c.store.UpdateSchedule(ctx, sc); !errors.Is(err, eventstore.ErrScheduleChanged) {
			return
		}
	}
}
