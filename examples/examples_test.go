// Package examples_test runs every workflow in examples/ against a real
// PAL (embedded JetStream, a worker, the fake LLM provider, a webhook
// receiver), with the input the README's line for it gives, so that the
// files and the lines the README shows stay valid and do what they say.
package examples_test

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/paltest"
	"github.com/palrun/pal/paltest/testenv"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/provider/providertest"
	"github.com/palrun/pal/runs"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// example is one file of examples/ and how to run it (its input is the
// README's, readmeInputs): what to do while it runs, and what its journal
// must show.
type example struct {
	// edit changes the file's text before the run (e.g. shorter waits).
	edit func(wf string) string
	// setup prepares the stack before the run starts.
	setup func(t *testing.T, s *paltest.Stack)
	// during acts on the run while it is in flight (an approval).
	during func(t *testing.T, s *paltest.Stack, runID string)
	check  func(t *testing.T, s *paltest.Stack, runID string, out map[string]any)
}

func examples() map[string]example {
	return map[string]example{
		"hello.json": {
			check: func(t *testing.T, _ *paltest.Stack, _ string, out map[string]any) {
				require.Equal(t, "echo: Summarise: PAL journals every step", out["draft"])
			},
		},
		"notify.json": {
			check: func(t *testing.T, s *paltest.Stack, runID string, _ map[string]any) {
				reqs := s.Hook.Requests()
				require.Len(t, reqs, 1)
				require.Equal(t, runID, reqs[0].RunID)
				require.JSONEq(t, `{"summary":"echo: Summarise: a text long enough to notify about"}`, string(reqs[0].Body))
			},
		},
		"approval.json": {
			during: func(t *testing.T, s *paltest.Stack, runID string) {
				s.WaitFor(t, runID, "the approval to wait", func(ev event.Event) bool {
					return ev.Kind == event.StepWaiting && ev.StepID == "ok"
				})
				require.NoError(t, runs.New(s.Store).Approve(context.Background(), runs.ApproveCommand{
					RunID: runID, StepID: "ok", Decision: "approve", Approver: "ana"}))
			},
			check: func(t *testing.T, _ *paltest.Stack, _ string, out map[string]any) {
				require.Equal(t, map[string]any{"note": "echo: Write a release note for: faster resumes", "approved_by": "ana"}, out)
			},
		},
		"wait.json": {
			during: func(t *testing.T, s *paltest.Stack, runID string) {
				// Sent before the run reaches the wait node: it is kept.
				require.NoError(t, runs.New(s.Store).Signal(context.Background(), runs.SignalCommand{
					RunID: runID, Signal: "go", Payload: json.RawMessage(`{"by":"ana"}`), By: "ana"}))
			},
			check: func(t *testing.T, _ *paltest.Stack, _ string, out map[string]any) {
				require.Equal(t, map[string]any{"service": "billing", "by": "ana"}, out)
			},
		},
		"loop.json": {
			check: func(t *testing.T, _ *paltest.Stack, _ string, out map[string]any) {
				require.Len(t, out["summaries"], 3)
				require.Equal(t, "echo: In a terse style, summarise article 2: three",
					out["summaries"].([]any)[2].(map[string]any)["text"])
			},
		},
		"subagent.json": {
			check: func(t *testing.T, s *paltest.Stack, _ string, out map[string]any) {
				require.Equal(t, "echo: Write a paragraph from these notes: echo: List three facts about JetStream", out["text"])
				require.Equal(t, 1, countCalls(s, providertest.Anthropic), "the child's step went to anthropic")
			},
		},
		"queues.json": {
			// The README starts a worker of the gpu queue for it: w1 takes
			// the default queue only, so the run waits for "gpu".
			setup: func(t *testing.T, s *paltest.Stack) { s.Worker(t, "gpu1", paltest.Queues("gpu")) },
			check: func(t *testing.T, s *paltest.Stack, runID string, out map[string]any) {
				require.Equal(t, map[string]any{"scene": "teapot", "queue": "gpu"}, out)
				for _, ev := range s.Events(t, runID) {
					if ev.Kind == event.RunResumed {
						require.Equal(t, "gpu1", ev.WorkerID, "only a gpu worker drives a gpu run")
					}
				}
			},
		},
		"agent.json": {
			setup: func(_ *testing.T, s *paltest.Stack) {
				// The model calls echo once, then answers with what it got back.
				s.LLM.SetResponder(func(c providertest.Call) providertest.Reply {
					last := c.Messages[len(c.Messages)-1]
					if last.Role != provider.RoleTool {
						return providertest.Reply{ToolCalls: []provider.ToolCall{{ID: "call_1", Name: "echo", Arguments: json.RawMessage(`{"text":"durable"}`)}}}
					}
					return providertest.Reply{Text: "checked: " + last.Content}
				})
			},
			check: func(t *testing.T, s *paltest.Stack, runID string, out map[string]any) {
				require.Equal(t, `checked: {"text":"durable"}`, out["text"])
				require.EqualValues(t, 2, out["turns"])
				require.Len(t, completed(t, s, runID, "ask.turn[0].tool[0]"), 1)
			},
		},
		"fake.json": {
			// No responder: the node's fake block scripts the fake (the
			// stack's providers send it, as pal dev's do).
			check: func(t *testing.T, s *paltest.Stack, runID string, out map[string]any) {
				require.Equal(t, map[string]any{"answer": float64(4)}, out["json"])
				require.EqualValues(t, 2, out["turns"])
				tool := completed(t, s, runID, "ask.turn[0].tool[0]")
				require.Len(t, tool, 1)
				var d event.StepCompletedData
				require.NoError(t, tool[0].DecodeData(&d))
				require.JSONEq(t, `{"text":"2+2"}`, string(d.Output))
				var retried int
				for _, ev := range s.Events(t, runID) {
					if ev.Kind == event.StepRetrying && ev.StepID == "ask.turn[0]" {
						retried++
					}
				}
				require.Equal(t, 1, retried, "the scripted 429, retried once")
			},
		},
		"condition.json": {
			check: func(t *testing.T, s *paltest.Stack, runID string, out map[string]any) {
				require.Equal(t, map[string]any{"text": "short"}, out, "the short branch ran")
				require.Empty(t, completed(t, s, runID, "summarise"))
			},
		},
		"connector.json": {
			check: func(t *testing.T, s *paltest.Stack, runID string, _ map[string]any) {
				reqs := s.Hook.Requests()
				require.Len(t, reqs, 1)
				require.Equal(t, "pal", reqs[0].Header.Get("X-Source"))
				require.JSONEq(t, `{"order":"o-17","status":"shipped"}`, string(reqs[0].Body))
				var d event.StepCompletedData
				require.NoError(t, completed(t, s, runID, "notify")[0].DecodeData(&d))
				require.Equal(t, "delivered", d.Delivery)
			},
		},
		"tool.json": {
			check: func(t *testing.T, _ *paltest.Stack, _ string, out map[string]any) {
				require.Equal(t, map[string]any{"status": float64(200), "body": map[string]any{"ok": true}}, out)
			},
		},
		"slow.json": {
			// The README kills a worker in the middle of it; here it only has
			// to finish, so each sleep is short.
			edit: func(wf string) string { return strings.Replace(wf, `{"ms": 1000}`, `{"ms": 5}`, 1) },
			check: func(t *testing.T, s *paltest.Stack, runID string, out map[string]any) {
				require.EqualValues(t, 15, out["iterations"])
				require.Len(t, completed(t, s, runID, "work[14].wait"), 1)
				require.Len(t, completed(t, s, runID, "work[14].note"), 1)
			},
		},
	}
}

// readmeMarker precedes the README's block of example commands: one
// pal run start line per file of examples/, with the input it needs.
const readmeMarker = "<!-- examples: examples/examples_test.go -->"

// readmeLine is one line of that block: the file and its --input.
var readmeLine = regexp.MustCompile(`^pal run start --workflow examples/([A-Za-z0-9_-]+\.json)(?: --input '([^']*)')?(?: --wait)?(?:\s+#.*)?$`)

// The addresses the README's inputs name: pal dev's API, whose /healthz
// the tool example reads, and a webhook receiver of the reader's. The
// test puts its own servers there.
const readmeAPI, readmeHook = "http://127.0.0.1:8080", "http://127.0.0.1:9000"

// readmeInputs returns the --input of each example's README line ("" for
// none), failing the test on a line it cannot read or a file named twice.
func readmeInputs(t *testing.T) map[string]string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "README.md"))
	require.NoError(t, err)
	_, after, ok := strings.Cut(string(raw), readmeMarker+"\n")
	require.True(t, ok, "README.md: no %s", readmeMarker)
	block, ok := strings.CutPrefix(after, "```sh\n")
	require.True(t, ok, "README.md: want a ```sh block right after %s", readmeMarker)
	block, _, ok = strings.Cut(block, "```")
	require.True(t, ok, "README.md: the examples block after %s is not closed", readmeMarker)
	inputs := map[string]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(block), "\n") {
		m := readmeLine.FindStringSubmatch(line)
		require.NotNil(t, m, "README.md: example line %q: want pal run start --workflow examples/NAME.json [--input '{…}'] [--wait] [# …]", line)
		_, dup := inputs[m[1]]
		require.False(t, dup, "README.md: %s has two lines", m[1])
		inputs[m[1]] = m[2]
	}
	return inputs
}

func TestExamples(t *testing.T) {
	files, err := filepath.Glob("*.json")
	require.NoError(t, err)
	cases := examples()
	var names []string
	for name := range cases {
		names = append(names, name)
	}
	slices.Sort(names)
	require.ElementsMatch(t, files, names, "every file in examples/ has a case here, and every case a file")
	inputs := readmeInputs(t)
	require.ElementsMatch(t, names, slices.Collect(maps.Keys(inputs)), "every example has one line in the README's block, and every line an example")

	// Answers as pal dev's /healthz does.
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"ok":true}`)
	}))
	t.Cleanup(api.Close)

	for _, name := range names {
		ex := cases[name]
		t.Run(strings.TrimSuffix(name, ".json"), func(t *testing.T) {
			t.Parallel()
			raw, err := os.ReadFile(name)
			require.NoError(t, err)
			wf := string(raw)
			if ex.edit != nil {
				edited := ex.edit(wf)
				require.NotEqual(t, wf, edited, "the edit must change the file (was it reworded?)")
				wf = edited
			}
			s := paltest.New(t)
			if ex.setup != nil {
				ex.setup(t, s)
			}
			s.Worker(t, "w1")
			input := inputs[name]
			if input == "" {
				input = "{}"
			}
			input = strings.NewReplacer(readmeHook, s.Hook.URL(), readmeAPI, api.URL).Replace(input)
			runID := s.Start(t, wf, input)
			if ex.during != nil {
				ex.during(t, s, runID)
			}
			end := s.WaitEnd(t, runID)
			require.Equal(t, event.RunSucceeded, end.Kind, "%s", end.Data)
			var d event.RunSucceededData
			require.NoError(t, end.DecodeData(&d))
			var out map[string]any
			require.NoError(t, json.Unmarshal(d.Output, &out), "%s", d.Output)
			ex.check(t, s, runID, out)
		})
	}
}

// completed is the run's step_completed events of step.
func completed(t *testing.T, s *paltest.Stack, runID, step string) []event.Event {
	t.Helper()
	var out []event.Event
	for _, ev := range s.Events(t, runID) {
		if ev.Kind == event.StepCompleted && ev.StepID == step {
			out = append(out, ev)
		}
	}
	return out
}

func countCalls(s *paltest.Stack, wire string) int {
	n := 0
	for _, c := range s.LLM.Calls() {
		if c.Provider == wire {
			n++
		}
	}
	return n
}
