package paltest_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/internal/service"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/workers"
)

func TestMain(m *testing.M) { testenv.Main(m) }

func TestChain(t *testing.T) {
	t.Parallel()
	wf := paltest.Chain("two", 2, func(i int, prev string) (string, string) {
		id := fmt.Sprintf("a%d", i)
		return id, fmt.Sprintf(`{"id":%q,"type":"tool","data":{"tool":"echo","input":{"after":%q}}}`, id, prev)
	})
	require.Equal(t, `{"name":"two","nodes":[{"id":"start","type":"trigger"},`+
		`{"id":"a1","type":"tool","data":{"tool":"echo","input":{"after":"start"}}},`+
		`{"id":"a2","type":"tool","data":{"tool":"echo","input":{"after":"a1"}}}],`+
		`"edges":[{"from":"start","to":"a1"},{"from":"a1","to":"a2"}]}`, wf)
	require.Equal(t, `{"name":"none","nodes":[{"id":"start","type":"trigger"}],"edges":[]}`,
		paltest.Chain("none", 0, nil))
}

// TestStack runs a workflow with an LLM step and a registered tool through
// a stack's worker.
func TestStack(t *testing.T) {
	t.Parallel()
	for _, strict := range []bool{false, true} {
		t.Run(fmt.Sprintf("strict=%v", strict), func(t *testing.T) {
			t.Parallel()
			var opts []paltest.Option
			if strict {
				opts = append(opts, paltest.Strict())
			}
			s := paltest.New(t, opts...)
			s.Worker(t, "w1", paltest.Concurrency(2), paltest.WorkerLogger(paltest.Logger(t)),
				paltest.Tools(map[string]workers.Tool{"twice": func(context.Context, json.RawMessage) (json.RawMessage, error) {
					return json.RawMessage(`{"twice":true}`), nil
				}}))
			wf := `{"name":"s","nodes":[{"id":"start","type":"trigger"},
				{"id":"ask","type":"ai-step","data":{"provider":"anthropic","model":"m","prompt":"hi {{input.who}}"}},
				{"id":"t","type":"tool","data":{"tool":"twice"}}],
				"edges":[{"from":"start","to":"ask"},{"from":"ask","to":"t"}]}`
			runID := s.Start(t, wf, `{"who":"pal"}`)
			end := s.WaitEnd(t, runID)
			require.Equal(t, event.RunSucceeded, end.Kind)
			evs := s.Events(t, runID)
			require.Equal(t, event.RunCreated, evs[0].Kind)
			require.Equal(t, "test", evs[0].WorkerID)
			require.Equal(t, end, evs[len(evs)-1])
			calls := s.LLM.Calls()
			require.Len(t, calls, 1)
			require.Equal(t, "hi pal", calls[0].LastUser())
		})
	}
}

func TestAppendRaw(t *testing.T) {
	t.Parallel()
	s := paltest.New(t, paltest.LeaseTTL(0))
	require.Equal(t, 3*time.Second, s.Leases.TTL(), "the event store's default")
	runID := s.Start(t, `{"name":"e","nodes":[{"id":"start","type":"trigger"}],"edges":[]}`, `{}`)
	s.AppendRaw(t, runID, event.MustNew(event.RunCancelled, "", 0, event.RunCancelledData{Reason: "test"}))
	end := s.WaitFor(t, runID, "the cancel", func(ev event.Event) bool { return ev.Kind == event.RunCancelled })
	require.Equal(t, "test", end.WorkerID)
	require.Equal(t, uint64(2), end.Seq)
	require.Len(t, s.Events(t, runID), 2)
}

// TestServe: what a test starts with Serve stops when that test ends, the
// last started first, before what its parent test started.
func TestServe(t *testing.T) {
	t.Parallel()
	s := paltest.New(t)
	var log []string
	part := func(name string) service.Service {
		return service.Func{
			OnStart: func(context.Context) error { log = append(log, "start "+name); return nil },
			OnStop:  func(context.Context) error { log = append(log, "stop "+name); return nil },
		}
	}
	// Registered first, so it runs after the stack's own cleanup.
	t.Cleanup(func() { require.Equal(t, "stop outer", log[len(log)-1]) })
	s.Serve(t, "outer", part("outer"))
	t.Run("inner", func(t *testing.T) {
		s.Serve(t, "a", part("a"))
		s.Serve(t, "b", part("b"))
	})
	require.Equal(t, []string{"start outer", "start a", "start b", "stop b", "stop a"}, log)
}
