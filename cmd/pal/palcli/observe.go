package palcli

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/internal/telemetry"
)

// startTracing turns OpenTelemetry traces on when the OTEL_* variables
// ask for them (OTEL_EXPORTER_OTLP_ENDPOINT); stop flushes the spans
// still buffered. With them unset it does nothing.
func (e *env) startTracing(ctx context.Context, service string, log *slog.Logger) (stop func(), err error) {
	shutdown, err := telemetry.SetupTracing(ctx, service, e.getenv)
	if err != nil {
		return nil, badInput("%v", err)
	}
	if telemetry.TracingEnabled(e.getenv) {
		log.Info("tracing on", "service", service, "otlp_endpoint", firstSet(e.getenv, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"))
	}
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := shutdown(sctx); err != nil {
			log.Warn("flushing spans", "err", err)
		}
	}, nil
}

func firstSet(getenv func(string) string, names ...string) string {
	for _, n := range names {
		if v := getenv(n); v != "" {
			return v
		}
	}
	return ""
}

// metricsOpen reads PAL_METRICS_OPEN: 1 or true serves the API address's
// /metrics without a token.
func (e *env) metricsOpen() (bool, error) {
	switch v := e.getenv("PAL_METRICS_OPEN"); v {
	case "", "0", "false":
		return false, nil
	case "1", "true":
		return true, nil
	default:
		return false, badInput("PAL_METRICS_OPEN=%q: want 1 or 0", v)
	}
}

// startMetrics serves GET /metrics, without a token, on PAL_METRICS_ADDR
// (pal worker, pal projector); unset, it serves nothing. The address
// must name its host: bind it to loopback or a network only Prometheus
// reaches.
func (e *env) startMetrics(ctx context.Context, log *slog.Logger) (stop func(), err error) {
	addr := e.getenv("PAL_METRICS_ADDR")
	if addr == "" {
		return func() {}, nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" || (host != "localhost" && net.ParseIP(host) == nil) {
		return nil, badInput("PAL_METRICS_ADDR=%q: want host:port with an IP address or localhost, e.g. 127.0.0.1:9464", addr)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", telemetry.Handler())
	srv := api.NewServer(addr, mux, log)
	if err := srv.Start(ctx); err != nil {
		return nil, withCode(ExitUnavailable, fmt.Errorf("serving metrics on PAL_METRICS_ADDR=%s: %w", addr, err))
	}
	log.Info("metrics served", "url", srv.URL()+"/metrics")
	return func() {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = srv.Stop(sctx)
	}, nil
}
