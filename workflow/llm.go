package workflow

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/palrun/pal/schemas"
)

// What ai-steps and agents share: the model (one, or a fallback list), the
// schema an answer must match, and the images a message may carry.

// MaxModels bounds a fallback list.
const MaxModels = 8

// Model is an ai-step's or agent's model: one model name, called with the
// node's provider (JSON: a string), or a fallback list of "provider/model"
// names tried in order (JSON: an array), each after the step's retry policy
// is spent on the one before, or at once on an outage (docs/architecture.md
// §7.6).
type Model struct {
	// Name is the one model, when the node names one.
	Name string
	// List is the fallback list, when the node names one.
	List []string
}

// ModelOf is the one model name.
func ModelOf(name string) Model { return Model{Name: name} }

// Fallbacks is a fallback list of "provider/model" names.
func Fallbacks(names ...string) Model { return Model{List: names} }

// MarshalJSON writes a string, or an array for a fallback list.
func (m Model) MarshalJSON() ([]byte, error) {
	if m.List != nil {
		return json.Marshal(m.List)
	}
	return json.Marshal(m.Name)
}

// UnmarshalJSON reads a string or an array of strings.
func (m *Model) UnmarshalJSON(b []byte) error {
	*m = Model{}
	if bytes.HasPrefix(bytes.TrimSpace(b), []byte("[")) {
		return json.Unmarshal(b, &m.List)
	}
	return json.Unmarshal(b, &m.Name)
}

// String is the model name, or the list joined by commas.
func (m Model) String() string {
	if m.List != nil {
		return strings.Join(m.List, ",")
	}
	return m.Name
}

// ModelChoice is one model a step may call: a provider and its model.
type ModelChoice struct {
	Provider string
	Model    string
}

// String is "provider/model".
func (c ModelChoice) String() string { return c.Provider + "/" + c.Model }

// Choices are the models a step of the node tries, in order: the one model
// with provider (the node's), or the fallback list's entries cut at their
// first '/'.
func (m Model) Choices(provider string) []ModelChoice {
	if m.List == nil {
		return []ModelChoice{{Provider: provider, Model: m.Name}}
	}
	out := make([]ModelChoice, 0, len(m.List))
	for _, e := range m.List {
		p, name, _ := strings.Cut(e, "/")
		out = append(out, ModelChoice{Provider: p, Model: name})
	}
	return out
}

// Choice is the i-th model of the node's list (the last one past its end).
func (m Model) Choice(provider string, i int) ModelChoice {
	cs := m.Choices(provider)
	return cs[min(max(i, 0), len(cs)-1)]
}

// ImagePart is an image a message carries: a URL (a template), or Blob (a
// template giving the hex sha256 of a PAL_BLOBS value the run holds: a
// JSON string of the image's bytes in base64) with its MediaType.
type ImagePart struct {
	URL       string `json:"url,omitempty"`
	Blob      string `json:"blob,omitempty"`
	MediaType string `json:"mediaType,omitempty"`
}

// checkLLM checks what ai-steps and agents share beyond the schema: the
// model list, the response schema and the confidence gate.
func checkLLM(n *Node, provider string, model Model, schema json.RawMessage, retry *RetryPolicy, ps *problems) {
	if model.List != nil {
		if provider != "" {
			ps.node(n.ID, "data.provider", "a model list names each model's provider (%q): leave provider out", model.List[0])
		}
		seen := map[string]bool{}
		for i, e := range model.List {
			p, name, ok := strings.Cut(e, "/")
			if !ok || p == "" || name == "" {
				ps.node(n.ID, fmt.Sprintf("data.model[%d]", i), "%q is not provider/model (e.g. openai/gpt-4.1-mini)", e)
			}
			if seen[e] {
				ps.node(n.ID, fmt.Sprintf("data.model[%d]", i), "%q is listed twice", e)
			}
			seen[e] = true
		}
	} else if provider == "" {
		ps.node(n.ID, "data.provider", "required with one model (or give model as a list of provider/model)")
	}
	if len(schema) > 0 {
		if _, err := schemas.CompileAnswer(schema); err != nil {
			ps.node(n.ID, "data.responseSchema", "%s", strings.TrimPrefix(err.Error(), schemas.ErrAnswerSchema.Error()+": "))
		}
		if g := n.Confidence(); g != nil && g.Source == ConfidenceLogprobs {
			// A structured answer's tokens say how sure the model was of
			// the JSON syntax, not of the answer.
			ps.node(n.ID, "data.confidence.source", `a responseSchema answer is scored by "field" or "judge", not "logprobs"`)
		}
	}
	var providers []string
	for _, c := range model.Choices(provider) {
		providers = append(providers, c.Provider)
	}
	checkConfidence(n, providers, retry, ps)
}

// checkImages checks a message's images: URL or blob, a blob with a media
// type, on user messages only.
func checkImages(n *Node, field string, m Message, tmpl func(field, s string), ps *problems) {
	if len(m.Images) > 0 && m.Role != "user" {
		ps.node(n.ID, field+".images", "only user messages carry images")
	}
	for i, img := range m.Images {
		f := fmt.Sprintf("%s.images[%d]", field, i)
		switch {
		case (img.URL == "") == (img.Blob == ""):
			ps.node(n.ID, f, "give url or blob (and not both)")
		case img.Blob != "" && img.MediaType == "":
			ps.node(n.ID, f+".mediaType", "required with blob (one of image/png, image/jpeg, image/gif, image/webp)")
		}
		tmpl(f+".url", img.URL)
		tmpl(f+".blob", img.Blob)
	}
}

// checkThread checks an ai-step's or agent's thread fields: a window is
// a thread step's (docs/architecture.md §7.3).
func checkThread(n *Node, thread bool, window int, ps *problems) {
	if window != 0 && !thread {
		ps.node(n.ID, "data.threadWindow", "applies to a thread step: set thread: true, or leave threadWindow out")
	}
}

// ThreadOf reports whether node n continues the run's thread (an ai-step
// or agent with thread: true), and the window of turns it sends (0: all).
func ThreadOf(n *Node) (thread bool, window int) {
	switch n.Type {
	case TypeAIStep:
		if d, err := n.AIStep(); err == nil {
			return d.Thread, d.ThreadWindow
		}
	case TypeAgent:
		if d, err := n.Agent(); err == nil {
			return d.Thread, d.ThreadWindow
		}
	}
	return false, 0
}
