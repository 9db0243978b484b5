package workflow

import (
	"encoding/json"
	"time"
)

// Node types.
const (
	TypeTrigger   = "trigger"
	TypeAIStep    = "ai-step"
	TypeAgent     = "agent"
	TypeTool      = "tool"
	TypeConnector = "connector"
	TypeSubagent  = "subagent"
	TypeApproval  = "approval"
	TypeLoop      = "loop"
	TypeCondition = "condition"
	TypeProcess   = "process"
	TypeWait      = "wait"
)

// Workflow is a parsed, validated workflow graph. Build one with Parse; the
// zero value is not usable.
type Workflow struct {
	Name  string `json:"name"`
	Nodes []Node `json:"nodes"`
	Edges []Edge `json:"edges"`
	// Policy holds the run policy: brakes (budget, anomalies) and the
	// confidence gate switch; nil if none.
	Policy *Policy `json:"policy,omitempty"`
	// Queue is the work queue whose workers drive the workflow's runs
	// (event.ValidateQueue); empty: event.DefaultQueue.
	Queue string `json:"queue,omitempty"`

	// derived by Parse
	byID     map[string]int
	incoming map[string][]int // node id → indexes into Edges
	outgoing map[string][]int
	order    []string // topological order, ties broken by declaration order
	raw      json.RawMessage
	hash     string
	exprs    *conditions          // compiled conditions, by expression
	subs     map[string]*Workflow // nested workflows by node id (loop bodies, subagents)
	depth    int                  // how deeply this workflow is nested in its document
	// The graph by node index, for walks that look up no names: the
	// order's indexes, and each node's incoming edges with their
	// sources' indexes (parallel slices).
	orderIdx []int
	inAt     [][]Edge
	inFrom   [][]int
}

// Node is one node of the graph. Data holds the type's settings, decoded by
// the typed accessors (AIStep, Tool, Connector, …).
type Node struct {
	ID   string          `json:"id"`
	Type string          `json:"type"`
	Data json.RawMessage `json:"data,omitempty"`
	// OnFailure is what the node's failed step does to the run:
	// OnFailureFail ("fail", the default when empty) or OnFailureContinue.
	OnFailure string `json:"onFailure,omitempty"`
}

// Edge connects two nodes. Condition, when set, is an expression over the
// run (input, steps) that must be true for the edge to fire.
type Edge struct {
	From      string `json:"from"`
	To        string `json:"to"`
	Condition string `json:"condition,omitempty"`
}

// Policy is a workflow's policy: the run's budget and anomaly rules, the
// confidence gate switch and how many steps may be in flight at once.
type Policy struct {
	Budget    *Budget                `json:"budget,omitempty"`
	Anomalies map[string]AnomalyRule `json:"anomalies,omitempty"`
	// ConfidenceGate is "on" (the default) or "off": with "off" no gated
	// step is scored, and each journals confidence_gate_bypassed instead.
	ConfidenceGate string `json:"confidenceGate,omitempty"`
	// Concurrency is how many steps of a run may be in flight at once
	// (1 to MaxConcurrency; 0: DefaultConcurrency), capped by the
	// worker's PAL_RUN_CONCURRENCY.
	Concurrency int `json:"concurrency,omitempty"`
}

// Budget is policy.budget (and a start request's budget): limits on what
// one run spends. A zero limit is no limit.
type Budget struct {
	MaxCostUSD    float64 `json:"maxCostUsd,omitempty"`
	MaxTokens     int64   `json:"maxTokens,omitempty"`
	MaxSteps      int64   `json:"maxSteps,omitempty"`
	MaxDurationMs int64   `json:"maxDurationMs,omitempty"`
	WarnAt        float64 `json:"warnAt,omitempty"`
	OnExceed      string  `json:"onExceed,omitempty"`
}

// AnomalyRule is policy.anomalies.<type>.
type AnomalyRule struct {
	Threshold float64 `json:"threshold,omitempty"`
	PerStep   float64 `json:"perStep,omitempty"`
	Requests  float64 `json:"requests,omitempty"`
	Floor     float64 `json:"floor,omitempty"`
	Action    string  `json:"action,omitempty"`
}

// RetryPolicy is node.data.retry. MaxAttempts counts the first try.
type RetryPolicy struct {
	MaxAttempts      int      `json:"maxAttempts,omitempty"`
	BackoffMs        int      `json:"backoffMs,omitempty"`
	RetryableClasses []string `json:"retryableClasses,omitempty"`
}

// Attempts returns the effective number of attempts (at least 1).
func (p *RetryPolicy) Attempts() int {
	if p == nil || p.MaxAttempts < 1 {
		return 1
	}
	return p.MaxAttempts
}

// Retries reports whether an error of class may be retried under p.
func (p *RetryPolicy) Retries(class string) bool {
	if p == nil {
		return false
	}
	for _, c := range p.RetryableClasses {
		if c == "any" || c == class {
			return true
		}
	}
	return false
}

// Backoff returns the base delay between attempts.
func (p *RetryPolicy) Backoff() time.Duration {
	if p == nil || p.BackoffMs <= 0 {
		return 0
	}
	return time.Duration(p.BackoffMs) * time.Millisecond
}

// Message is one chat message of an ai-step; Content is a template. A user
// message may carry images.
type Message struct {
	Role    string      `json:"role"`
	Content string      `json:"content"`
	Images  []ImagePart `json:"images,omitempty"`
}

// AIStepData is the data of an ai-step node: one LLM call. Prompt, System
// and message contents are templates.
type AIStepData struct {
	// Thread continues the run's thread (docs/architecture.md §7.3);
	// ThreadWindow, when set, sends only its last N turns.
	Thread       bool `json:"thread,omitempty"`
	ThreadWindow int  `json:"threadWindow,omitempty"`
	// Provider is required with one Model, absent with a fallback list.
	Provider    string       `json:"provider,omitempty"`
	Model       Model        `json:"model"`
	Prompt      string       `json:"prompt,omitempty"`
	System      string       `json:"system,omitempty"`
	Messages    []Message    `json:"messages,omitempty"`
	MaxTokens   int          `json:"maxTokens,omitempty"`
	Temperature *float64     `json:"temperature,omitempty"`
	TimeoutMs   int          `json:"timeoutMs,omitempty"`
	Retry       *RetryPolicy `json:"retry,omitempty"`
	// Confidence gates the answer (Node.Confidence).
	Confidence *ConfidenceGate `json:"confidence,omitempty"`
	// ResponseSchema, when set, is the JSON Schema the answer must match:
	// sent to the provider natively, checked, and its parsed value is
	// steps.<id>.output.json.
	ResponseSchema json.RawMessage `json:"responseSchema,omitempty"`
	// Fake scripts pal dev's fake provider (Fake); real providers never
	// see it.
	Fake *Fake `json:"fake,omitempty"`
}

// ToolData is the data of a tool node: a Go function registered on the
// worker under Tool, or a built-in tool ("http", "echo", "sleep"), or
// (MCP set) the tool Tool of the MCP server MCP names in the worker's
// PAL_MCP_CONFIG, called with Arguments. Input and Arguments are
// templates.
type ToolData struct {
	Tool      string          `json:"tool"`
	Input     json.RawMessage `json:"input,omitempty"`
	MCP       string          `json:"mcp,omitempty"`
	Arguments json.RawMessage `json:"arguments,omitempty"`
	TimeoutMs int             `json:"timeoutMs,omitempty"`
	Retry     *RetryPolicy    `json:"retry,omitempty"`
}

// HTTPToolName is the name of the built-in HTTP tool.
const HTTPToolName = "http"

// ConnectorData is the data of a connector node: an external delivery with
// a receipt. URL, Headers and Body (webhook) and From, To, Cc, Subject,
// Text and HTML (email) are templates.
type ConnectorData struct {
	Kind      string            `json:"kind"`
	URL       string            `json:"url,omitempty"`
	Method    string            `json:"method,omitempty"`
	Headers   map[string]string `json:"headers,omitempty"`
	Body      json.RawMessage   `json:"body,omitempty"`
	From      string            `json:"from,omitempty"`
	To        string            `json:"to,omitempty"`
	Cc        string            `json:"cc,omitempty"`
	Subject   string            `json:"subject,omitempty"`
	Text      string            `json:"text,omitempty"`
	HTML      string            `json:"html,omitempty"`
	TimeoutMs int               `json:"timeoutMs,omitempty"`
	Retry     *RetryPolicy      `json:"retry,omitempty"`
}

// Connector kinds.
const (
	ConnectorWebhook = "webhook"
	ConnectorEmail   = "email"
)

// ConditionData is the data of a condition node: it evaluates Expression and
// outputs {"result": value}; outgoing edges branch on it.
type ConditionData struct {
	Expression string `json:"expression"`
}
