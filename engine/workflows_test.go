package engine_test

// Workflows the tests run. Each parses; the histories carry them as
// run_created snapshots.

// wfSummarise: three ai-steps in a row; draft retries LLM errors and
// timeouts.
const wfSummarise = `{
  "name": "summarise-review-publish",
  "nodes": [
    {"id": "start", "type": "trigger"},
    {"id": "draft", "type": "ai-step",
     "data": {"provider": "openai", "model": "gpt-4o-mini",
              "prompt": "Summarise: {{input.text}}",
              "retry": {"maxAttempts": 3, "backoffMs": 500, "retryableClasses": ["llm", "timeout"]}}},
    {"id": "review", "type": "ai-step",
     "data": {"provider": "anthropic", "model": "claude-sonnet-4-5", "system": "You are a careful editor.",
              "prompt": "Check this summary: {{steps.draft.output.text}}"}},
    {"id": "publish", "type": "ai-step",
     "data": {"provider": "openai", "model": "gpt-4o-mini", "maxTokens": 32, "temperature": 0.2,
              "messages": [{"role": "system", "content": "Write a headline for {{input.audience}}."},
                           {"role": "user", "content": "{{steps.review.output.text}}"}]}}
  ],
  "edges": [{"from": "start", "to": "draft"}, {"from": "draft", "to": "review"},
            {"from": "review", "to": "publish"}]
}`

const inputSummarise = `{"text":"PAL journals every step of an agent run to JetStream, so a crash loses nothing.","audience":"engineers"}`

// wfNotify is the example workflow of docs/architecture.md §7.3: two
// ai-steps and a webhook.
const wfNotify = `{
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
              "headers": {"X-Run-Source": "{{input.source}}"},
              "body": {"summary": "{{steps.review.output.text}}", "tokens": "{{input.budget}}"},
              "retry": {"maxAttempts": 2, "retryableClasses": ["connector"]}}}
  ],
  "edges": [{"from": "start", "to": "draft"}, {"from": "draft", "to": "review"},
            {"from": "review", "to": "notify"}]
}`

const inputNotify = `{"text":"Quarterly numbers are up 12%.","source":"cron","budget":2000}`

// wfTriage branches on edge conditions and joins again: exactly one of
// escalate and reply runs, then log.
const wfTriage = `{
  "name": "triage",
  "nodes": [
    {"id": "start", "type": "trigger"},
    {"id": "classify", "type": "ai-step",
     "data": {"provider": "openai", "model": "gpt-4o-mini", "system": "Answer urgent or routine.",
              "prompt": "Ticket: {{input.ticket.body}}"}},
    {"id": "escalate", "type": "ai-step",
     "data": {"provider": "anthropic", "model": "claude-sonnet-4-5",
              "prompt": "Write a page for on-call about: {{input.ticket.body}}"}},
    {"id": "reply", "type": "ai-step",
     "data": {"provider": "openai", "model": "gpt-4o-mini",
              "prompt": "Write a friendly reply to: {{input.ticket.body}}"}},
    {"id": "log", "type": "tool",
     "data": {"tool": "audit_log", "input": {"ticket": "{{input.ticket.id}}", "label": "{{steps.classify.output.text}}"}}}
  ],
  "edges": [
    {"from": "start", "to": "classify"},
    {"from": "classify", "to": "escalate", "condition": "steps.classify.output.text == 'urgent'"},
    {"from": "classify", "to": "reply", "condition": "steps.classify.output.text != 'urgent'"},
    {"from": "escalate", "to": "log"},
    {"from": "reply", "to": "log"}
  ]
}`

const inputTriage = `{"ticket":{"id":4711,"body":"How do I export my invoices?"}}`

// wfGate scores a text with a tool, decides with a condition node and
// publishes or holds.
const wfGate = `{
  "name": "sentiment-gate",
  "nodes": [
    {"id": "start", "type": "trigger"},
    {"id": "sentiment", "type": "tool",
     "data": {"tool": "sentiment", "input": {"text": "{{input.text}}"},
              "retry": {"maxAttempts": 2, "retryableClasses": ["tool"]}}},
    {"id": "check", "type": "condition", "data": {"expression": "steps.sentiment.output.score > 0.8"}},
    {"id": "publish", "type": "connector",
     "data": {"kind": "webhook", "url": "{{input.hook}}", "method": "PUT",
              "body": {"text": "{{input.text}}", "score": "{{steps.sentiment.output.score}}"}}},
    {"id": "hold", "type": "tool", "data": {"tool": "queue_for_review", "input": {"text": "{{input.text}}"}}}
  ],
  "edges": [
    {"from": "start", "to": "sentiment"},
    {"from": "sentiment", "to": "check"},
    {"from": "check", "to": "publish", "condition": "steps.check.output.result"},
    {"from": "check", "to": "hold", "condition": "!steps.check.output.result"}
  ]
}`

const inputGate = `{"text":"We shipped it, and it is fast.","hook":"https://example.test/posts/42"}`

// wfInvalid is not a workflow Parse accepts (an approval node is not
// implemented, and review names a step that does not exist).
const wfInvalid = `{"name":"needs-approval","nodes":[{"id":"start","type":"trigger"},` +
	`{"id":"ok","type":"approval","data":{}},` +
	`{"id":"review","type":"ai-step","data":{"provider":"openai","model":"gpt-4o-mini","prompt":"{{steps.nope.output}}"}}],` +
	`"edges":[{"from":"start","to":"ok"},{"from":"ok","to":"review"}]}`

// wfRelease asks for an approval that times out after an hour; nothing
// routes on the decision, so a timeout fails the run.
const wfRelease = `{
  "name": "release",
  "nodes": [
    {"id": "start", "type": "trigger"},
    {"id": "ok", "type": "approval",
     "data": {"prompt": "Release {{input.version}}?", "approvers": ["ana", "bo"], "timeoutMs": 3600000}},
    {"id": "ship", "type": "tool", "data": {"tool": "deploy", "input": {"version": "{{input.version}}"}}}
  ],
  "edges": [{"from": "start", "to": "ok"}, {"from": "ok", "to": "ship"}]
}`

// wfReleaseRouted is wfRelease with the decision routed: a timeout goes
// to page.
const wfReleaseRouted = `{
  "name": "release-routed",
  "nodes": [
    {"id": "start", "type": "trigger"},
    {"id": "ok", "type": "approval",
     "data": {"prompt": "Release {{input.version}}?", "timeoutMs": 3600000}},
    {"id": "ship", "type": "tool", "data": {"tool": "deploy", "input": {"version": "{{input.version}}"}}},
    {"id": "page", "type": "tool", "data": {"tool": "page_oncall", "input": {"why": "release {{input.version}} not approved in time"}}}
  ],
  "edges": [
    {"from": "start", "to": "ok"},
    {"from": "ok", "to": "ship", "condition": "steps.ok.output.approved"},
    {"from": "ok", "to": "page", "condition": "steps.ok.output.timed_out"}
  ]
}`

const inputRelease = `{"version":"2.4.0"}`

// wfDeploy waits twice for signal "go" (an hour at most each), then
// deploys; nothing routes on a timeout, so one fails the run.
const wfDeploy = `{
  "name": "deploy-on-signal",
  "nodes": [
    {"id": "start", "type": "trigger"},
    {"id": "first", "type": "wait", "data": {"signal": "go", "timeoutMs": 3600000}},
    {"id": "second", "type": "wait", "data": {"signal": "go", "timeoutMs": 3600000}},
    {"id": "ship", "type": "tool", "data": {"tool": "deploy", "input": {"by": "{{steps.second.output.by}}"}}}
  ],
  "edges": [{"from": "start", "to": "first"}, {"from": "first", "to": "second"}, {"from": "second", "to": "ship"}]
}`

// wfDeployRouted waits for "go"; a timeout goes to page.
const wfDeployRouted = `{
  "name": "deploy-routed",
  "nodes": [
    {"id": "start", "type": "trigger"},
    {"id": "hold", "type": "wait", "data": {"signal": "go", "timeoutMs": 3600000}},
    {"id": "ship", "type": "tool", "data": {"tool": "deploy", "input": {}}},
    {"id": "page", "type": "tool", "data": {"tool": "page_oncall", "input": {"why": "no go signal in time"}}}
  ],
  "edges": [
    {"from": "start", "to": "hold"},
    {"from": "hold", "to": "ship", "condition": "steps.hold.output.timed_out != true"},
    {"from": "hold", "to": "page", "condition": "steps.hold.output.timed_out == true"}
  ]
}`
