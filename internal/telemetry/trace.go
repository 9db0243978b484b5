package telemetry

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// instrumentation names PAL's tracer.
const instrumentation = "github.com/palrun/pal"

// defaultScheduleDelay is how long finished spans wait before they are
// exported when OTEL_BSP_SCHEDULE_DELAY is unset: shorter than the SDK's
// 5s, so the spans of a worker killed with kill -9 have mostly left it.
const defaultScheduleDelay = time.Second

// tracer returns PAL's tracer from the global provider: OpenTelemetry's
// no-op until SetupTracing installs one.
func tracer() trace.Tracer { return otel.Tracer(instrumentation) }

// TracingEnabled reports whether getenv asks for traces: an OTLP endpoint
// is set and neither OTEL_SDK_DISABLED=true nor OTEL_TRACES_EXPORTER=none
// turns them off.
func TracingEnabled(getenv func(string) string) bool {
	if strings.EqualFold(getenv("OTEL_SDK_DISABLED"), "true") || getenv("OTEL_TRACES_EXPORTER") == "none" {
		return false
	}
	return getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// SetupTracing installs the global tracer provider and the trace-context
// propagator when getenv asks for traces (TracingEnabled), reading the
// standard OTEL_* variables (endpoint, headers, timeout, OTEL_SERVICE_NAME,
// OTEL_RESOURCE_ATTRIBUTES, OTEL_BSP_*). service is the default
// service.name. It returns a shutdown that flushes what is buffered; with
// tracing off it does nothing and shutdown is a no-op.
//
// Errors: an exporter other than otlp, a protocol other than
// http/protobuf (PAL ships the OTLP/HTTP exporter only).
func SetupTracing(ctx context.Context, service string, getenv func(string) string) (shutdown func(context.Context) error, err error) {
	noop := func(context.Context) error { return nil }
	if !TracingEnabled(getenv) {
		return noop, nil
	}
	if e := getenv("OTEL_TRACES_EXPORTER"); e != "" && e != "otlp" {
		return noop, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: PAL exports traces with otlp only (or none)", e)
	}
	for _, v := range []string{"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"} {
		if p := getenv(v); p != "" && p != "http/protobuf" {
			return noop, fmt.Errorf("%s=%q: PAL exports OTLP over http/protobuf only", v, p)
		}
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return noop, fmt.Errorf("setting up the OTLP trace exporter: %w", err)
	}
	res, err := resource.New(ctx, resource.WithAttributes(attribute.String("service.name", service)),
		resource.WithFromEnv(), resource.WithTelemetrySDK())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return noop, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	var bopts []sdktrace.BatchSpanProcessorOption
	if getenv("OTEL_BSP_SCHEDULE_DELAY") == "" {
		bopts = append(bopts, sdktrace.WithBatchTimeout(defaultScheduleDelay))
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp, bopts...), sdktrace.WithResource(res),
		sdktrace.WithIDGenerator(driveIDs{}))
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})
	return tp.Shutdown, nil
}

// driveIDs makes random ids, except that a root span's span id is the low
// 8 bytes of its trace id. PAL's only root spans are drives, so the trace
// id on run_resumed names the drive's root span as well (DriveLink).
type driveIDs struct{}

func (driveIDs) NewIDs(context.Context) (trace.TraceID, trace.SpanID) {
	var t trace.TraceID
	for !t.IsValid() || !trace.SpanID(t[8:]).IsValid() {
		_, _ = rand.Read(t[:])
	}
	return t, trace.SpanID(t[8:])
}

func (driveIDs) NewSpanID(context.Context, trace.TraceID) trace.SpanID {
	var s trace.SpanID
	for !s.IsValid() {
		_, _ = rand.Read(s[:])
	}
	return s
}

// maxLinks bounds the earlier drives a drive's spans link to: the most
// recent ones.
const maxLinks = 32

// driveLinks links to the root spans of the drives whose trace ids (hex,
// from the journal's run_resumed events, oldest first) are given; ids that
// do not parse are skipped.
func driveLinks(traceIDs []string) []trace.Link {
	if len(traceIDs) > maxLinks {
		traceIDs = traceIDs[len(traceIDs)-maxLinks:]
	}
	var out []trace.Link
	for _, h := range traceIDs {
		t, err := trace.TraceIDFromHex(h)
		if err != nil {
			continue
		}
		out = append(out, trace.Link{
			SpanContext: trace.NewSpanContext(trace.SpanContextConfig{TraceID: t, SpanID: trace.SpanID(t[8:]), TraceFlags: trace.FlagsSampled, Remote: true}),
			Attributes:  []attribute.KeyValue{attribute.String("pal.link", "earlier_drive")},
		})
	}
	return out
}

// TraceID returns the hex trace id of the span in ctx, "" when there is
// none being recorded (tracing off).
func TraceID(ctx context.Context) string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return ""
	}
	return sc.TraceID().String()
}

// Inject writes ctx's trace context (traceparent) into h; with tracing
// off the propagator is a no-op and h is left alone.
func Inject(ctx context.Context, h http.Header) {
	otel.GetTextMapPropagator().Inject(ctx, propagation.HeaderCarrier(h))
}

// Drive is the root span of one drive; a nil *Drive is a drive without
// a trace.
type Drive struct {
	span  trace.Span
	start time.Time
}

// DriveInfo describes the drive being opened.
type DriveInfo struct {
	RunID       string
	Worker      string
	ResumeCount int
	Crashed     bool
	// Earlier are the trace ids of the run's earlier drives, oldest first.
	Earlier []string
}

// StartDrive opens a drive's trace: a new root span linked to the run's
// earlier drives. A span already in ctx (a parent run's step driving its
// child inline) is linked, not made the parent, so every drive is a trace
// of its own. It returns ctx carrying the drive's span.
func StartDrive(ctx context.Context, info DriveInfo) (context.Context, *Drive) {
	links := driveLinks(info.Earlier)
	if parent := trace.SpanContextFromContext(ctx); parent.IsValid() {
		links = append(links, trace.Link{SpanContext: parent, Attributes: []attribute.KeyValue{attribute.String("pal.link", "parent_run")}})
	}
	ctx, span := tracer().Start(ctx, "pal.drive", trace.WithNewRoot(), trace.WithLinks(links...),
		trace.WithAttributes(attribute.String("pal.run_id", info.RunID), attribute.String("pal.worker_id", info.Worker),
			attribute.Int("pal.resume_count", info.ResumeCount), attribute.Bool("pal.crashed", info.Crashed)))
	return ctx, &Drive{span: span, start: time.Now()}
}

// Resumed records that the drive's run_resumed is durable, as a short
// span of its own that carries the links too: a drive killed with kill -9
// never ends (nor exports) its root span, and this span keeps its links.
func (d *Drive) Resumed(ctx context.Context, info DriveInfo) {
	if d == nil {
		return
	}
	_, span := tracer().Start(ctx, "pal.resume", trace.WithLinks(driveLinks(info.Earlier)...),
		trace.WithAttributes(attribute.String("pal.run_id", info.RunID), attribute.Int("pal.resume_count", info.ResumeCount),
			attribute.Bool("pal.crashed", info.Crashed)))
	span.End()
}

// End ends the drive's span with its outcome (the worker's drive
// outcome: done, parked, lease_lost, …).
func (d *Drive) End(outcome string, err error) {
	if d == nil {
		return
	}
	d.span.SetAttributes(attribute.String("pal.outcome", outcome))
	if err != nil {
		d.span.SetStatus(codes.Error, err.Error())
	}
	d.span.End()
}

// Step is the span of one step attempt.
type Step struct {
	span     trace.Span
	nodeType string
	start    time.Time
}

// StartStep opens the span of one step attempt under the drive's span
// in ctx.
func StartStep(ctx context.Context, runID, stepID string, attempt int, nodeType string) (context.Context, *Step) {
	ctx, span := tracer().Start(ctx, "pal.step")
	if span.IsRecording() { // with tracing off, build nothing
		span.SetAttributes(attribute.String("pal.run_id", runID), attribute.String("pal.step_id", stepID),
			attribute.Int("pal.attempt", attempt), attribute.String("pal.node_type", nodeType))
	}
	return ctx, &Step{span: span, nodeType: nodeType, start: time.Now()}
}

// End ends a step attempt with its outcome (completed, failed, retrying,
// waiting, interrupted) and counts it (pal_steps_total,
// pal_step_duration_seconds).
func (s *Step) End(outcome string) {
	if s.span.IsRecording() {
		s.span.SetAttributes(attribute.String("pal.outcome", outcome))
		if outcome == "failed" {
			s.span.SetStatus(codes.Error, "step failed")
		}
	}
	s.span.End()
	steps.WithLabelValues(s.nodeType, outcome).Inc()
	stepSeconds.WithLabelValues(s.nodeType, outcome).Observe(time.Since(s.start).Seconds())
}
