package palcli

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/palrun/pal/api"
	"github.com/palrun/pal/internal/service"
	"github.com/palrun/pal/internal/telemetry"
)

// startTracing turns OpenTelemetry traces on when the OTEL_* variables
// ask for them (OTEL_EXPORTER_OTLP_ENDPOINT), for name; stopping st
// flushes the spans still buffered. With them unset it does nothing.
func (e *env) startTracing(ctx context.Context, st *service.Stack, name string, log *slog.Logger) error {
	shutdown, err := telemetry.SetupTracing(ctx, name, e.getenv)
	if err != nil {
		return badInput("%v", err)
	}
	if telemetry.TracingEnabled(e.getenv) {
		log.Info("tracing on", "service", name, "otlp_endpoint", firstSet(e.getenv, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"))
	}
	st.Started("tracing", func(ctx context.Context) error {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := shutdown(sctx); err != nil {
			log.Warn("flushing spans", "err", err)
		}
		return nil
	})
	return nil
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
// (pal worker, pal projector), on st; unset, it serves nothing. The
// address must name its host: bind it to loopback or a network only
// Prometheus reaches.
func (e *env) startMetrics(ctx context.Context, st *service.Stack, log *slog.Logger) error {
	addr := e.getenv("PAL_METRICS_ADDR")
	if addr == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "" || (host != "localhost" && net.ParseIP(host) == nil) {
		return badInput("PAL_METRICS_ADDR=%q: want host:port with an IP address or localhost, e.g. 127.0.0.1:9464", addr)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", telemetry.Handler())
	srv := api.NewServer(addr, mux, log)
	if err := st.Start(ctx, "metrics on PAL_METRICS_ADDR="+addr, srv); err != nil {
		return withCode(ExitUnavailable, err)
	}
	log.Info("metrics served", "url", srv.URL()+"/metrics")
	return nil
}
