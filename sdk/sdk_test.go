package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// reset forgets the process-wide client, so a test can point it elsewhere.
func reset() { clientOnce, theClient = sync.Once{}, nil }

func TestStepSkipsJournaledAndReportsTheRest(t *testing.T) {
	var reports []map[string]any
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/runtime/substeps":
			_, _ = w.Write([]byte(`{"step_id":"work","substeps":[{"name":"a","output":{"n":5}}]}`))
		case "/v1/runtime/report":
			var b map[string]any
			_ = json.NewDecoder(r.Body).Decode(&b)
			reports = append(reports, b)
			_, _ = w.Write([]byte(`{"completed":false}`))
		}
	}))
	srv.Listener = listenUnix(t)
	srv.Start()
	defer srv.Close()
	t.Setenv("PAL_REPORT_SOCKET", srv.Listener.Addr().String())
	t.Setenv("PAL_STEP_ID", "work")
	t.Setenv("PAL_IDEMPOTENCY_KEY", "k1")
	t.Setenv("PAL_RESUME", "1")
	reset()
	defer reset()

	type out struct{ N int }
	ctx := context.Background()
	a, err := Step(ctx, "a", func(context.Context) (out, error) { t.Fatal("a is journaled"); return out{}, nil })
	if err != nil || a.N != 5 {
		t.Fatalf("a = %v, %v; want the journaled {5}", a, err)
	}
	b, err := Step(ctx, "b", func(context.Context) (out, error) { return out{N: 7}, nil })
	if err != nil || b.N != 7 {
		t.Fatalf("b = %v, %v", b, err)
	}
	if len(reports) != 2 || reports[0]["status"] != "started" || reports[1]["status"] != "completed" ||
		reports[1]["step_id"] != "work" || reports[1]["name"] != "b" {
		t.Fatalf("reports = %v", reports)
	}
	boom := errors.New("boom")
	if _, err := Step(ctx, "c", func(context.Context) (out, error) { return out{}, boom }); !errors.Is(err, boom) {
		t.Fatalf("c: %v", err)
	}
	if len(reports) != 3 {
		t.Fatalf("a failed sub-step is not reported completed: %v", reports)
	}
	if !Resumed() || IdempotencyKey("b") != "k1/b" {
		t.Fatalf("Resumed %v, key %q", Resumed(), IdempotencyKey("b"))
	}
}

// listenUnix listens on a Unix socket in a fresh directory (short enough
// for a socket's path).
func listenUnix(t *testing.T) net.Listener {
	t.Helper()
	dir, err := os.MkdirTemp("", "sdk")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ln, err := net.Listen("unix", filepath.Join(dir, "report.sock"))
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

func TestStepOutsidePALJustRuns(t *testing.T) {
	t.Setenv("PAL_REPORT_SOCKET", "")
	reset()
	defer reset()
	v, err := Step(context.Background(), "x", func(context.Context) (int, error) { return 3, nil })
	if err != nil || v != 3 {
		t.Fatalf("%v %v", v, err)
	}
}
