//go:build tools

// Package deps pins the modules that parts of PAL under construction import,
// so that go.mod names one version of each while they land.
package deps

import (
	_ "github.com/chromedp/chromedp"
	_ "github.com/emersion/go-smtp"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/prometheus/client_golang/prometheus/promhttp"
	_ "github.com/wneessen/go-mail"
	_ "go.opentelemetry.io/otel"
	_ "go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	_ "go.opentelemetry.io/otel/sdk/trace"
	_ "go.opentelemetry.io/otel/trace"
	_ "google.golang.org/grpc"
	_ "google.golang.org/protobuf/proto"
)
