// Package workflow defines PAL's workflow graphs: the JSON format, its
// validation (Parse), the templates that feed step inputs (RenderString,
// RenderJSON) and the conditions that choose edges (EdgeFires, Eval).
//
// # Format
//
// A workflow is a JSON object with a name, nodes and edges. It is checked
// against schemas/workflow.schema.json, which refuses unknown fields at every
// level so that a typo is an error rather than a silently ignored setting.
//
//	{
//	  "name": "summarise-and-notify",
//	  "nodes": [
//	    {"id": "start",  "type": "trigger"},
//	    {"id": "draft",  "type": "ai-step",
//	     "data": {"provider": "openai", "model": "gpt-4o-mini",
//	              "prompt": "Summarise: {{input.text}}",
//	              "retry": {"maxAttempts": 3, "backoffMs": 500, "retryableClasses": ["llm"]}}},
//	    {"id": "review", "type": "ai-step",
//	     "data": {"provider": "anthropic", "model": "claude-sonnet-4-5",
//	              "prompt": "Check this summary: {{steps.draft.output.text}}"}},
//	    {"id": "notify", "type": "connector",
//	     "data": {"kind": "webhook", "url": "https://example.test/hook",
//	              "body": {"summary": "{{steps.review.output.text}}"}}}
//	  ],
//	  "edges": [{"from": "start", "to": "draft"}, {"from": "draft", "to": "review"},
//	            {"from": "review", "to": "notify"}]
//	}
//
// Node ids are 1 to 64 letters, digits, '_' or '-', unique in the workflow;
// a node's id is its step id in the journal, so renaming a node changes the
// workflow's identity for runs in flight. The node types are:
//
//   - trigger: where the run starts, with the run input. Exactly one; it takes
//     no data and no edge may lead into it.
//
//   - ai-step: one LLM call. data: provider and model (required), prompt or
//     messages (at least one; each message has a role of system, user or
//     assistant and a content, and a user message may carry images: url, or
//     blob and mediaType), system, maxTokens, temperature (0 to 2),
//     timeoutMs, retry, responseSchema. prompt, system, message contents
//     and image urls and blobs are templates. model may be a fallback list
//     of "provider/model" names (then provider is left out): the step moves
//     to the next once its retry policy is spent on one, or at once on an
//     outage. With responseSchema (a JSON Schema) the answer must be JSON
//     that matches it, else the attempt fails (class llm); its parsed value
//     is steps.<id>.output.json. fake (an agent's too) scripts pal dev's
//     fake provider and no other (Fake): turns of toolCalls, text or json,
//     and fail {status, times}.
//
//   - tool: a Go function registered on the worker under data.tool, or a
//     built-in tool: "http" (one HTTP request), "echo" (returns its input)
//     or "sleep" ({"ms": N} waits N milliseconds). data: tool (required),
//     input (any JSON; every string in it is a template), timeoutMs, retry.
//
//   - connector: an external delivery with a receipt. data: kind ("webhook"
//     or "email"), timeoutMs, retry, and for a webhook url (required),
//     method (POST, PUT, PATCH, DELETE or GET), headers (string values),
//     body (any JSON). The url, header values and every string in body are
//     templates. A url must start with http:// or https://, or with a
//     placeholder. An email has from, to and subject (required), cc, and
//     text and/or html, all templates; to and cc are address lists
//     ("a@example.com, Bea <b@example.com>").
//
//   - condition: evaluates data.expression and outputs {"result": value};
//     the edges out of it branch on steps.<id>.output.result.
//
//   - approval: parks the run until someone approves or rejects it (pal run
//     approve, pal.cmd.runs.approve, pal.api.runs.approve or POST
//     /v1/runs/{id}/approve). data (all optional): prompt (a template shown
//     to the approver), approvers (who may decide), timeoutMs. The step's
//     output is {"approved", "decision", "approver", "comment", "timed_out"}.
//     A decision may arrive before the run reaches the step; it is kept and
//     applied then. With no condition on any edge out of the node, a
//     rejection or a timeout fails the run; with conditions, the output
//     routes it (e.g. "steps.ok.output.timed_out").
//
//   - wait: parks the run until a signal named data.signal arrives (pal run
//     signal, pal.cmd.runs.signal, pal.api.runs.signal or POST
//     /v1/runs/{id}/signals/{name}); data.timeoutMs is optional. The
//     output is the signal's payload. Signals sent before the run reaches
//     the node are kept, first in first out per name, and each is taken by
//     one wait step. A timeout completes the step with {"signal",
//     "timed_out": true}: with no condition on any edge out of the node it
//     fails the run, with conditions it routes it.
//
//   - loop: runs data.body, a whole workflow document with its own trigger,
//     once per item of data.over (a template giving an array) or until
//     data.until (an expression over the iteration's input and steps) is
//     true, at most data.maxIterations times (default 100). Each
//     iteration's input is {"item", "index", "with"}, where with is
//     data.with rendered against the outer run. Step ids carry the
//     iteration: each[3].fetch. The loop's output is {"iterations",
//     "results" (each iteration's last output), "stopped"}.
//     data.concurrency (1 to 1000, default 1) lets that many iterations
//     be in progress at once, within the run's policy.concurrency; later
//     ones start as earlier ones finish, and results keep the items'
//     order. A loop with until runs one at a time.
//
//   - subagent: runs data.workflow (a whole workflow document) as a child
//     run with data.input (strings are templates). The child's id is
//     derived from the parent run and step, so a re-driven parent adopts
//     it; the child's output is the step's output. Children nest at most 5
//     deep.
//
//   - agent: an LLM tool-use loop. data: provider, model, prompt (required),
//     system, tools ([{"name","description","parameters"}], implemented by
//     Go functions registered on the worker under those names), maxTurns
//     (default 10), maxTokens, temperature, timeoutMs, retry,
//     responseSchema (the final answer's; its value is output.json). model
//     may be a fallback list as for an ai-step. Each model turn and each
//     tool call is a step: ask.turn[0], ask.turn[0].tool[0]. The output is
//     {"text", "turns", "json"?}. data.parallelToolCalls (default true)
//     runs one turn's tool calls at once; the next turn lists their
//     results in the model's order.
//
//   - process: a program the worker runs in a sandbox (package
//     internal/sandbox). data: command (argv, required: command[0] is a
//     name on the sandbox's PATH or an absolute path, never a template;
//     every other element is a template rendered to one argument, but not
//     the code or script argument of a shell or interpreter, nor any
//     argument of a launcher such as env or xargs), env (values are
//     templates; no PATH, HOME, TMPDIR, LD_*, PAL_* or other variable
//     that makes the loader or a shell run other code; PYTHON*,
//     NODE_OPTIONS and the like only as constants), workdir (in the
//     sandbox), input (written to stdin as JSON; strings are templates),
//     network (none, the default, or egress: through the worker, where its
//     egress policy allows), timeoutMs (default 1 h), maxResumes (default
//     3), limits {memoryMb, cpuSeconds, maxProcesses (default 256),
//     fileSizeMb, workdirMb (default 256)}. The output is the JSON the
//     program writes to fd 3, else its last stdout line. The program
//     reports its own sub-steps (package sdk, or sdk/python); a step
//     re-driven more than maxResumes times without completing fails the
//     run with process_resume_exhausted. Process steps are not retried.
//
// The retry policy, data.retry on ai-step, tool, connector, subagent and
// agent nodes, is
// {"maxAttempts": 3, "backoffMs": 500, "retryableClasses": ["llm"]}:
// maxAttempts counts the first try (default 1), classes are any, timeout,
// llm, connector and tool.
//
// A node's "onFailure" (beside id and type) says what its failed step,
// after its retries, does: "fail" (the default) fails the run, and the
// steps in flight beside it are interrupted; "continue" lets the run go
// on: the node counts as resolved, its outgoing edges are evaluated, and
// their conditions read steps.<id>.status == "failed" and
// steps.<id>.error (Node.Continues).
//
// # Policy
//
// A workflow may carry run-wide brakes under "policy" (Policy):
// "budget" {maxCostUsd, maxTokens, maxSteps, maxDurationMs, warnAt,
// onExceed: fail | pause} and "anomalies" {<type>: {threshold, perStep,
// requests, floor, action: record | halt | pause}} for the types
// runaway_loop, excessive_steps, retry_storm, cost_spike and token_spike.
// The engine enforces them (docs/architecture.md §7.8, §7.9); a loop
// body's policy is ignored, a subagent's workflow's applies to its child
// run. "concurrency" (1 to 1000, default 8: Workflow.Concurrency) is how
// many of a run's steps may be in flight at once: the branches of the
// graph that are ready together, a parallel loop's iterations and an
// agent turn's tool calls all count; a worker caps it with
// PAL_RUN_CONCURRENCY.
//
// An ai-step or agent may gate its answer with data.confidence:
// {"min": 0.8, "source": "logprobs" | "field" | "judge", "field": "a.b",
// "judge": {"provider", "model", "prompt"}, "onLow": "fail" | "approval" |
// "retry" | "route"} (Node.Confidence). The score is
// steps.<id>.output.confidence. A logprobs gate on provider anthropic, a
// field gate without field and a retry gate without retry.maxAttempts ≥ 2
// are refused. The workflow's "policy": {"confidenceGate": "off"} turns
// every gate off (Workflow.GateOff).
//
// # Graph
//
// Edges go from one node to another and may carry a condition. The graph
// must be acyclic (a loop node repeats steps), every node must
// be reachable from the trigger, and two edges may not join the same pair of
// nodes. Order returns the nodes in topological order, ties broken by
// declaration order; Incoming and Outgoing return a node's edges.
//
// # Templates
//
// A template is a string with placeholders: {{path}}, where path starts with
// input (the run input) or steps.<node id>.output (that step's output), and
// continues with .field and [index] steps:
//
//	{{input.text}}
//	{{steps.draft.output.text}}
//	{{ steps.fetch.output.items[0].url }}
//
// Spaces inside the braces are allowed; `\{{` writes a literal "{{". A
// template may only read the output of a node that runs before its own
// node: one from which a path of edges leads to it. Parse checks this, as
// it checks that every named node exists.
//
// RenderString inserts strings as they are, numbers as written and other
// values as compact JSON. RenderJSON renders every string inside a JSON
// value (tool input, connector body); a string that is exactly one
// placeholder is replaced by the value itself, so "{{steps.fetch.output}}"
// becomes an object and "{{input.count}}" a number. A placeholder whose value
// is missing is an error that names it:
//
//	template {{steps.draft.output.txt}}: steps.draft.output has no field "txt"
//
// Rendering is pure: the same template and values always give the same
// result, which is what lets a re-driven run rebuild a step's input
// exactly.
//
// {{secrets.NAME}} is not rendered: the placeholder stays as it is, so the
// rendered input (journaled in step_started) holds the reference and never
// the value. The worker replaces it as it sends, in the url and header
// values of the http tool and of connectors only, with its variable
// PAL_SECRET_NAME.
//
// # Conditions
//
// Edge conditions and condition nodes are expressions in the expr language
// over input and steps:
//
//	steps.draft.output.score > 0.8 && input.notify
//	len(steps.fetch.output.items) > 0
//	steps.check.output.result == "urgent"
//	steps.review?.output?.approved ?? false
//
// Parse compiles every expression once and checks the steps it names the
// way it checks templates (an edge's condition may also read the edge's
// source node). Besides steps.<id>.output, a condition reads
// steps.<id>.status ("completed", or "failed" for a node that continues
// past its failure) and steps.<id>.error. An edge without a condition
// always fires; a condition must
// give a boolean, and a missing value is nil, so use ?? to default one.
// JSON numbers are int when whole, float64 otherwise. Evaluation is
// deterministic: now, date and timezone are not available, and keys, values
// and toPairs return object keys in sorted order.
//
// # Bounds
//
// A workflow comes from whoever may start a run, so what its expressions
// and templates may cost is bounded (the constants are in limits.go):
//
//   - Parse refuses an expression longer than MaxExpressionBytes (4 KiB) or
//     with (), [] or {} nested deeper than MaxExpressionDepth (64), before
//     expr's recursive parser sees it; constant arguments past the
//     evaluation budget (repeat("a", 999999999), 1..5000000); a string with
//     placeholders over MaxTemplateBytes (256 KiB) or with more than
//     MaxTemplatePlaceholders (1000); a JSON value holding templates nested
//     deeper than MaxTemplateDepth (64); loop bodies and subagent workflows
//     nested deeper than MaxWorkflowNesting (8).
//   - One evaluation may create MaxEvalItems (1,000,000) array, map or range
//     items and allocate MaxEvalBytes (16 MiB) in builtins: repeat, join,
//     replace, toJSON, string, concat, flatten, split, upper, string +, and
//     the others that allocate refuse a call that would go past it before
//     making it. It may spend MaxEvalOps (200,000) operations, one per
//     predicate iteration and len(text)×(pattern program size)/64 per
//     match (at most a quarter of the budget, ~50 ms, for one match, which
//     cannot be interrupted), and EvalTimeout (500 ms); EvalContext and EdgeFiresContext
//     also stop when their context ends. Evaluation runs on the caller's
//     goroutine, so a stopped evaluation leaves nothing running.
//   - A condition node's result is at most MaxResultBytes (1 MiB) as JSON,
//     and RenderString and RenderJSON produce at most MaxRenderBytes (1 MiB).
//
// Going past an evaluation or rendering bound gives an error matching
// ErrEvalLimit:
//
//	edge start→a: condition "any(1..999990, {# < 0})": evaluation limit exceeded: more than 200000 operations at column 16
//	workflow "w": edge start→a: condition: expression is 900104 bytes, longer than the 4096 allowed
//
// # Errors
//
// Parse reports every problem it finds in one *ValidationError, which
// matches ErrInvalid. Each Problem names the node (by id) or the edge (by
// index, shown as from→to), the field, and what is wrong:
//
//	workflow "summarise": node "draft": data.model: missing required field (an ai-step needs provider, model, and prompt or messages)
//	workflow "x": node "y": unknown type "z" (want one of trigger, ai-step, tool, connector, condition)
//	workflow "x": edge draft→review: condition: unknown name inptu at column 1 (an expression can use input and steps)
//	workflow: invalid JSON at line 4 column 16: invalid character '"' after object key:value pair
//
// Invariant: Parse returns a Workflow only for a document that passes both
// the schema and the graph checks, and a parsed Workflow is immutable and
// safe for concurrent use. Raw returns
// the document as given (compacted) and Hash its sha256: run_created stores
// both, so a run keeps the exact workflow it started with.
package workflow
