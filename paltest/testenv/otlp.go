package testenv

import (
	"compress/gzip"
	"context"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/protobuf/proto"
)

// Span is a span as an OTLP receiver got it: ids in hex, attributes as
// strings (ints and bools formatted).
type Span struct {
	TraceID, SpanID, ParentSpanID string
	Name                          string
	Attrs                         map[string]string
	// Links are the linked spans as "traceid/spanid".
	Links []string
}

// OTLPReceiver is an in-process OTLP/HTTP trace receiver: it decodes the
// protobuf ExportTraceServiceRequest the OpenTelemetry exporters POST to
// /v1/traces and keeps the spans.
type OTLPReceiver struct {
	srv     *httptest.Server
	mu      sync.Mutex
	spans   []Span
	changed chan struct{}
}

// StartOTLP starts a receiver that stops when the test ends.
func StartOTLP(t testing.TB) *OTLPReceiver {
	t.Helper()
	r := &OTLPReceiver{changed: make(chan struct{})}
	r.srv = httptest.NewServer(http.HandlerFunc(r.serve))
	t.Cleanup(r.srv.Close)
	return r
}

// URL is the receiver's base URL (OTEL_EXPORTER_OTLP_ENDPOINT).
func (r *OTLPReceiver) URL() string { return r.srv.URL }

// Env is the environment that has a PAL process export its spans here,
// within 50ms of their end.
func (r *OTLPReceiver) Env() []string {
	return []string{"OTEL_EXPORTER_OTLP_ENDPOINT=" + r.srv.URL, "OTEL_BSP_SCHEDULE_DELAY=50"}
}

func (r *OTLPReceiver) serve(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
		http.Error(w, "want POST /v1/traces", http.StatusNotFound)
		return
	}
	var body io.Reader = http.MaxBytesReader(w, req.Body, 16<<20)
	if req.Header.Get("Content-Encoding") == "gzip" {
		gz, err := gzip.NewReader(body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = gz
	}
	raw, err := io.ReadAll(body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var msg coltracepb.ExportTraceServiceRequest
	if err := proto.Unmarshal(raw, &msg); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var got []Span
	for _, rs := range msg.GetResourceSpans() {
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := Span{TraceID: hex.EncodeToString(s.GetTraceId()), SpanID: hex.EncodeToString(s.GetSpanId()),
					ParentSpanID: hex.EncodeToString(s.GetParentSpanId()), Name: s.GetName(), Attrs: attrs(s.GetAttributes())}
				for _, l := range s.GetLinks() {
					sp.Links = append(sp.Links, hex.EncodeToString(l.GetTraceId())+"/"+hex.EncodeToString(l.GetSpanId()))
				}
				got = append(got, sp)
			}
		}
	}
	r.mu.Lock()
	r.spans = append(r.spans, got...)
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func attrs(kvs []*commonpb.KeyValue) map[string]string {
	out := map[string]string{}
	for _, kv := range kvs {
		switch x := kv.GetValue().GetValue().(type) {
		case *commonpb.AnyValue_StringValue:
			out[kv.GetKey()] = x.StringValue
		case *commonpb.AnyValue_IntValue:
			out[kv.GetKey()] = strconv.FormatInt(x.IntValue, 10)
		case *commonpb.AnyValue_BoolValue:
			out[kv.GetKey()] = strconv.FormatBool(x.BoolValue)
		default: // arrays and the rest: their protobuf text form
			out[kv.GetKey()] = kv.GetValue().String()
		}
	}
	return out
}

// Spans returns the spans received so far.
func (r *OTLPReceiver) Spans() []Span {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// WaitFor waits until ok holds for the spans received, or ctx ends.
func (r *OTLPReceiver) WaitFor(ctx context.Context, ok func([]Span) bool) error {
	for {
		r.mu.Lock()
		spans, changed := append([]Span(nil), r.spans...), r.changed
		r.mu.Unlock()
		if ok(spans) {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}
