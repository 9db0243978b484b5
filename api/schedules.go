package api

import (
	"context"
	"net/http"
	"reflect"

	"github.com/palrun/pal/runs"
)

// Schedules over REST: POST /v1/schedules creates (scope deploy: a
// schedule starts runs for as long as it lives), GET /v1/schedules and
// GET /v1/schedules/{name} read (read), DELETE /v1/schedules/{name} and
// POST /v1/schedules/{name}/pause and /resume change (deploy), POST
// /v1/schedules/{name}/trigger starts a run now (start). runs.Client does
// the work, as it does for pal.api.schedules.* and pal schedule
// (docs/architecture.md §10.11).

// createScheduleRoute is POST /v1/schedules: the body is a
// runs.ScheduleCommand; 201 with the schedule.
var createScheduleRoute = handling{body: reflect.TypeFor[runs.ScheduleCommand](), serve: func(h *handler, w http.ResponseWriter, r *http.Request) {
	body, _, err := readBody(w, r)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	var c runs.ScheduleCommand
	if err := runs.DecodeStrict(body, &c); err != nil {
		h.fail(w, r, err)
		return
	}
	ctx, cancel := requestContext(r)
	defer cancel()
	c.By, c.Rights = identity(ctx), rightsOf(ctx)
	v, err := h.client.CreateSchedule(ctx, c)
	if err != nil {
		h.fail(w, r, asToken(ctx, err))
		return
	}
	w.Header().Set("Location", "/v1/schedules/"+v.Name)
	writeJSON(w, http.StatusCreated, v)
}}

// GET /v1/schedules: every schedule, by name.
func (h *handler) listSchedules(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := requestContext(r)
	defer cancel()
	list, err := h.client.Schedules(ctx)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, list)
}

// GET /v1/schedules/{name}: one schedule (runs.ScheduleView).
func (h *handler) getSchedule(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := requestContext(r)
	defer cancel()
	v, err := h.client.GetSchedule(ctx, r.PathValue("name"))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// scheduleAct is the handler of a route on the path's schedule: act's
// answer is written with status.
func scheduleAct(status int, act func(ctx context.Context, h *handler, c runs.ScheduleNameCommand) (any, error)) handling {
	return plain(func(h *handler, w http.ResponseWriter, r *http.Request) {
		ctx, cancel := requestContext(r)
		defer cancel()
		out, err := act(ctx, h, runs.ScheduleNameCommand{Name: r.PathValue("name"), By: identity(ctx), Rights: rightsOf(ctx)})
		if err != nil {
			h.fail(w, r, asToken(ctx, err))
			return
		}
		writeJSON(w, status, out)
	})
}

// DeletedAnswer answers DELETE /v1/schedules/{name}.
type DeletedAnswer struct {
	Deleted string `json:"deleted"`
}

var (
	deleteScheduleRoute = scheduleAct(http.StatusOK, func(ctx context.Context, h *handler, c runs.ScheduleNameCommand) (any, error) {
		return DeletedAnswer{Deleted: c.Name}, h.client.DeleteSchedule(ctx, c)
	})
	pauseScheduleRoute = scheduleAct(http.StatusOK, func(ctx context.Context, h *handler, c runs.ScheduleNameCommand) (any, error) {
		return h.client.PauseSchedule(ctx, c)
	})
	resumeScheduleRoute = scheduleAct(http.StatusOK, func(ctx context.Context, h *handler, c runs.ScheduleNameCommand) (any, error) {
		return h.client.ResumeSchedule(ctx, c)
	})
	triggerScheduleRoute = scheduleAct(http.StatusCreated, func(ctx context.Context, h *handler, c runs.ScheduleNameCommand) (any, error) {
		return h.client.TriggerSchedule(ctx, c)
	})
)
