package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/palrun/pal/eventstore"
	"github.com/palrun/pal/eventstore/natsauth"
	"github.com/palrun/pal/runs"
)

// ServiceName is the NATS micro service name (nats micro ls shows it).
const ServiceName = "pal"

// ServiceVersion is the service's version.
const ServiceVersion = "0.1.0"

// ServiceOption configures StartService.
type ServiceOption func(*serviceConfig)

type serviceConfig struct {
	rows RunReader
}

// WithRunReader has pal.api.runs.get answer a run whose journal retention
// removed from its rows in rr (projections.Reader), as REST's GET
// /v1/runs/{id} and gRPC GetRun do.
func WithRunReader(rr RunReader) ServiceOption {
	return func(c *serviceConfig) { c.rows = rr }
}

// getRequest is the body of pal.api.runs.get.
type getRequest struct {
	RunID string `json:"run_id"`
}

// StartService registers the NATS micro service "pal" with the endpoints
// pal.api.runs.start, .get, .approve, .cancel, .budget, .signal, .resume,
// .fork and .retry, pal.api.workflows.deploy, .get and .list, and
// pal.api.schedules.create, .get, .list, .pause, .resume, .delete and
// .trigger, on nc.
// A request acts with its caller's rights (runs.Caller.Rights): scope
// start starts deployed workflows, scope deploy definitions too. Each
// takes a JSON
// body (the same as the durable command of that name, without reply_to;
// get takes {"run_id"}) and answers JSON: {"ok":true,"run_id":…} (get
// answers the run), or {"error":…,"code":…} with the service error headers
// set (400 bad input, 403 forbidden, 404 not found, 409 conflict, 429
// rate limited, 500 internal, 503 unavailable). The caller is who the server says
// (runs.Client.Requester): a client user, with its scopes, or PAL's own
// account. The endpoint consumer answers the client account's consumer
// creates (natsauth.Guard).
// get answers a run whose journal retention removed from its rows when
// given WithRunReader, as REST's GET /v1/runs/{id} does. Stop the returned
// service to deregister it.
func StartService(ctx context.Context, nc *nats.Conn, client *runs.Client, log *slog.Logger, opts ...ServiceOption) (micro.Service, error) {
	if log == nil {
		log = slog.Default()
	}
	var cfg serviceConfig
	for _, o := range opts {
		o(&cfg)
	}
	svc, err := micro.AddService(nc, micro.Config{
		Name:        ServiceName,
		Version:     ServiceVersion,
		Description: "PAL: start, read, approve, cancel, budget, signal, resume, fork and retry durable AI-agent runs; deploy and read workflows; schedule them",
	})
	if err != nil {
		return nil, err
	}
	ctx = context.WithoutCancel(ctx)
	g := svc.AddGroup("pal.api.runs")
	do := func(kind string) micro.Handler {
		return handle(ctx, client, log, func(ctx context.Context, caller runs.Caller, req micro.Request) {
			ans, _, err := client.Do(ctx, kind, req.Data(), req.Headers().Get("Nats-Msg-Id"), caller)
			respondAnswer(req, ans, err, log)
		})
	}
	get := handle(ctx, client, log, func(rctx context.Context, caller runs.Caller, req micro.Request) {
		if err := caller.Reads("pal.api.runs.get"); err != nil {
			respondError(req, err, log)
			return
		}
		var r getRequest
		if err := runs.DecodeStrict(req.Data(), &r); err != nil {
			respondError(req, err, log)
			return
		}
		if r.RunID == "" {
			respondError(req, &runs.InputError{Field: "run_id", Msg: "required"}, log)
			return
		}
		v, err := runView(rctx, client, cfg.rows, log, r.RunID)
		if err != nil {
			respondError(req, err, log)
			return
		}
		if err := req.RespondJSON(v); errors.Is(err, nats.ErrMaxPayload) {
			// A run whose big values make its view more than a NATS
			// message carries is answered, not left to time out.
			body, _ := json.Marshal(runs.Answer{Error: fmt.Sprintf("run %s: its view is more than a NATS message carries (%d bytes); read it with GET /v1/runs/%s",
				r.RunID, nc.MaxPayload(), r.RunID), Code: codeTooLarge})
			_ = req.Error(strconv.Itoa(answerCodes[codeTooLarge].http), "run view too large", body)
		}
	})
	for _, ep := range []struct {
		name string
		h    micro.Handler
	}{{"start", do(runs.CmdStart)}, {"get", get}, {"approve", do(runs.CmdApprove)}, {"cancel", do(runs.CmdCancel)}, {"budget", do(runs.CmdBudget)},
		{"signal", do(runs.CmdSignal)}, {"resume", do(runs.CmdResume)}, {"fork", do(runs.CmdFork)}, {"retry", do(runs.CmdRetry)}} {
		if err := g.AddEndpoint(ep.name, ep.h); err != nil {
			_ = svc.Stop()
			return nil, err
		}
	}
	if err := addWorkflowEndpoints(ctx, svc, client, log); err != nil {
		_ = svc.Stop()
		return nil, err
	}
	if err := addScheduleEndpoints(ctx, svc, client, log); err != nil {
		_ = svc.Stop()
		return nil, err
	}
	guard, err := natsauth.NewGuard(nc)
	if err == nil {
		err = svc.AddEndpoint("consumer", micro.HandlerFunc(func(req micro.Request) {
			caller, err := client.Requester(nats.Header(req.Headers()), "pal.api")
			if err == nil {
				err = caller.Reads("a consumer")
			}
			if err != nil {
				_ = req.Respond(natsauth.GuardRefusal(err.Error()))
				return
			}
			_ = req.Respond(guard.Create(ctx, req.Subject(), caller.Name, req.Data()))
		}), micro.WithEndpointSubject(natsauth.GuardPrefix+"CONSUMER.CREATE.>"))
	}
	if err != nil {
		_ = svc.Stop()
		return nil, err
	}
	return svc, nil
}

// workflowGetRequest is the body of pal.api.workflows.get.
type workflowGetRequest struct {
	Name    string `json:"name"`
	Version uint64 `json:"version,omitempty"`
}

// addWorkflowEndpoints adds the group pal.api.workflows: deploy (the body
// is the workflow; answers {name, version, sha256}), get ({"name",
// "version"?}: the version, its definition and the versions) and list
// (body empty or {}). A deploy acts with its caller's rights
// (runs.Caller.Rights: scope deploy, or PAL's own account); the server
// lets only client users with scope deploy request it at all.
func addWorkflowEndpoints(ctx context.Context, svc micro.Service, client *runs.Client, log *slog.Logger) error {
	serve := func(f func(ctx context.Context, caller runs.Caller, body []byte) (any, error)) micro.Handler {
		return handle(ctx, client, log, func(ctx context.Context, caller runs.Caller, req micro.Request) {
			ans, err := f(ctx, caller, req.Data())
			respondAnswer(req, ans, err, log)
		})
	}
	deploy := serve(func(ctx context.Context, caller runs.Caller, body []byte) (any, error) {
		if len(body) > runs.MaxCommandBytes {
			return nil, &runs.InputError{Msg: fmt.Sprintf("body is %d bytes; the limit is %d", len(body), runs.MaxCommandBytes)}
		}
		return client.Deploy(ctx, runs.DeployCommand{Workflow: body, By: caller.Name, Rights: caller.Rights()})
	})
	get := serve(func(ctx context.Context, caller runs.Caller, body []byte) (any, error) {
		if err := caller.Reads("pal.api.workflows.get"); err != nil {
			return nil, err
		}
		var r workflowGetRequest
		if err := runs.DecodeStrict(body, &r); err != nil {
			return nil, err
		}
		return client.Workflow(ctx, runs.WorkflowRef{Name: r.Name, Version: r.Version})
	})
	list := serve(func(ctx context.Context, caller runs.Caller, body []byte) (any, error) {
		if err := caller.Reads("pal.api.workflows.list"); err != nil {
			return nil, err
		}
		if b := bytes.TrimSpace(body); len(b) > 0 && string(b) != "{}" {
			return nil, &runs.InputError{Msg: "pal.api.workflows.list takes no body (or {})"}
		}
		return client.Workflows(ctx)
	})
	g := svc.AddGroup(workflowGroup)
	for _, ep := range []struct {
		name string
		h    micro.Handler
	}{{"deploy", deploy}, {"get", get}, {"list", list}} {
		if err := g.AddEndpoint(ep.name, ep.h); err != nil {
			return err
		}
	}
	return nil
}

// scheduleNameRequest is the body of pal.api.schedules.get, .pause,
// .resume, .delete and .trigger.
type scheduleNameRequest struct {
	Name string `json:"name"`
}

// addScheduleEndpoints adds the group pal.api.schedules: create (the body
// is runs.ScheduleCommand's, as POST /v1/schedules), list (body empty or
// {}), and get, pause, resume, delete and trigger ({"name"}), answering
// as the REST routes do. Each acts with its caller's rights
// (runs.Caller.Rights): create, pause, resume and delete need deploy,
// trigger start, get and list scope read.
func addScheduleEndpoints(ctx context.Context, svc micro.Service, client *runs.Client, log *slog.Logger) error {
	serve := func(f func(ctx context.Context, caller runs.Caller, body []byte) (any, error)) micro.Handler {
		return handle(ctx, client, log, func(ctx context.Context, caller runs.Caller, req micro.Request) {
			ans, err := f(ctx, caller, req.Data())
			respondAnswer(req, ans, err, log)
		})
	}
	named := func(act func(ctx context.Context, caller runs.Caller, c runs.ScheduleNameCommand) (any, error)) micro.Handler {
		return serve(func(ctx context.Context, caller runs.Caller, body []byte) (any, error) {
			var r scheduleNameRequest
			if err := runs.DecodeStrict(body, &r); err != nil {
				return nil, err
			}
			if r.Name == "" {
				return nil, &runs.InputError{Field: "name", Msg: "required"}
			}
			return act(ctx, caller, runs.ScheduleNameCommand{Name: r.Name, By: caller.Name, Rights: caller.Rights()})
		})
	}
	eps := []struct {
		name string
		h    micro.Handler
	}{
		{"create", serve(func(ctx context.Context, caller runs.Caller, body []byte) (any, error) {
			var c runs.ScheduleCommand
			if err := runs.DecodeStrict(body, &c); err != nil {
				return nil, err
			}
			c.By, c.Rights = caller.Name, caller.Rights()
			return client.CreateSchedule(ctx, c)
		})},
		{"list", serve(func(ctx context.Context, caller runs.Caller, body []byte) (any, error) {
			if err := caller.Reads("pal.api.schedules.list"); err != nil {
				return nil, err
			}
			if b := bytes.TrimSpace(body); len(b) > 0 && string(b) != "{}" {
				return nil, &runs.InputError{Msg: "pal.api.schedules.list takes no body (or {})"}
			}
			return client.Schedules(ctx)
		})},
		{"get", named(func(ctx context.Context, caller runs.Caller, c runs.ScheduleNameCommand) (any, error) {
			if err := caller.Reads("pal.api.schedules.get"); err != nil {
				return nil, err
			}
			return client.GetSchedule(ctx, c.Name)
		})},
		{"pause", named(func(ctx context.Context, _ runs.Caller, c runs.ScheduleNameCommand) (any, error) {
			return client.PauseSchedule(ctx, c)
		})},
		{"resume", named(func(ctx context.Context, _ runs.Caller, c runs.ScheduleNameCommand) (any, error) {
			return client.ResumeSchedule(ctx, c)
		})},
		{"delete", named(func(ctx context.Context, _ runs.Caller, c runs.ScheduleNameCommand) (any, error) {
			return DeletedAnswer{Deleted: c.Name}, client.DeleteSchedule(ctx, c)
		})},
		{"trigger", named(func(ctx context.Context, _ runs.Caller, c runs.ScheduleNameCommand) (any, error) {
			return client.TriggerSchedule(ctx, c)
		})},
	}
	g := svc.AddGroup(scheduleGroup)
	for _, ep := range eps {
		if err := g.AddEndpoint(ep.name, ep.h); err != nil {
			return err
		}
	}
	return nil
}

// scheduleGroup is the NATS service's group of the schedules.
const scheduleGroup = "pal.api.schedules"

// handle makes a service endpoint's handler: it answers only a reply
// PAL may publish on (replyAllowed), and gives f a deadline of 30 s and
// the caller the server names; a caller it cannot name is answered with
// the error.
func handle(ctx context.Context, client *runs.Client, log *slog.Logger, f func(ctx context.Context, caller runs.Caller, req micro.Request)) micro.Handler {
	return micro.HandlerFunc(func(req micro.Request) {
		if !replyAllowed(client, req, log) {
			return
		}
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		caller, err := client.Requester(nats.Header(req.Headers()), "pal.api")
		if err != nil {
			respondError(req, err, log)
			return
		}
		f(rctx, caller, req)
	})
}

// respondAnswer responds ans as JSON, or err as the service's error answer.
func respondAnswer(req micro.Request, ans any, err error, log *slog.Logger) {
	if err != nil {
		respondError(req, err, log)
		return
	}
	_ = req.RespondJSON(ans)
}

// workflowGroup is the NATS service's group of the workflow registry;
// its deploy endpoint is eventstore.WorkflowDeploySubject.
const workflowGroup = "pal.api.workflows"

// importReplyPrefix is the reply subject the server gives a request that
// crossed the client account's import: it leads back only to the client
// account, whatever reply the client named.
const importReplyPrefix = "_R_."

// replyAllowed refuses a request whose reply subject is not one PAL may
// publish on (the server's reply of an import, or runs.Client.CheckReply):
// it is not answered, and the refusal is logged and announced on
// pal.cmd.rejected.
func replyAllowed(client *runs.Client, req micro.Request, log *slog.Logger) bool {
	if strings.HasPrefix(req.Reply(), importReplyPrefix) {
		return true
	}
	err := client.CheckReply(req.Reply())
	if err == nil {
		return true
	}
	log.Warn("pal.api request refused: reply subject not allowed", "subject", req.Subject(), "err", err)
	b, _ := json.Marshal(runs.Rejection{Subject: req.Subject(), Error: err.Error(), Code: runs.CodeBadInput, Field: "reply_to"})
	_ = client.Conn().Publish(eventstore.RejectedSubject, b)
	return false
}

func respondError(req micro.Request, err error, log *slog.Logger) {
	ans := runs.ErrorAnswer(err)
	if errors.Is(err, eventstore.ErrRunNotFound) {
		ans.Error = "run not found"
	}
	body, _ := json.Marshal(ans)
	switch ans.Code {
	case runs.CodeUnavailable:
		log.Warn("pal.api request failed", "subject", req.Subject(), "err", err)
	case runs.CodeInternal:
		log.Error("pal.api request failed for good", "subject", req.Subject(), "err", err)
	}
	_, tc := transportOf(ans.Code)
	_ = req.Error(strconv.Itoa(tc.http), ans.Error, body)
}
