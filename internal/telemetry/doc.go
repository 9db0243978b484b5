// Package telemetry is PAL's observability: OpenTelemetry traces and
// Prometheus metrics, set up and named in one place so the rest of the
// tree calls a few functions at the points where things are decided
// (a drive's outcome, a step's outcome, an append, a provider call, a
// refused command) instead of scattering instrumentation.
//
// Traces are off unless OTEL_EXPORTER_OTLP_ENDPOINT (or
// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is set: then SetupTracing installs
// an OTLP/HTTP exporter with the SDK's batch span processor and the W3C
// trace-context propagator. Off, the global tracer is OpenTelemetry's
// no-op: spans are not recorded, no trace id reaches the journal and no
// traceparent header is sent.
//
// The trace shape: one trace per drive (a drive is one worker's turn at a
// run, opened by its run_resumed). Its root span "pal.drive" has a span id
// equal to the low 8 bytes of its trace id (see driveIDs), so the trace id
// journaled on run_resumed is enough to link a later drive's root span to
// it. Under the root: "pal.resume" (ended as soon as run_resumed is
// durable), one "pal.step" span per step attempt, and under an ai-step's
// span a GenAI "chat <model>" client span.
//
// Metrics live in one registry (Registry) served by Handler; every name
// starts with pal_. Label values that come from workflows (models,
// providers) are bounded (see bounded) so a workflow cannot grow the
// registry without limit.
package telemetry
