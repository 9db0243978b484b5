// Package api is how users drive PAL besides the durable commands: the
// NATS micro service "pal" (pal.api.runs.*, pal.api.workflows.* and
// pal.api.schedules.*,
// StartService) and the REST API
// with server-sent events (NewHandler, served by Server; pal server and
// pal dev run both).
//
// The REST routes (Routes, the one list: NewHandler serves these, pal
// server --help prints them, and a test holds this copy to them). Every
// /v1 route, and /metrics, needs "Authorization: Bearer <token>" of a
// token with the scope named (or a web UI session standing for one):
//
//	POST   /v1/runs                      start    start a run: 201 created, 200 for a duplicate idempotency key
//	GET    /v1/runs                      read     list runs, newest first, by label, status, workflow, time, error (the Postgres projection)
//	GET    /v1/runs/{id}                 read     a run, folded from its journal (runs.RunView)
//	GET    /v1/runs/{id}/events          read     the journal as server-sent events
//	GET    /v1/runs/{id}/waterfall       read     a run's timeline, for the web UI
//	GET    /v1/runs/{id}/receipt         read     the run's signed receipt (PAL_RECEIPTS)
//	GET    /v1/threads/{id}              read     a thread's conversation: its turns with run, step, role, content, seq
//	GET    /v1/keys                      read     the receipt signing public keys
//	PUT    /v1/workflows/{name}          deploy   deploy a workflow: 201 a new version, 200 unchanged
//	GET    /v1/workflows                 read     the deployed workflows, each at its latest version
//	GET    /v1/workflows/{name}          read     a deployed workflow (?version=N) and its versions
//	POST   /v1/schedules                 deploy   create a schedule: a deployed workflow started on a cron or an interval
//	GET    /v1/schedules                 read     the schedules, by name
//	GET    /v1/schedules/{name}          read     a schedule, with its next tick
//	DELETE /v1/schedules/{name}          deploy   delete a schedule (its runs stay)
//	POST   /v1/schedules/{name}/pause    deploy   pause a schedule: no tick fires, none is caught up
//	POST   /v1/schedules/{name}/resume   deploy   resume a schedule from its next tick
//	POST   /v1/schedules/{name}/trigger  start    start the schedule's workflow now
//	POST   /v1/runs/{id}/approve         approve  decide an approval step
//	POST   /v1/runs/{id}/budget          approve  raise a run's budget
//	POST   /v1/runs/{id}/signals/{name}  approve  send a signal; the body is its payload
//	POST   /v1/runs/{id}/cancel          cancel   cancel a run
//	POST   /v1/runs/{id}/resume          start    drive a run now (force: scope admin)
//	POST   /v1/runs/{id}/fork            start    a new run from a step of this one
//	POST   /v1/runs/{id}/retry           start    a new run from its first failed step
//	POST   /mcp                          read     PAL as an MCP server (streamable HTTP, stateless): tools that start and steer runs, each also needing its own scope
//	GET    /v1/openapi.json              read     this API as an OpenAPI 3.1 document (api/openapi.json)
//	GET    /metrics                      read     Prometheus metrics (no token with PAL_METRICS_OPEN)
//	GET    /healthz                      none     the process is up
//	GET    /readyz                       none     NATS (and Postgres, when configured) reachable
//
// The contract is api/openapi.json (OpenAPI 3.1, embedded and served at
// GET /v1/openapi.json, behind a read token like every /v1 route: one
// rule for /v1, and a client that may call the API may read its shape).
// It is written by hand, and each fact it states has one source that a
// test (TestOpenAPIMatchesRoutes) holds it to: the paths and methods are
// the routes table's; a route's request fields are the JSON fields of the
// Go type its body decodes into (the runs command of commandRoute, but
// reply_to); its statuses are the route's Statuses, which
// TestRoutesServeTheirScope also holds the handlers to; its security is
// the route's scope. Every error answer is one schema, {"error",
// "detail", "field"?}; it and the success answers' schemas are held to
// the Go types written (TestOpenAPISchemasAreTheAnswers).
//
// The body-carrying routes decode straight into the runs command structs
// (one generic route, commandRoute): the run id is the path's, reply_to is
// refused (the answer is the HTTP response), and who starts, approves,
// cancels or sends is the token's name.
//
// Invariants:
//
//   - Bad input is refused before anything is written: bodies are decoded
//     strictly (unknown fields, wrong types and trailing data are errors
//     naming the field), limited to MaxBodyBytes (413), and run ids must
//     be one NATS subject token, so no request can widen a subject.
//   - Every error is {"error": code, "detail": message} (plus "field" when
//     one field is at fault), with the codes of runs.Classify (rate_limited
//     among them) and unauthorized, forbidden, method_not_allowed and
//     too_large.
//   - Tokens are compared in constant time against every configured token;
//     a handler without tokens refuses every /v1 request unless it was
//     built Insecure on purpose.
//   - Identity comes from the token: its name is the starter, approver and
//     canceller journaled. A body's approver or by that differs from it is
//     refused (403 forbidden, field approver or by) unless the token has
//     scope admin. A token without a route's scope gets 403 before its
//     body is read. On the NATS service (and the durable commands) the
//     caller is the NATS user the server authenticated, with the same
//     rule: a client user (PAL_NATS_USERS, its scopes), named in the
//     server's Nats-Request-Info across the client account's import
//     (runs.Client.Requester); a body that names another approver or by,
//     or forces a resume, needs scope admin (403 forbidden). Its endpoint
//     consumer answers the client account's consumer creates
//     (natsauth.Guard).
//   - A receipt is served only when its signature verifies against the
//     server's keys and it is the run's own (500 receipt_invalid).
//   - What a caller may run is checked in runs, on the rights the
//     transport sets on the command: REST's from the token's scopes
//     start and deploy (rightsOf), the NATS service's from the caller's
//     (runs.Caller.Rights; pal.api.workflows.deploy needs scope deploy).
//     A token or user with start alone starts deployed workflows; a
//     definition in a start or fork gets 403 naming scope deploy.
//   - An event stream sends each event of the run once, in seq order, from
//     after Last-Event-ID (or ?after=), and ends after the terminal event.
//     It reads the journal from there in bounded pages at the pace its
//     client reads (eventstore.Pages), so it holds a page, not the
//     journal; a reconnect with nothing left to send reads one message.
//     Caught up, it follows the run's feed: all streams of one run share
//     one journal watch (no consumer on PAL_EVENTS), and a stream that
//     falls too far behind leaves the feed for pages again, so it never
//     slows the others down. With ?deltas=1 it also sends the text LLM
//     steps stream (event: delta, no id, from a watch of the run's
//     deltas of its own), so the run page shows an answer as it is
//     written and Last-Event-ID still resumes the journal exactly; gRPC's
//     StreamRunEvents does the same with include_deltas (events of kind
//     delta, seq 0).
//   - Every token is held to limits (internal/limit): the runs it starts,
//     its commands, the event streams it opens and holds open. Over one,
//     a request is answered 429 rate_limited with Retry-After (gRPC
//     RESOURCE_EXHAUSTED) before its run is read or written. Failed
//     logins are bounded per client address and per token prefix, and
//     a login posted from another site is refused.
//   - The write side is NATS only: starting, reading, approving, cancelling
//     and streaming need no Postgres; only GET /v1/runs does.
//
// The wire formats are in docs/architecture.md §9.
package api
