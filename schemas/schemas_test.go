package schemas_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/palrun/pal/event"
	"github.com/palrun/pal/schemas"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestSchemasCompile(t *testing.T) {
	t.Parallel()

	ev, err := schemas.Event()
	require.NoError(t, err)
	require.NotNil(t, ev)
	wf, err := schemas.Workflow()
	require.NoError(t, err)
	require.NotNil(t, wf)

	for _, raw := range [][]byte{schemas.EventSchema, schemas.WorkflowSchema} {
		require.True(t, json.Valid(raw))
	}
}

// schemaKinds returns the kind enum of the event schema.
func schemaKinds(t *testing.T) []string {
	t.Helper()
	var doc struct {
		Defs struct {
			Event struct {
				Properties struct {
					Kind struct {
						Enum []string `json:"enum"`
					} `json:"kind"`
				} `json:"properties"`
			} `json:"event"`
		} `json:"$defs"`
	}
	require.NoError(t, json.Unmarshal(schemas.EventSchema, &doc))
	return doc.Defs.Event.Properties.Kind.Enum
}

func TestEventKindsMatchSchema(t *testing.T) {
	t.Parallel()

	var kinds []string
	for _, k := range event.Kinds {
		kinds = append(kinds, string(k))
	}
	// Same set, same order: the schema lists kinds as event.Kinds does.
	require.Equal(t, kinds, schemaKinds(t))
}

// samplePayloads has one payload per kind, built from the structs in package
// event, with every optional field set so the schema's checks on them run.
func samplePayloads() map[event.Kind]any {
	key := event.IdempotencyKey("run_01J", "draft", 1)
	usage := &event.Usage{InputTokens: 10, OutputTokens: 20, TotalTokens: 30, CostUSD: 0.0012}
	return map[event.Kind]any{
		event.ApprovalReceived: event.ApprovalReceivedData{Decision: event.DecisionApprove, Approver: "ana", Comment: "ship it"},
		event.SubstepStarted:   event.SubstepStartedData{Name: "fetch"},
		event.SubstepCompleted: event.SubstepCompletedData{Name: "fetch", Output: json.RawMessage(`{"pages":3}`)},
		event.SignalReceived:   event.SignalReceivedData{Signal: "go", Payload: json.RawMessage(`{"by":"ana"}`), By: "ana"},
		event.RunCreated: event.RunCreatedData{
			Workflow:       json.RawMessage(`{"name":"w","nodes":[{"id":"start","type":"trigger"}]}`),
			WorkflowHash:   "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
			WorkflowName:   "w",
			Input:          json.RawMessage(`{"text":"hello"}`),
			ParentRunID:    "run_parent",
			ParentStepID:   "sub",
			Depth:          1,
			TriggerMeta:    map[string]any{"source": "api"},
			Prices:         event.Prices{"gpt-4o": {InputPerMTok: 2.5, OutputPerMTok: 10}},
			IdempotencyKey: "client-key-1",
			Labels:         map[string]string{"customer": "acme", "env": "prod"},
			Thread:         "support-42",
			Budget: &event.Budget{MaxCostUSD: 1.5, MaxTokens: 1000, MaxSteps: 20, MaxDurationMs: 60000,
				WarnAt: 0.8, OnExceed: event.OnExceedPause},
			Anomalies: map[string]event.AnomalyRule{event.AnomalyRetryStorm: {Threshold: 20, PerStep: 5, Action: event.ActionRecord}},
			ForkedFrom: &event.ForkedFrom{RunID: "run_source", StepID: "review", Seq: 9,
				Copies: []event.CopiedStep{{StepID: "draft", NodeID: "draft", NodeType: "ai-step", Output: json.RawMessage(`{"text":"x"}`),
					Delivery: event.DeliveryDelivered, Seq: 5, NodeHash: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}},
				Rerun: []event.RerunStep{{StepID: "plan", Reason: "node changed"}}},
			Deployed: &event.Deployed{Name: "w", Version: 3, SHA256: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"},
		},
		event.RunResumed:  event.RunResumedData{Worker: "w1", ResumeCount: 2, Crashed: true, CrashesAtStep: 1},
		event.StepStarted: event.StepStartedData{NodeID: "draft", NodeType: "ai-step", Input: json.RawMessage(`{"prompt":"x"}`), IdempotencyKey: key},
		event.StepCompleted: event.StepCompletedData{Output: json.RawMessage(`{"text":"done"}`), Usage: usage, DurationMs: 12, Delivery: event.DeliveryDelivered, Stderr: "warning: slow",
			SignalSeq: 4, CopiedFrom: &event.CopiedFrom{RunID: "run_source", Seq: 5, NodeHash: "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"}},
		event.StepFailed:   event.StepFailedData{Error: "boom", Class: event.ClassLLM, DurationMs: 3, OutcomeUnknown: true, Stderr: "Traceback", Usage: usage},
		event.StepRetrying: event.StepRetryingData{Attempt: 2, Of: 3, Error: "timeout", Class: event.ClassTimeout, DelayMs: 500},
		event.StepWaiting:  event.StepWaitingData{Reason: event.WaitChild, ChildRunID: "run_child", TimeoutAt: "2030-01-02T03:04:05Z"},
		event.SideEffectClaimed: event.SideEffectClaimedData{
			IdempotencyKey: key, Connector: "webhook", Target: "https://example.test/hook",
		},
		event.SideEffectDelivered: event.SideEffectDeliveredData{IdempotencyKey: key, Status: 202},
		event.ChildRunCreated:     event.ChildRunCreatedData{ChildRunID: event.ChildRunID("run_parent", "sub"), Workflow: "child"},
		event.AnomalyDetected:     event.AnomalyDetectedData{Type: event.AnomalyRetryStorm, Observed: 12, Threshold: 10, Action: event.ActionHalt, StepID: "draft", Detail: "12 retries"},
		event.ConfidenceEvaluated: event.ConfidenceEvaluatedData{Score: 0.42, Min: 0.8, Source: "logprobs",
			Output: json.RawMessage(`{"text":"maybe","confidence":0.42}`), Usage: usage},
		event.ConfidenceGateBypassed: event.ConfidenceGateBypassedData{By: "alice", Reason: "checked by hand"},
		event.RunSucceeded:           event.RunSucceededData{Output: json.RawMessage(`{"ok":true}`)},
		event.RunFailed:              event.RunFailedData{Error: "step draft failed", Code: event.CodeStepFailed, StepID: "draft"},
		event.RunCancelled:           event.RunCancelledData{Reason: "user asked", By: "alice"},
		event.BudgetWarning:          event.BudgetWarningData{Limit: event.LimitCost, Spent: 0.8, Max: 1, StepID: "draft"},
		event.BudgetExceeded:         event.BudgetExceededData{Limit: event.LimitTokens, Spent: 900, Max: 1000, StepID: "draft", Action: event.OnExceedFail, Need: 200},
		event.BudgetRaised:           event.BudgetRaisedData{AddUSD: 2, AddTokens: 100, AddSteps: 3, AddMs: 1000, By: "ana"},
	}
}

func sampleEvent(t *testing.T, k event.Kind, seq uint64, payload any) event.Event {
	t.Helper()
	stepID, attempt := "", 0
	if k != event.RunCreated && k != event.RunResumed && !k.Terminal() {
		stepID, attempt = "draft", 1
	}
	ev, err := event.New(k, stepID, attempt, payload)
	require.NoError(t, err)
	ev.RunID = "run_01J"
	ev.Seq = seq
	ev.TS = time.Date(2030, 1, 2, 3, 4, 5, 6000, time.UTC)
	ev.WorkerID = "w1"
	ev.TraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
	return ev
}

func TestSamplePayloadsValidate(t *testing.T) {
	t.Parallel()

	payloads := samplePayloads()
	for i, k := range event.Kinds {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
			payload, ok := payloads[k]
			require.True(t, ok, "no sample payload for kind %s: add one", k)

			body, err := event.Encode(sampleEvent(t, k, uint64(i+1), payload))
			require.NoError(t, err)
			require.NoError(t, schemas.ValidateEvent(body))

			// The zero payload is valid too for kinds without required fields;
			// for the others the schema must name what is missing.
			zero, err := event.Encode(sampleEvent(t, k, 1, nil))
			require.NoError(t, err)
			err = schemas.ValidateEvent(zero)
			switch k {
			case event.RunCancelled:
				require.NoError(t, err)
			default:
				require.ErrorContains(t, err, "/data: missing propert")
			}
		})
	}
}

func TestPackedEventsValidate(t *testing.T) {
	t.Parallel()

	payloads := samplePayloads()
	var evs []event.Event
	for i, k := range []event.Kind{event.StepCompleted, event.StepStarted} {
		evs = append(evs, sampleEvent(t, k, uint64(i+4), payloads[k]))
	}
	body, err := event.Encode(evs...)
	require.NoError(t, err)
	require.Equal(t, byte('['), body[0])
	require.NoError(t, schemas.ValidateEvent(body))

	// One envelope in an array is the packed form too.
	one, err := json.Marshal(evs[:1])
	require.NoError(t, err)
	require.NoError(t, schemas.ValidateEvent(one))
}

func TestInvalidEvents(t *testing.T) {
	t.Parallel()

	valid := `"v":1,"run_id":"run_1","seq":1,"ts":"2030-01-02T03:04:05Z","worker_id":"w1"`
	tests := []struct {
		name string
		body string
		want string
	}{
		{"empty batch", `[]`, "invalid event: /: minItems: got 0, want 1"},
		{"not an object", `42`, "invalid event: /: got number, want object"},
		{"unknown kind", `{` + valid + `,"kind":"step_exploded","data":{}}`,
			"invalid event: /kind: value must be one of 'run_created', 'run_resumed', 'step_started', 'step_completed', 'step_failed', 'step_retrying', 'step_waiting', 'side_effect_claimed', 'side_effect_delivered', 'child_run_created', 'anomaly_detected', 'confidence_evaluated', 'confidence_gate_bypassed', 'run_succeeded', 'run_failed', 'run_cancelled', 'approval_received', 'substep_started', 'substep_completed', 'budget_warning', 'budget_exceeded', 'budget_raised', 'signal_received'"},
		{"bad run id", `{"v":1,"run_id":"run.1","seq":1,"kind":"run_cancelled","ts":"2030-01-02T03:04:05Z","worker_id":"w","data":{}}`,
			"invalid event: /run_id: 'run.1' does not match pattern '^[A-Za-z0-9_-]{1,128}$'"},
		{"seq zero", `{"v":1,"run_id":"run_1","seq":0,"kind":"run_cancelled","ts":"2030-01-02T03:04:05Z","worker_id":"w","data":{}}`,
			"invalid event: /seq: minimum: got 0, want 1"},
		{"seq fraction", `{"v":1,"run_id":"run_1","seq":1.5,"kind":"run_cancelled","ts":"2030-01-02T03:04:05Z","worker_id":"w","data":{}}`,
			"invalid event: /seq: got number, want integer"},
		{"bad ts", `{"v":1,"run_id":"run_1","seq":1,"kind":"run_cancelled","ts":"yesterday","worker_id":"w","data":{}}`,
			"invalid event: /ts: 'yesterday' is not valid date-time: less than 20 characters long"},
		{"version 2", `{"v":2,"run_id":"run_1","seq":1,"kind":"run_cancelled","ts":"2030-01-02T03:04:05Z","worker_id":"w","data":{}}`,
			"invalid event: /v: value must be 1"},
		{"unknown envelope field", `{` + valid + `,"kind":"run_cancelled","data":{},"extra":1}`,
			"invalid event: /: additional properties 'extra' not allowed"},
		{"step kind without step id", `{` + valid + `,"kind":"step_failed","data":{"error":"x","class":"llm","duration_ms":1}}`,
			"invalid event: /: missing property 'step_id'"},
		{"completed without output", `{` + valid + `,"kind":"step_completed","step_id":"a","data":{"duration_ms":1}}`,
			"invalid event: /data: missing property 'output' or 'output_blob'"},
		{"output and its blob", `{` + valid + `,"kind":"step_completed","step_id":"a","data":{"duration_ms":1,"output":1,"output_blob":{"blob":"` + strings.Repeat("a", 64) + `","size":1}}}`,
			"invalid event: /data: 'oneOf' failed, subschemas 0, 1 matched"},
		{"blob not a sum", `{` + valid + `,"kind":"step_completed","step_id":"a","data":{"duration_ms":1,"output_blob":{"blob":"../x","size":1}}}`,
			"invalid event: /data/output_blob/blob: '../x' does not match pattern '^[0-9a-f]{64}$'"},
		{"bad idempotency key", `{` + valid + `,"kind":"step_started","step_id":"a","data":{"node_id":"a","node_type":"tool","idempotency_key":"abc"}}`,
			"invalid event: /data/idempotency_key: 'abc' does not match pattern '^[0-9a-f]{64}$'"},
		{"unknown anomaly", `{` + valid + `,"kind":"anomaly_detected","data":{"type":"vibes","observed":1,"threshold":1,"action":"halt","step_id":"s"}}`,
			"invalid event: /data/type: value must be one of 'runaway_loop', 'excessive_steps', 'retry_storm', 'cost_spike', 'token_spike'"},
		{"negative price", `{` + valid + `,"kind":"run_created","data":{"input":{},"depth":0,"prices":{"gpt-4o":{"input_per_mtok":-1,"output_per_mtok":10}}}}`,
			"invalid event: /data/prices/gpt-4o/input_per_mtok: minimum: got -1, want 0"},
		{"half a price", `{` + valid + `,"kind":"run_created","data":{"input":{},"depth":0,"prices":{"gpt-4o":{"input_per_mtok":1}}}}`,
			"invalid event: /data/prices/gpt-4o: missing property 'output_per_mtok'"},
		{"deployed version zero", `{` + valid + `,"kind":"run_created","data":{"input":{},"depth":0,"deployed":{"name":"triage","version":0,"sha256":"` + strings.Repeat("a", 64) + `"}}}`,
			"invalid event: /data/deployed/version: minimum: got 0, want 1"},
		{"deployed name with a dot", `{` + valid + `,"kind":"run_created","data":{"input":{},"depth":0,"deployed":{"name":"a.b","version":1,"sha256":"` + strings.Repeat("a", 64) + `"}}}`,
			"invalid event: /data/deployed/name: 'a.b' does not match pattern '^[A-Za-z0-9_-]{1,128}$'"},
		{"schedule with a dot", `{` + valid + `,"kind":"run_created","data":{"input":{},"depth":0,"schedule":"a.b","tick":"2026-12-05T03:00:00Z"}}`,
			"invalid event: /data/schedule: 'a.b' does not match pattern '^[A-Za-z0-9_-]{1,128}$'"},
		{"second of batch bad", `[{` + valid + `,"kind":"run_cancelled","data":{}},{` + valid + `,"kind":"run_succeeded","data":{}}]`,
			"invalid event: /1/data: missing property 'output' or 'output_blob'"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := schemas.ValidateEvent([]byte(tt.body))
			require.EqualError(t, err, tt.want)
			var ie *schemas.InvalidError
			require.ErrorAs(t, err, &ie)
			require.Equal(t, "event", ie.What)
		})
	}
}

func TestEventPayloadsMayGrow(t *testing.T) {
	t.Parallel()

	body := `{"v":1,"run_id":"run_1","seq":1,"kind":"run_succeeded","ts":"2030-01-02T03:04:05Z","worker_id":"w",` +
		`"data":{"output":null,"added_later":{"x":1}}}`
	require.NoError(t, schemas.ValidateEvent([]byte(body)))
}

func TestValidateEventMalformedJSON(t *testing.T) {
	t.Parallel()

	for _, body := range []string{``, `{`, `{"v":1} {}`, `nope`} {
		err := schemas.ValidateEvent([]byte(body))
		require.ErrorIs(t, err, schemas.ErrInvalidJSON, "body %q", body)
	}
}

func decode(t *testing.T, s string) any {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader([]byte(s)))
	dec.UseNumber()
	var doc any
	require.NoError(t, dec.Decode(&doc))
	return doc
}

const designExample = `{
  "name": "summarise-and-notify",
  "nodes": [
    {"id": "start",  "type": "trigger"},
    {"id": "draft",  "type": "ai-step",
     "data": {"provider": "openai", "model": "gpt-4o-mini",
              "prompt": "Summarise: {{input.text}}",
              "retry": {"maxAttempts": 3, "backoffMs": 500, "retryableClasses": ["llm"]}}},
    {"id": "review", "type": "ai-step",
     "data": {"provider": "anthropic", "model": "claude-sonnet-4-5",
              "prompt": "Check this summary: {{steps.draft.output.text}}"}},
    {"id": "notify", "type": "connector",
     "data": {"kind": "webhook", "url": "https://example.test/hook",
              "body": {"summary": "{{steps.review.output.text}}"}}}
  ],
  "edges": [{"from": "start", "to": "draft"}, {"from": "draft", "to": "review"},
            {"from": "review", "to": "notify"}]
}`

func TestValidateWorkflow(t *testing.T) {
	t.Parallel()

	require.NoError(t, schemas.ValidateWorkflow(decode(t, designExample)))

	err := schemas.ValidateWorkflow(decode(t, `{"name":"w","nodes":[{"id":"a","type":"ai-step","data":{"provider":"p","model":"m"}}]}`))
	var ie *schemas.InvalidError
	require.ErrorAs(t, err, &ie)
	require.Len(t, ie.Violations, 1)
	v := ie.Violations[0]
	require.Equal(t, []string{"nodes", "0", "data"}, v.Path)
	require.Equal(t, "/nodes/0/data", v.Pointer())
	require.Equal(t, "required", v.Keyword)
	require.True(t, v.Alternatives)
	require.Equal(t, "missing property 'prompt' or 'messages'", v.Message)

	def, ok := schemas.Lookup(v.SchemaURL)
	require.True(t, ok)
	require.Contains(t, def.(map[string]any)["properties"], "messages")
}

func TestViolationsSorted(t *testing.T) {
	t.Parallel()

	doc := decode(t, `{"name":"w","nodes":[`+
		`{"id":"n0","type":"tool","data":{}},{"id":"n1","type":"tool","data":{}},{"id":"n2","type":"tool","data":{}},`+
		`{"id":"n3","type":"tool","data":{}},{"id":"n4","type":"tool","data":{}},{"id":"n5","type":"tool","data":{}},`+
		`{"id":"n6","type":"tool","data":{}},{"id":"n7","type":"tool","data":{}},{"id":"n8","type":"tool","data":{}},`+
		`{"id":"n9","type":"tool","data":{}},{"id":"n10","type":"tool","data":{}}]}`)
	vs := schemas.Violations(schemas.ValidateWorkflow(doc))
	var got []string
	for _, v := range vs {
		got = append(got, v.Path[1])
	}
	require.True(t, slices.Equal(got, []string{"0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10"}), "%v", got)
	require.Nil(t, schemas.Violations(errors.New("other")))
}

func TestLookup(t *testing.T) {
	t.Parallel()

	v, ok := schemas.Lookup(schemas.WorkflowSchemaID + "#/$defs/retry/properties/maxAttempts/minimum")
	require.True(t, ok)
	require.Equal(t, json.Number("1"), v)

	for _, u := range []string{
		"https://example.test/other.json#/x",
		schemas.WorkflowSchemaID + "#/$defs/nope",
		schemas.WorkflowSchemaID + "#/$defs/node/allOf/99",
	} {
		_, ok := schemas.Lookup(u)
		require.False(t, ok, u)
	}
}
