package engine

import (
	"encoding/json"

	"github.com/palrun/pal/connector"
	"github.com/palrun/pal/provider"
	"github.com/palrun/pal/workflow"
)

// The step inputs and outputs that cross between the engine and the
// worker. The engine encodes a step's input (StepPlan.Input, journaled in
// step_started) and the worker decodes it; the worker encodes an
// executor's output (journaled in step_completed) and the engine decodes
// it when it replays. Both sides use these types, so the journal's shapes
// are written down once. Changing a JSON tag changes the journal: saved
// journals must still decode (engine/testdata).
// event.ApprovalOutput, the output of an approval step, belongs to the
// same contract.

// AIInput is the rendered input of an ai-step or an agent turn.
type AIInput struct {
	Provider string             `json:"provider"`
	Model    string             `json:"model"`
	System   string             `json:"system,omitempty"`
	Messages []provider.Message `json:"messages"`
	// Prior, on an agent turn after the first, counts the conversation's
	// messages before Messages: they are rebuilt from the journal (the
	// prompt, and the earlier turns' answers and tool results), so each
	// turn journals only its new messages (StepPlan.Request is the whole).
	Prior int             `json:"prior,omitempty"`
	Tools []provider.Tool `json:"tools,omitempty"`
	// MCP, on an agent's first turn, are the MCP servers whose tools the
	// turn offers besides Tools: the worker lists them when it sends the
	// turn, and journals what it offered in the turn's output
	// (LLMOutput.MCPTools), which the later turns offer.
	MCP []workflow.MCPSource `json:"mcp,omitempty"`
	// MaxTokens is the output cap the call sends: the node's maxTokens,
	// else what the run's budget leaves room for, else
	// DefaultOutputTokens (a step journaled before every call sent a cap
	// may have none: the worker sends DefaultOutputTokens).
	MaxTokens   int      `json:"maxTokens,omitempty"`
	Temperature *float64 `json:"temperature,omitempty"`
	// ResponseSchema is the JSON Schema the answer must match (the node's
	// responseSchema).
	ResponseSchema json.RawMessage `json:"responseSchema,omitempty"`
}

// ConnectorInput is the rendered input of a connector step: URL, Method,
// Headers and Body for a webhook, Email for an email.
type ConnectorInput struct {
	Kind    string            `json:"kind"`
	URL     string            `json:"url,omitempty"`
	Method  string            `json:"method,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
	Body    json.RawMessage   `json:"body,omitempty"`
	Email   *connector.Email  `json:"email,omitempty"`
}

// ToolInput is the input of a tool step: a tool node's, or a tool call of
// an agent (which carries the model's call id).
type ToolInput struct {
	Tool       string          `json:"tool"`
	Input      json.RawMessage `json:"input"`
	ToolCallID string          `json:"tool_call_id,omitempty"`
	// MCP names the MCP server (PAL_MCP_CONFIG) whose tool Tool is, called
	// with Input as its arguments; empty for a tool of the worker.
	MCP string `json:"mcp,omitempty"`
}

// ProcessInput is the input of a process step: the rendered command,
// environment and stdin (a process node's data, templates rendered; each
// element of Command one argument).
type ProcessInput struct {
	Command []string          `json:"command"`
	Env     map[string]string `json:"env,omitempty"`
	Workdir string            `json:"workdir,omitempty"`
	Stdin   json.RawMessage   `json:"stdin"`
	// Limits are the node's limits, journaled with the step.
	Limits *workflow.ProcessLimits `json:"limits,omitempty"`
	// Network is the node's network (workflow.NetworkEgress, or empty for
	// none).
	Network string `json:"network,omitempty"`
}

// LLMOutput is the output of an LLM step (an ai-step or an agent turn):
// the model's answer.
type LLMOutput struct {
	Text         string              `json:"text"`
	Model        string              `json:"model"`
	FinishReason string              `json:"finish_reason,omitempty"`
	ToolCalls    []provider.ToolCall `json:"tool_calls,omitempty"`
	ID           string              `json:"id,omitempty"`
	// Confidence is the answer's score under the node's confidence gate
	// (steps.<id>.output.confidence); absent when it has none.
	Confidence *float64 `json:"confidence,omitempty"`
	// JSON is the answer parsed, when the node has a responseSchema and
	// the answer matched it (steps.<id>.output.json).
	JSON json.RawMessage `json:"json,omitempty"`
	// MCPTools, on an agent's first turn, are the MCP servers' tools the
	// turn offered (AIInput.MCP): journaled once, offered by every later
	// turn, so a resumed agent sees the same tools even if a server's
	// list changed.
	MCPTools []MCPTool `json:"mcp_tools,omitempty"`
}

// MCPTool is a tool an MCP server listed, as an agent offers it to the
// model under Name.
type MCPTool struct {
	Server      string          `json:"server"`
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// ConnectorOutput is the output of a connector step: how the delivery
// ended (event.DeliveryDelivered or event.DeliveryUnconfirmed) and the
// receiver's HTTP status when it answered.
type ConnectorOutput struct {
	Delivery string `json:"delivery"`
	Status   int    `json:"status,omitempty"`
}

// ApprovalInput is the input of an approval step: the rendered prompt and
// who may decide.
type ApprovalInput struct {
	Prompt    string   `json:"prompt,omitempty"`
	Approvers []string `json:"approvers,omitempty"`
}

// WaitInput is the input of a wait step: the signal it waits for.
type WaitInput struct {
	Signal string `json:"signal"`
}

// SubagentInput is the input of a subagent step: the child run's input.
type SubagentInput struct {
	Input json.RawMessage `json:"input"`
	// Workflow names the deployed workflow an agent's workflow tool
	// starts (its latest version when the child is created); empty for a
	// subagent node, whose child workflow is the node's.
	Workflow string `json:"workflow,omitempty"`
}

// ConditionInput is the input of a condition step.
type ConditionInput struct {
	Expression string `json:"expression"`
}

// ConditionOutput is the output of a condition step: what its
// expression gave.
type ConditionOutput struct {
	Result any `json:"result"`
}

// LoopInput is the input of a loop step, journaled when it completes.
type LoopInput struct {
	Iterations int `json:"iterations"`
}

// Why a loop stopped (LoopOutput.Stopped).
const (
	LoopStoppedItems = "items"          // every item of over ran
	LoopStoppedMax   = "max_iterations" // maxIterations ran
	LoopStoppedUntil = "until"          // until became true
)

// LoopOutput is the output of a loop step: the output of each iteration
// (that of its last completed step).
type LoopOutput struct {
	Iterations int               `json:"iterations"`
	Results    []json.RawMessage `json:"results"`
	Stopped    string            `json:"stopped"`
}

// AgentInput is the input of an agent step, journaled when it completes.
type AgentInput struct {
	Turns int `json:"turns"`
}

// AgentOutput is the output of an agent step: the final answer.
type AgentOutput struct {
	Text  string `json:"text"`
	Turns int    `json:"turns"`
	// Confidence is the final answer's score under the agent's confidence
	// gate; absent when it has none.
	Confidence *float64 `json:"confidence,omitempty"`
	// JSON is the final answer parsed, when the agent has a
	// responseSchema.
	JSON json.RawMessage `json:"json,omitempty"`
}
