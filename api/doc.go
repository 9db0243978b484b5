// Package api is how users drive PAL besides the durable commands: the
// NATS micro service "pal" (pal.api.runs.*, StartService) and the REST API
// with server-sent events (NewHandler, served by Server; pal server and
// pal dev run both).
//
// REST endpoints (all under /v1 need "Authorization: Bearer <token>" of
// a token with the scope named last):
//
//	POST /v1/runs                  start a run: 201 {"run_id","created":true},
//	                               200 {"run_id","created":false} for a duplicate    start
//	GET  /v1/runs                  list runs from the Postgres projection            read
//	GET  /v1/runs/{id}             the run folded from its journal (runs.RunView)    read
//	GET  /v1/runs/{id}/events      the journal as server-sent events                 read
//	POST /v1/runs/{id}/approve     200 {"ok":true,"run_id"}                          approve
//	POST /v1/runs/{id}/cancel      200 {"ok":true,"run_id"}                          cancel
//	GET  /healthz, GET /readyz     no token
//
// Invariants:
//
//   - Bad input is refused before anything is written: bodies are decoded
//     strictly (unknown fields, wrong types and trailing data are errors
//     naming the field), limited to MaxBodyBytes (413), and run ids must
//     be one NATS subject token, so no request can widen a subject.
//   - Every error is {"error": code, "detail": message} (plus "field" when
//     one field is at fault), with the codes of runs.Classify and
//     unauthorized, forbidden, method_not_allowed and too_large.
//   - Tokens are compared in constant time against every configured token;
//     a handler without tokens refuses every /v1 request unless it was
//     built Insecure on purpose.
//   - Identity comes from the token: its name is the starter, approver and
//     canceller journaled. A body's approver or by that differs from it is
//     refused (403 forbidden, field approver or by) unless the token has
//     scope admin. A token without a route's scope gets 403 before its
//     body is read. The NATS service and the durable commands have no
//     tokens: there the command's own approver and by are journaled, and
//     NATS permissions decide who may send one.
//   - An event stream sends each event of the run once, in seq order, from
//     after Last-Event-ID (or ?after=), and ends after the terminal event.
//     All streams of one run share one journal watch (one consumer on
//     PAL_EVENTS); a client that falls too far behind is dropped and
//     resumes with Last-Event-ID, so it never slows the others down.
//   - The write side is NATS only: starting, reading, approving, cancelling
//     and streaming need no Postgres; only GET /v1/runs does.
//
// The wire formats are in docs/architecture.md §9.
package api
