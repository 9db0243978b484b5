package telemetry

import (
	"context"
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"
)

func envOf(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestTracingOffUnlessAnEndpointIsSet(t *testing.T) {
	for _, c := range []struct {
		env  map[string]string
		want bool
	}{
		{nil, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, true},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"}, false},
		{map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_TRACES_EXPORTER": "none"}, false},
	} {
		require.Equal(t, c.want, TracingEnabled(envOf(c.env)), "%v", c.env)
	}
	// Off: nothing is installed, spans are not recorded, no trace id
	// reaches the journal and no traceparent is sent.
	shutdown, err := SetupTracing(context.Background(), "pal", envOf(nil))
	require.NoError(t, err)
	require.NoError(t, shutdown(context.Background()))
	ctx, d := StartDrive(context.Background(), DriveInfo{RunID: "run_a"})
	sctx, s := StartStep(ctx, "run_a", "s1", 1, "tool")
	require.Empty(t, TraceID(sctx))
	h := http.Header{}
	Inject(sctx, h)
	require.Empty(t, h)
	s.End("completed")
	d.End("done", nil)
	_, isNoop := otel.GetTracerProvider().(interface{ Shutdown(context.Context) error })
	require.False(t, isNoop, "no SDK provider installed")
}

func TestSetupTracingRefusesWhatPALDoesNotShip(t *testing.T) {
	for _, env := range []map[string]string{
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_TRACES_EXPORTER": "zipkin"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
		{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/json"},
	} {
		_, err := SetupTracing(context.Background(), "pal", envOf(env))
		require.Error(t, err, "%v", env)
	}
}

func TestDriveRootSpanIDIsTheLowHalfOfItsTraceID(t *testing.T) {
	for range 100 {
		tid, sid := driveIDs{}.NewIDs(context.Background())
		require.True(t, tid.IsValid())
		require.Equal(t, tid.String()[16:], sid.String())
		require.True(t, driveIDs{}.NewSpanID(context.Background(), tid).IsValid())
	}
	ids := make([]string, maxLinks+5)
	for i := range ids {
		tid, _ := driveIDs{}.NewIDs(context.Background())
		ids[i] = tid.String()
	}
	links := driveLinks(append(ids, "not-hex"))
	require.Len(t, links, maxLinks-1, "the most recent %d, the bad id skipped", maxLinks)
	last := links[len(links)-1].SpanContext
	require.Equal(t, ids[len(ids)-1], last.TraceID().String())
	tid := last.TraceID()
	require.Equal(t, trace.SpanID(tid[8:]), last.SpanID())
}

func TestLabelValuesAreBounded(t *testing.T) {
	var b bounded
	long := fmt.Sprintf("%0100d", 7)
	require.Equal(t, long[:maxLabelLen], b.value(long))
	require.Equal(t, "unknown", b.value(""))
	for i := 1; i < maxLabelValues; i++ {
		require.Equal(t, fmt.Sprint("m", i), b.value(fmt.Sprint("m", i)))
	}
	require.Equal(t, "other", b.value("one-too-many"))
	require.Equal(t, "m1", b.value("m1"), "a value seen before keeps its label")
	require.Equal(t, long[:maxLabelLen], b.value(long))
}

// BenchmarkStepOff is what a step attempt costs PAL's instrumentation
// with tracing off: a no-op span and two metric updates.
func BenchmarkStepOff(b *testing.B) {
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		sctx, s := StartStep(ctx, "run_a", "s1", 1, "tool")
		_ = TraceID(sctx)
		s.End("completed")
	}
}
